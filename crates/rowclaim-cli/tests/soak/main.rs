//! The soak (issue 25, item 7): for ROWCLAIM_SOAK_SECS (default 180; `scripts/soak` runs it
//! for an hour) a steady stream of jobs into the managed queue, worked by `rowclaim work`
//! processes and library `Worker` processes, on private PostgreSQL and MariaDB servers at once
//! (one test each, run side by side), with a fault drawn at random every interval: a server
//! crash and restart, connections cut, a black hole, a worker SIGKILLed (and replaced) or
//! SIGSTOPped past its lease, and on PostgreSQL a PgBouncer restart and a standby promotion.
//!
//! Then it checks invariants, never timings: every job enqueued is done and none lost, a job ran
//! again only where a fault overlapped its earlier run, no worker exited by itself, each worker's
//! RSS at the end within 20 % of its RSS after warm-up, server sessions flat. It writes a summary,
//! a CSV of throughput per minute and an SVG plot of it to ROWCLAIM_SOAK_DIR (default
//! target/tmp/soak/).
//!
//! Knobs (environment): ROWCLAIM_SOAK_SECS, ROWCLAIM_SOAK_DIR, ROWCLAIM_SOAK_FAULT_EVERY (seconds
//! between faults; default a sixth of the run, at most 60), ROWCLAIM_SOAK_RATE (jobs per minute
//! per backend, default 240), ROWCLAIM_SOAK_SEED, ROWCLAIM_SOAK_LEASE (seconds, default 10),
//! ROWCLAIM_SOAK_FAULTS (the kinds to draw from,
//! comma-separated: restart, cut, black-hole, kill, stop, pgbouncer, promote; default all).

#[path = "../support/mod.rs"]
mod support;

mod plot;
mod report;
mod rig;
mod workers;

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use report::{Fault, Soak, WorkerFigures};
use rig::{FaultKind, Rig};
use support::now_us;
use workers::{Kind, Proc};

/// Leases of the soak's workers (ROWCLAIM_SOAK_LEASE seconds, default 10): a black hole (3–6 s)
/// is shorter, a SIGSTOP longer.
fn lease() -> Duration {
    Duration::from_secs(env_u64("ROWCLAIM_SOAK_LEASE").unwrap_or(10).max(1))
}

/// Not a test: the library worker process the soak starts (this binary run again with
/// SOAK_URL set). Without it, it does nothing.
#[test]
fn worker_process() {
    if let Ok(url) = std::env::var("SOAK_URL") {
        workers::library_worker(url);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn soak_postgres() {
    soak(Rig::postgres().await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn soak_mariadb() {
    soak(Rig::mariadb().await).await;
}

struct Config {
    secs: u64,
    fault_every: Duration,
    rate: u64,
    seed: u64,
    warm_up: Duration,
    dir: PathBuf,
    /// The fault kinds to draw from (ROWCLAIM_SOAK_FAULTS); empty: all.
    only: Vec<FaultKind>,
}

fn env_u64(name: &str) -> Option<u64> {
    std::env::var(name).ok().and_then(|s| s.trim().parse().ok())
}

impl Config {
    fn from_env() -> Config {
        let secs = env_u64("ROWCLAIM_SOAK_SECS").unwrap_or(180).max(30);
        let fault_every =
            Duration::from_secs(env_u64("ROWCLAIM_SOAK_FAULT_EVERY").unwrap_or((secs / 6).min(60)));
        let dir = std::env::var_os("ROWCLAIM_SOAK_DIR")
            .map(PathBuf::from)
            .unwrap_or_else(|| PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("soak"));
        Config {
            secs,
            fault_every,
            rate: env_u64("ROWCLAIM_SOAK_RATE").unwrap_or(240).max(1),
            seed: env_u64("ROWCLAIM_SOAK_SEED").unwrap_or_else(now_us),
            // Long enough for the allocator and the pools to settle; a quarter of a short run.
            warm_up: Duration::from_secs((secs / 4).min(60)),
            dir,
            only: std::env::var("ROWCLAIM_SOAK_FAULTS")
                .unwrap_or_default()
                .split(',')
                .filter(|s| !s.trim().is_empty())
                .map(|s| {
                    FaultKind::from_name(s.trim())
                        .unwrap_or_else(|| panic!("ROWCLAIM_SOAK_FAULTS: no fault {s:?}"))
                })
                .collect(),
        }
    }
}

/// xorshift64*: enough randomness for drawing faults, and repeatable from the seed.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    /// From the high half: the low bits of xorshift64* are its weakest.
    fn below(&mut self, n: u64) -> u64 {
        (self.next() >> 32) % n.max(1)
    }
}

/// The enqueuer: every second a batch of jobs (rate/60 a second) with unique keys `seq-N`, sent
/// again with the same keys until it is confirmed, so that none is enqueued twice while pending.
struct Enqueued {
    confirmed: u64,
    unconfirmed_batches: u64,
    times: Vec<(u64, u64)>,
}

async fn enqueue_stream(url: String, rate: u64, stop: Arc<AtomicBool>) -> Enqueued {
    let db = loop {
        match rowclaim::Db::connect(&url).await {
            Ok(db) => break db,
            Err(_) => tokio::time::sleep(Duration::from_secs(1)).await,
        }
    };
    let queue = db.queue();
    let mut out = Enqueued {
        confirmed: 0,
        unconfirmed_batches: 0,
        times: Vec::new(),
    };
    let per_tick = rate.div_ceil(60);
    let tick = Duration::from_secs_f64(per_tick as f64 * 60.0 / rate as f64);
    let mut next = Instant::now();
    while !stop.load(Ordering::Relaxed) {
        let batch: Vec<rowclaim::NewJob> = (out.confirmed..out.confirmed + per_tick)
            .map(|n| {
                rowclaim::NewJob::new(serde_json::json!({ "seq": n }))
                    .queue(workers::QUEUE)
                    .unique_key(format!("seq-{n}"))
            })
            .collect();
        loop {
            match tokio::time::timeout(Duration::from_secs(30), queue.enqueue_all(&batch)).await {
                Ok(Ok(_)) => break,
                _ => {
                    out.unconfirmed_batches += 1;
                    tokio::time::sleep(Duration::from_millis(500)).await;
                }
            }
        }
        out.confirmed += per_tick;
        out.times.push((now_us(), per_tick));
        next += tick;
        tokio::time::sleep_until(next.into()).await;
    }
    out
}

/// The live workers, shared between the main loop and a fault.
struct Crew {
    procs: Vec<Proc>,
    log: PathBuf,
    dir: PathBuf,
    spawned: usize,
}

impl Crew {
    fn start(&mut self, kind: Kind, url: &str) {
        self.spawned += 1;
        let name = format!(
            "{}-{}",
            match kind {
                Kind::Cli => "cli",
                Kind::Library => "lib",
            },
            self.spawned
        );
        let p = workers::spawn(kind, &name, url, &self.log, &self.dir, lease());
        self.procs.push(p);
    }

    fn live(&self) -> Vec<usize> {
        (0..self.procs.len())
            .filter(|&i| !self.procs[i].killed && self.procs[i].exited.is_none())
            .collect()
    }
}

async fn soak(mut rig: Rig) {
    let cfg = Config::from_env();
    let name = rig.name();
    let dir = cfg.dir.join(name);
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("create {}: {e}", dir.display()));
    eprintln!(
        "soak {name}: {} s, a fault every ~{} s, {} jobs/min, seed {}, output in {}",
        cfg.secs,
        cfg.fault_every.as_secs(),
        cfg.rate,
        cfg.seed,
        dir.display()
    );
    let url = rig.url();
    eprintln!("soak {name}: {}", rig.servers());
    {
        let db = rowclaim::Db::connect(&url).await.expect("connect for init");
        db.queue().init().await.expect("rowclaim init");
    }
    let log = dir.join("runs.log");
    let mut crew = Crew {
        procs: Vec::new(),
        log: log.clone(),
        dir: dir.clone(),
        spawned: 0,
    };
    crew.start(Kind::Library, &url);
    crew.start(Kind::Cli, &url);
    match rig.bouncer_url() {
        Some(b) => crew.start(Kind::Cli, &b),
        None => crew.start(Kind::Cli, &url),
    }

    let started = Instant::now();
    let t0 = now_us();
    let stop = Arc::new(AtomicBool::new(false));
    let enqueuer = tokio::spawn(enqueue_stream(url.clone(), cfg.rate, stop.clone()));

    let mut rng = Rng(cfg.seed | 1);
    let mut deck: Vec<FaultKind> = Vec::new();
    let faults: Arc<Mutex<Vec<Fault>>> = Arc::default();
    let mut connections: Vec<(u64, i64)> = Vec::new();
    let mut baseline_sample = None;
    let sample_every = Duration::from_secs((cfg.secs / 12).clamp(10, 60));
    let mut next_sample = started + cfg.warm_up;
    let mut next_rss = started;
    // The first fault comes after warm-up (and the connections baseline taken then).
    let mut next_fault = started + cfg.warm_up + Duration::from_secs(5);
    let end = started + Duration::from_secs(cfg.secs);

    while Instant::now() < end {
        let now = Instant::now();
        let at = now.duration_since(started).as_secs_f64();
        for p in &mut crew.procs {
            p.check_alive();
        }
        if now >= next_rss {
            for p in &mut crew.procs {
                p.sample_rss(at);
            }
            next_rss = now + Duration::from_secs(5);
        }
        if now >= next_sample {
            connections.push((now_us(), rig.connections().await));
            baseline_sample.get_or_insert(connections.len() - 1);
            next_sample = now + sample_every;
        }
        if now >= next_fault && now + Duration::from_secs(5) < end {
            // A shuffled deck of the kinds: random order, every kind before any repeats.
            let kinds: Vec<FaultKind> = rig
                .kinds()
                .into_iter()
                .filter(|k| cfg.only.is_empty() || cfg.only.contains(k))
                .collect();
            if kinds.is_empty() {
                next_fault = end;
                continue;
            }
            deck.retain(|k| kinds.contains(k));
            if deck.is_empty() {
                deck = kinds;
            }
            let kind = deck.remove(rng.below(deck.len() as u64) as usize);
            let fault = do_fault(&mut rig, &mut crew, kind, &mut rng).await;
            eprintln!("soak {name}: {}", fault.describe(t0));
            faults.lock().unwrap().push(fault);
            let every = cfg.fault_every.as_secs_f64();
            let jitter = every * (0.75 + 0.5 * (rng.below(1000) as f64 / 1000.0));
            next_fault = Instant::now() + Duration::from_secs_f64(jitter);
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }

    // The stream stops; the workers drain the queue (bounded: a lease and a few minutes).
    stop.store(true, Ordering::Relaxed);
    let enq = enqueuer.await.expect("the enqueuer");
    let drain_deadline = Instant::now() + Duration::from_secs(300);
    let mut unfinished;
    loop {
        let jobs = rig.jobs().await;
        unfinished = jobs.iter().filter(|j| j.1 != "completed").count() as i64;
        for p in &mut crew.procs {
            p.check_alive();
        }
        if unfinished == 0 || Instant::now() > drain_deadline {
            break;
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    // Settled: a last RSS and connections sample, then the workers are asked to stop.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let at = started.elapsed().as_secs_f64();
    for p in &mut crew.procs {
        p.check_alive();
        p.sample_rss(at);
    }
    connections.push((now_us(), rig.connections().await));
    let codes = workers::stop_all(&mut crew.procs).await;

    let jobs = rig.jobs().await;
    let runs = report::read_runs(&log);
    let workers: Vec<WorkerFigures> = crew
        .procs
        .iter()
        .map(|p| WorkerFigures {
            name: p.name.clone(),
            kind: match p.kind {
                Kind::Cli if p.url.contains("pgbouncer=true") => "rowclaim work (PgBouncer)".into(),
                Kind::Cli => "rowclaim work".into(),
                Kind::Library => "library Worker".into(),
            },
            killed: p.killed,
            exited: p.exited.clone(),
            rss: p.rss_span(started, cfg.warm_up),
            exit_code: codes.iter().find(|c| c.0 == p.name).map(|c| c.1),
        })
        .collect();
    let soak = Soak {
        backend: match rig {
            Rig::Postgres(_) => "PostgreSQL".into(),
            Rig::Mariadb(_) => "MariaDB".into(),
        },
        seed: cfg.seed,
        secs: cfg.secs,
        lease: lease(),
        t0,
        warm_up: cfg.warm_up,
        faults: faults.lock().unwrap().clone(),
        runs,
        jobs,
        enqueued: enq.confirmed,
        unconfirmed_batches: enq.unconfirmed_batches,
        enqueue_times: enq.times,
        connections,
        baseline_sample: baseline_sample.unwrap_or(0),
        workers,
        unfinished_at_end: unfinished,
    };
    let verdict = soak.check();
    write(&dir.join("summary.md"), &verdict.summary);
    write(&dir.join("throughput.csv"), &soak.csv());
    write(&dir.join("throughput.svg"), &soak.svg());
    eprintln!("{}", verdict.summary);
    assert!(
        verdict.failures.is_empty(),
        "soak {name} failed (output in {}):\n- {}",
        dir.display(),
        verdict.failures.join("\n- ")
    );
}

fn write(path: &Path, text: &str) {
    std::fs::write(path, text).unwrap_or_else(|e| panic!("write {}: {e}", path.display()));
}

/// Does one fault of `kind`; the fault's window is from its first act to the end of its last.
async fn do_fault(rig: &mut Rig, crew: &mut Crew, kind: FaultKind, rng: &mut Rng) -> Fault {
    let start = now_us();
    let mut worker = None;
    let detail = match kind {
        FaultKind::KillWorker | FaultKind::StopWorker => {
            // ROWCLAIM_SOAK_VICTIM=cli|lib: only workers of that kind (to reproduce a finding).
            let only = std::env::var("ROWCLAIM_SOAK_VICTIM").unwrap_or_default();
            let mut live = crew.live();
            let of_kind: Vec<usize> = live
                .iter()
                .copied()
                .filter(|&i| match only.as_str() {
                    "cli" => crew.procs[i].kind == Kind::Cli,
                    "lib" => crew.procs[i].kind == Kind::Library,
                    _ => true,
                })
                .collect();
            if !of_kind.is_empty() {
                live = of_kind;
            }
            let i = live[rng.below(live.len() as u64) as usize];
            let (name, kind_of, url) = {
                let p = &crew.procs[i];
                (p.name.clone(), p.kind, p.url.clone())
            };
            worker = Some(name);
            if kind == FaultKind::KillWorker {
                let p = &mut crew.procs[i];
                p.killed = true;
                p.signal("KILL");
                let _ = p.child.wait().await;
                crew.start(kind_of, &url);
                format!("replaced by {}", crew.procs.last().unwrap().name)
            } else {
                let p = &crew.procs[i];
                p.signal("STOP");
                // Past its lease: its rows are taken over meanwhile.
                let pause = lease() + Duration::from_secs(5);
                tokio::time::sleep(pause).await;
                p.signal("CONT");
                format!("{} s", pause.as_secs())
            }
        }
        _ => {
            let black_hole = Duration::from_secs(3 + rng.below(4));
            rig.fault(kind, black_hole).await
        }
    };
    Fault {
        kind,
        start,
        end: now_us(),
        worker,
        detail,
    }
}
