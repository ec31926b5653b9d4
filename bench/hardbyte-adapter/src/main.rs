//! rowclaim's adapter for hardbyte/postgresql-job-queue-benchmarking: one long-running process
//! that enqueues jobs at the offered rate with `Queue::enqueue_many` and runs them with the
//! library's `Worker` on the managed queue, printing the harness's JSONL samples on stdout
//! (logs on stderr). The contract: the harness's CONTRIBUTING_ADAPTERS.md; how to run it:
//! README.md beside this crate.

mod config;
mod producer;
mod window;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use rowclaim::{ConnectOptions, Db, Job, JobFilter, Queue, Retention, Worker};
use serde_json::{json, Value};
use tokio::sync::watch;

use config::Config;
use producer::Offer;
use window::{epoch_s, LatencyWindow};

/// The queue and job kind the adapter uses.
pub const QUEUE: &str = "bench";
pub const KIND: &str = "bench";

/// What the producer, the handlers and the depth poller count, for the sampler.
pub struct Counters {
    pub enqueued: AtomicU64,
    pub completed: AtomicU64,
    pub producer_errors: AtomicU64,
    pub depth: AtomicU64,
    pub running: AtomicU64,
    pub pickup: LatencyWindow,
    pub producer_call: LatencyWindow,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_ansi(false)
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("RUST_LOG")
                .unwrap_or_else(|_| "rowclaim=info,warn".into()),
        )
        .init();
    let cfg = Arc::new(Config::from_env()?);
    let counters = Arc::new(Counters {
        enqueued: AtomicU64::new(0),
        completed: AtomicU64::new(0),
        producer_errors: AtomicU64::new(0),
        depth: AtomicU64::new(0),
        running: AtomicU64::new(0),
        pickup: LatencyWindow::new(30)?,
        producer_call: LatencyWindow::new(30)?,
    });
    let (stop_tx, stop) = watch::channel(false);

    // The worker's pool: claims, lease renewals, settles; the producer and the depth poller
    // have their own, so that a burst of inserts does not queue behind settles.
    let worker_db = connect(&cfg.database_url, 8 + cfg.workers as u32 / 16).await;
    // One connection per batch in flight, and one for the depth poller.
    let producer_db = connect(&cfg.database_url, cfg.inflight as u32 + 1).await;
    init_queue(&worker_db.queue()).await;
    descriptor(&cfg);

    let offer = Arc::new(Offer::default());
    producer::read_tokens(cfg.clone(), offer.clone());
    if !cfg.harness_paced() && !cfg.depth_target() {
        tokio::spawn(producer::tick_locally(
            cfg.clone(),
            offer.clone(),
            stop.clone(),
        ));
    }
    let producer = tokio::spawn(producer::run(
        producer_db.queue(),
        cfg.clone(),
        offer,
        counters.clone(),
        stop.clone(),
    ));
    // Depth is sampled by replica 0 only (as the awa adapter does), but a depth-target
    // producer steers by it on every replica.
    if cfg.instance == 0 || cfg.depth_target() {
        // A depth-target producer refills what was taken since the last look: looking once a
        // second would cap it at TARGET_DEPTH jobs a second.
        let every = Duration::from_millis(if cfg.depth_target() { 100 } else { 1000 });
        tokio::spawn(poll_depth(
            producer_db.queue(),
            every,
            counters.clone(),
            stop.clone(),
        ));
    }
    let sampler = tokio::spawn(sample(cfg.clone(), counters.clone(), stop.clone()));
    let worker = tokio::spawn(work(worker_db, cfg.clone(), counters.clone(), stop.clone()));

    terminated().await;
    eprintln!("[rowclaim-adapter] stopping");
    let _ = stop_tx.send(true);
    // The harness wants an exit within 5 s of SIGTERM: the worker drains for 2 s at most.
    let _ = tokio::time::timeout(Duration::from_secs(4), async {
        let _ = producer.await;
        let _ = worker.await;
        let _ = sampler.await;
    })
    .await;
    Ok(())
}

/// Connects, waiting for the database however long it is away (a replica restarted while
/// PostgreSQL is down starts all the same).
async fn connect(url: &str, connections: u32) -> Db {
    let mut pause = Duration::from_millis(200);
    loop {
        let opts = ConnectOptions::default().max_connections(connections);
        match Db::connect_with(url, opts).await {
            Ok(db) => return db,
            Err(e) => {
                eprintln!("[rowclaim-adapter] cannot connect yet ({e}); again in {pause:?}");
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(Duration::from_secs(2));
            }
        }
    }
}

async fn init_queue(queue: &Queue) {
    while let Err(e) = queue.init().await {
        eprintln!("[rowclaim-adapter] queue init failed ({e}); again in 1s");
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

/// The library's Worker on the managed queue, WORKER_COUNT jobs at once. `run` returns an
/// error only when it cannot start (the database away at that moment): then start it again.
async fn work(db: Db, cfg: Arc<Config>, counters: Arc<Counters>, stop: watch::Receiver<bool>) {
    while !*stop.borrow() {
        let c = counters.clone();
        let work_time = cfg.work;
        let retention = if cfg.keep_completed {
            Retention::Keep
        } else {
            Retention::Delete
        };
        let mut until = stop.clone();
        let run = Worker::new(&db)
            .queue(QUEUE)
            .handle(KIND, move |job: Job| run_job(job, work_time, c.clone()))
            .concurrency(cfg.workers)
            .retention(retention)
            .grace(Duration::from_secs(2))
            .run(async move {
                let _ = until.wait_for(|s| *s).await;
            });
        match run.await {
            Ok(report) => eprintln!("[rowclaim-adapter] worker stopped: {report:?}"),
            Err(e) => {
                eprintln!("[rowclaim-adapter] worker could not run ({e}); again in 1s");
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
        }
    }
}

/// One job: its pickup latency (enqueue to start of work), then JOB_WORK_MS of work.
async fn run_job(job: Job, work: Duration, counters: Arc<Counters>) -> Result<(), String> {
    if let Some(at) = job.payload["produced_at_ms"].as_i64() {
        counters
            .pickup
            .record((window::epoch_ms() - at).max(0) as f64);
    }
    if !work.is_zero() {
        tokio::time::sleep(work).await;
    }
    counters.completed.fetch_add(1, Ordering::Relaxed);
    Ok(())
}

/// Jobs ready and running in the bench queue, every `every`.
async fn poll_depth(
    queue: Queue,
    every: Duration,
    counters: Arc<Counters>,
    stop: watch::Receiver<bool>,
) {
    let ready = JobFilter::new().queues([QUEUE]).status("ready");
    let running = JobFilter::new().queues([QUEUE]).status("running");
    while !*stop.borrow() {
        if let Ok(n) = queue.count(&ready, None).await {
            counters.depth.store(n, Ordering::Relaxed);
        }
        if let Ok(n) = queue.count(&running, None).await {
            counters.running.store(n, Ordering::Relaxed);
        }
        tokio::time::sleep(every).await;
    }
}

/// Emits the samples every SAMPLE_EVERY_S, the first on the next wall-clock boundary.
async fn sample(cfg: Arc<Config>, counters: Arc<Counters>, mut stop: watch::Receiver<bool>) {
    let every = cfg.sample_every_s;
    let now = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap_or_default();
    let first = Duration::from_secs((now.as_secs() / every + 1) * every).saturating_sub(now);
    let mut ticker = tokio::time::interval_at(
        tokio::time::Instant::now() + first,
        Duration::from_secs(every),
    );
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let (mut last_enq, mut last_done, mut last_at) = (0u64, 0u64, Instant::now());
    loop {
        tokio::select! {
            _ = ticker.tick() => {}
            _ = stop.changed() => return,
        }
        let dt = last_at.elapsed().as_secs_f64().max(0.001);
        last_at = Instant::now();
        let enq = counters.enqueued.load(Ordering::Relaxed);
        let done = counters.completed.load(Ordering::Relaxed);
        let mut out = Samples::new(&cfg);
        out.add("enqueue_rate", (enq - last_enq) as f64 / dt, every as f64);
        out.add(
            "completion_rate",
            (done - last_done) as f64 / dt,
            every as f64,
        );
        (last_enq, last_done) = (enq, done);
        if let Some([p50, p95, p99]) = counters.pickup.percentiles() {
            out.add("claim_p50_ms", p50, 30.0);
            out.add("claim_p95_ms", p95, 30.0);
            out.add("claim_p99_ms", p99, 30.0);
        }
        if let Some([p50, p95, p99]) = counters.producer_call.percentiles() {
            out.add("producer_call_p50_ms", p50, 30.0);
            out.add("producer_call_p95_ms", p95, 30.0);
            out.add("producer_call_p99_ms", p99, 30.0);
        }
        let errors = counters.producer_errors.load(Ordering::Relaxed);
        out.add("producer_errors_total", errors as f64, 0.0);
        if cfg.instance == 0 {
            let depth = counters.depth.load(Ordering::Relaxed) as f64;
            let running = counters.running.load(Ordering::Relaxed) as f64;
            out.add("queue_depth", depth, 0.0);
            out.add("running_depth", running, 0.0);
            out.add("total_backlog", depth + running, 0.0);
            out.add("producer_target_rate", cfg.current_rate(), 0.0);
        }
        out.print();
    }
}

/// One tick's records, printed together.
struct Samples<'a> {
    cfg: &'a Config,
    t: String,
    lines: Vec<Value>,
}

impl<'a> Samples<'a> {
    fn new(cfg: &'a Config) -> Self {
        let t = humantime::format_rfc3339_millis(SystemTime::now()).to_string();
        Samples {
            cfg,
            t,
            lines: Vec::new(),
        }
    }

    fn add(&mut self, metric: &str, value: f64, window_s: f64) {
        self.lines.push(json!({
            "t": self.t, "system": self.cfg.system, "instance_id": self.cfg.instance,
            "kind": "adapter", "subject_kind": "adapter", "subject": "",
            "metric": metric, "value": value, "window_s": window_s,
        }));
    }

    fn print(self) {
        use std::io::Write;
        let mut out = std::io::stdout().lock();
        for line in self.lines {
            let _ = writeln!(out, "{line}");
        }
        let _ = out.flush();
    }
}

fn descriptor(cfg: &Config) {
    let line = json!({
        "kind": "descriptor",
        "system": cfg.system,
        "event_tables": ["public.rowclaim_jobs"],
        "extensions": [],
        "version": env!("ROWCLAIM_ADAPTER_VERSION"),
        "schema_version": "rowclaim managed queue (Queue::init)",
        "db_name": cfg.db_name,
        "instance_id": cfg.instance,
        "started_at": humantime::format_rfc3339_millis(SystemTime::now()).to_string(),
        "started_at_epoch_s": epoch_s(),
    });
    println!("{line}");
}

/// SIGTERM or Ctrl-C.
async fn terminated() {
    let mut term = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
        Ok(s) => s,
        Err(_) => {
            let _ = tokio::signal::ctrl_c().await;
            return;
        }
    };
    tokio::select! {
        _ = term.recv() => {}
        _ = tokio::signal::ctrl_c() => {}
    }
}
