//! Schedules on every backend: three schedulers with pools of their own enqueue each tick
//! exactly once and leave no tick out; missed ticks after downtime follow each catch-up policy
//! exactly; a scheduler running another definition of a schedule enqueues nothing once a later
//! one replaced it; a worker runs its schedules and stops them when it stops; a scheduler rides
//! out killed connections (PostgreSQL).

use rowclaim_testkit as common;

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use common::{with_db, Backend, TestDb};
use rowclaim::{CatchUp, Db, JobFilter, NewJob, Schedule, Scheduler, SchedulerReport, Worker};
use serde_json::json;
use tokio::sync::watch;

/// Waits (at most 3 minutes: the suite runs on a loaded machine) until `ready` says so.
async fn wait_until<F, Fut>(what: &str, mut ready: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let deadline = tokio::time::Instant::now() + Duration::from_secs(180);
    while !ready().await {
        assert!(
            tokio::time::Instant::now() < deadline,
            "waited 3 minutes for {what}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// The tick (epoch seconds) in each job's unique key of `schedule`, in enqueue order.
async fn ticks_of(t: &TestDb, schedule: &str) -> Vec<i64> {
    let prefix = format!("schedule:{schedule}:");
    t.strings(&format!(
        "SELECT unique_key FROM rowclaim_jobs WHERE unique_key LIKE '{prefix}%' ORDER BY id"
    ))
    .await
    .into_iter()
    .map(|k| {
        k.and_then(|k| k.strip_prefix(&prefix).and_then(|s| s.parse().ok()))
            .expect("a tick in the unique key")
    })
    .collect()
}

/// Marks the ticks' pending jobs completed, as workers would. A job's unique key is unique only
/// while it is pending: with its job done, a tick fired again by a second scheduler would be a
/// second job, so only the schedules' own compare-and-set keeps each tick to one.
async fn complete_ticks(t: &TestDb) {
    t.exec(
        "UPDATE rowclaim_jobs SET status = 'completed' WHERE queue = 'ticks' AND status = 'ready'",
    )
    .await;
}

/// A stop signal for schedulers: `stop()` ends every `until()`.
struct Stop(watch::Sender<bool>);

impl Stop {
    fn new() -> Stop {
        Stop(watch::channel(false).0)
    }
    fn until(&self) -> impl Future<Output = ()> + Send + 'static {
        let mut rx = self.0.subscribe();
        async move {
            let _ = rx.wait_for(|s| *s).await;
        }
    }
    fn stop(&self) {
        self.0.send_replace(true);
    }
}

async fn init(t: &TestDb) -> Db {
    let db = t.db().await;
    db.queue().init().await.expect("init");
    db
}

fn every_second() -> Schedule {
    Schedule::every("tick", Duration::from_secs(1))
        .job(NewJob::new(json!({"from": "tick"})).queue("ticks"))
}

/// Checks that `ticks` holds each tick once and none is missing between the first and last.
fn once_each_and_contiguous(ticks: &[i64], step: i64) {
    let mut sorted = ticks.to_vec();
    sorted.sort_unstable();
    let mut seen = BTreeMap::new();
    for t in &sorted {
        *seen.entry(*t).or_insert(0) += 1;
    }
    let twice: Vec<_> = seen.iter().filter(|(_, n)| **n > 1).collect();
    assert!(twice.is_empty(), "ticks enqueued more than once: {twice:?}");
    for pair in sorted.windows(2) {
        assert_eq!(
            pair[1] - pair[0],
            step,
            "a tick is missing between {} and {}: {sorted:?}",
            pair[0],
            pair[1]
        );
    }
}

/// The proof: three schedulers, each with its own pool (as three processes would have),
/// run one every-second schedule at once: every tick is enqueued exactly once, none is left out,
/// and each tick's job runs at its tick.
async fn three_schedulers(t: Arc<TestDb>) {
    init(&t).await;
    let stop = Stop::new();
    let mut schedulers = Vec::new();
    for _ in 0..3 {
        let db = t.db().await;
        let until = stop.until();
        schedulers.push(tokio::spawn(async move {
            Scheduler::new(&db)
                .schedule(every_second())
                .run(until)
                .await
        }));
    }
    wait_until("8 ticks", || async {
        complete_ticks(&t).await;
        ticks_of(&t, "tick").await.len() >= 8
    })
    .await;
    stop.stop();
    let mut enqueued = 0;
    for s in schedulers {
        let report: SchedulerReport = s.await.unwrap().expect("scheduler");
        enqueued += report.enqueued;
    }
    let ticks = ticks_of(&t, "tick").await;
    assert_eq!(
        enqueued,
        ticks.len() as u64,
        "the reports count each job once"
    );
    once_each_and_contiguous(&ticks, 1);
    let jobs = t
        .db()
        .await
        .queue()
        .list(&JobFilter::new().queues(["ticks"]).limit(1000))
        .await
        .unwrap();
    for job in &jobs {
        let key = job.unique_key.clone().unwrap();
        let tick: u64 = key.rsplit(':').next().unwrap().parse().unwrap();
        assert_eq!(job.run_at, UNIX_EPOCH + Duration::from_secs(tick), "{key}");
        assert_eq!(
            (job.kind.as_str(), &job.payload),
            ("tick", &json!({"from": "tick"}))
        );
    }
    let status = t.db().await.queue().schedules().await.unwrap();
    assert_eq!(status.len(), 1);
    let last = *ticks.iter().max().unwrap();
    assert_eq!(
        status[0].last_tick,
        Some(UNIX_EPOCH + Duration::from_secs(last as u64))
    );
    assert_eq!(
        (status[0].expression.as_str(), status[0].zone.as_deref()),
        ("every 1s", None)
    );
}

/// The minute of the hour by the database's clock.
async fn db_minute(t: &TestDb) -> i64 {
    let sql = match t.backend {
        Backend::Postgres => "SELECT extract(minute FROM now())::int8",
        Backend::MySql => "SELECT MINUTE(UTC_TIMESTAMP())",
        Backend::Sqlite => "SELECT CAST(strftime('%M', 'now') AS INTEGER)",
    };
    t.count(sql).await
}

/// Moves every stored schedule's next tick five hours back, as five hours of downtime would.
async fn five_hours_back(t: &TestDb) {
    t.exec(match t.backend {
        Backend::Postgres => {
            "UPDATE rowclaim_schedules SET next_tick = next_tick - interval '5 hours'"
        }
        Backend::MySql => "UPDATE rowclaim_schedules SET next_tick = next_tick - INTERVAL 5 HOUR",
        Backend::Sqlite => "UPDATE rowclaim_schedules SET next_tick = next_tick - 18000000",
    })
    .await;
}

/// Missed ticks: three hourly schedules, one per policy, at a minute half an hour away from now
/// (so that every tick due after the downtime is long past the late window). Registered, then
/// "down" for five hours (their next tick moved back), then one scheduler starts: latest
/// enqueues the most recent missed tick once, all enqueues the five, none enqueues nothing; all
/// three then wait for the tick they were waiting for before.
async fn missed_ticks(t: Arc<TestDb>) {
    let db = init(&t).await;
    let minute = (db_minute(&t).await + 30) % 60;
    let cron = format!("{minute} * * * *");
    let scheduler = || {
        let mut s = Scheduler::new(&db);
        for (name, policy) in [
            ("latest", CatchUp::Latest),
            ("all", CatchUp::All),
            ("none", CatchUp::None),
        ] {
            s = s.schedule(
                Schedule::cron(name, &cron)
                    .job(NewJob::new(json!({})).queue("catchup"))
                    .catch_up(policy),
            );
        }
        s
    };
    // A ready shutdown: it registers, and stops.
    let report = scheduler().run(std::future::ready(())).await.unwrap();
    assert_eq!(report.enqueued, 0);
    let queue = db.queue();
    let before = queue.schedules().await.unwrap();
    assert_eq!(before.len(), 3);
    let next = before[0].next_tick;
    assert!(before.iter().all(|s| s.next_tick == next && !s.overdue));
    five_hours_back(&t).await;
    assert!(queue.schedules().await.unwrap().iter().all(|s| s.overdue));

    let stop = Stop::new();
    let running = tokio::spawn(scheduler().run(stop.until()));
    wait_until("every schedule caught up", || async {
        let now = queue.schedules().await.unwrap();
        now.iter().all(|s| s.next_tick == next)
    })
    .await;
    stop.stop();
    let report = running.await.unwrap().unwrap();
    let hour = 3600;
    let secs = |t: SystemTime| t.duration_since(UNIX_EPOCH).unwrap().as_secs() as i64;
    let n = secs(next);
    assert_eq!(ticks_of(&t, "latest").await, vec![n - hour]);
    assert_eq!(
        ticks_of(&t, "all").await,
        (1..=5).rev().map(|k| n - k * hour).collect::<Vec<_>>()
    );
    assert_eq!(ticks_of(&t, "none").await, Vec::<i64>::new());
    assert_eq!((report.enqueued, report.skipped), (6, 4 + 5));
    let after = queue.schedules().await.unwrap();
    let by_name: BTreeMap<_, _> = after.iter().map(|s| (s.name.as_str(), s)).collect();
    assert_eq!(by_name["none"].last_tick, None);
    assert_eq!(
        by_name["all"].last_tick,
        Some(UNIX_EPOCH + Duration::from_secs((n - hour) as u64))
    );
    assert!(after.iter().all(|s| !s.overdue));
}

/// A scheduler started later with another definition of a schedule replaces the stored one; a
/// scheduler still running the old definition enqueues nothing from then on.
async fn redefined(t: Arc<TestDb>) {
    init(&t).await;
    let old = t.db().await;
    let stop = Stop::new();
    let old_def = every_second();
    let running_old = tokio::spawn({
        let until = stop.until();
        async move { Scheduler::new(&old).schedule(old_def).run(until).await }
    });
    wait_until("2 ticks of the old definition", || async {
        ticks_of(&t, "tick").await.len() >= 2
    })
    .await;
    let new_def = Schedule::every("tick", Duration::from_secs(2))
        .job(NewJob::new(json!({"from": "new"})).queue("ticks"));
    let new = t.db().await;
    // Registered only: from here on, nobody runs the old definition.
    Scheduler::new(&new)
        .schedule(new_def.clone())
        .run(std::future::ready(()))
        .await
        .unwrap();
    let cut = t
        .count("SELECT COALESCE(MAX(id), 0) FROM rowclaim_jobs")
        .await;
    let running_new = tokio::spawn({
        let until = stop.until();
        async move { Scheduler::new(&new).schedule(new_def).run(until).await }
    });
    wait_until("3 ticks of the new definition", || async {
        t.count(&format!(
            "SELECT COUNT(*) FROM rowclaim_jobs WHERE id > {cut}"
        ))
        .await
            >= 3
    })
    .await;
    stop.stop();
    running_old.await.unwrap().unwrap();
    running_new.await.unwrap().unwrap();
    let jobs = t
        .db()
        .await
        .queue()
        .list(&JobFilter::new().queues(["ticks"]).limit(1000))
        .await
        .unwrap();
    for job in jobs.iter().filter(|j| j.id > cut) {
        assert_eq!(
            job.payload,
            json!({"from": "new"}),
            "the old definition fired after its replacement"
        );
    }
    let keys = t
        .strings(&format!(
            "SELECT unique_key FROM rowclaim_jobs WHERE id > {cut} ORDER BY id"
        ))
        .await;
    let new_ticks: Vec<i64> = keys
        .iter()
        .map(|k| {
            k.as_deref()
                .unwrap()
                .rsplit(':')
                .next()
                .unwrap()
                .parse()
                .unwrap()
        })
        .collect();
    assert!(new_ticks.iter().all(|t| t % 2 == 0), "{new_ticks:?}");
    once_each_and_contiguous(&new_ticks, 2);
    let status = t.db().await.queue().schedules().await.unwrap();
    assert_eq!(status[0].expression, "every 2s");
}

/// A worker runs its schedules' jobs, and its schedules stop with it: nothing is enqueued once
/// it has returned.
async fn worker_runs_schedules(t: Arc<TestDb>) {
    let db = init(&t).await;
    let worker = Worker::new(&db)
        .queue("ticks")
        .handle("tick", |_job| async { Ok::<_, String>(()) })
        .schedule(every_second())
        .poll(Duration::from_millis(100));
    let stop = worker.shutdown_handle();
    let done = tokio::spawn(worker.run(std::future::pending()));
    wait_until("3 scheduled jobs completed", || async {
        t.count("SELECT COUNT(*) FROM rowclaim_jobs WHERE status = 'completed'")
            .await
            >= 3
    })
    .await;
    stop.drain();
    let report = done.await.unwrap().expect("worker");
    assert!(report.completed >= 3, "{report:?}");
    let after = t.count("SELECT COUNT(*) FROM rowclaim_jobs").await;
    tokio::time::sleep(Duration::from_millis(2500)).await;
    assert_eq!(
        t.count("SELECT COUNT(*) FROM rowclaim_jobs").await,
        after,
        "a stopped worker's schedules enqueued more"
    );
    once_each_and_contiguous(&ticks_of(&t, "tick").await, 1);

    // A bad schedule stops the worker before it takes a job.
    let err = Worker::new(&db)
        .handle_any(|_job| async { Ok::<_, String>(()) })
        .schedule(Schedule::cron("bad", "0 0 * * *").zone("Mars/Olympus"))
        .run(std::future::pending())
        .await
        .unwrap_err();
    assert!(err.to_string().contains("schedule bad: zone"), "{err}");
}

/// `init` makes the schedules' table as its own schema component, also when three processes
/// run it at once.
async fn init_makes_the_component(t: Arc<TestDb>) {
    let mut inits = Vec::new();
    for _ in 0..3 {
        let db = t.db().await;
        inits.push(tokio::spawn(async move { db.queue().init().await }));
    }
    for i in inits {
        i.await.unwrap().expect("concurrent init");
    }
    assert_eq!(
        t.count(
            "SELECT COUNT(*) FROM rowclaim_schema WHERE component = 'schedules' AND version = 1"
        )
        .await,
        1
    );
    assert_eq!(t.count("SELECT COUNT(*) FROM rowclaim_schedules").await, 0);
}

/// Without `init`, a scheduler says to run it.
async fn not_initialised(t: Arc<TestDb>) {
    let db = t.db().await;
    let err = Scheduler::new(&db)
        .schedule(every_second())
        .run(std::future::ready(()))
        .await
        .unwrap_err();
    assert!(err.to_string().contains("rowclaim init"), "{err}");
}

/// PostgreSQL: the scheduler's sessions are killed again and again while it runs; it carries
/// on, and every tick is still enqueued exactly once with none left out.
#[cfg(feature = "postgres")]
async fn killed_sessions(t: Arc<TestDb>) {
    init(&t).await;
    let sep = if t.url.contains('?') { '&' } else { '?' };
    let url = format!("{}{sep}application_name=doomed_scheduler", t.url);
    let stop = Stop::new();
    let mut schedulers = Vec::new();
    for _ in 0..2 {
        let db = Db::connect(&url).await.unwrap();
        let until = stop.until();
        schedulers.push(tokio::spawn(async move {
            Scheduler::new(&db)
                .schedule(every_second())
                .run(until)
                .await
        }));
    }
    for round in 1..=4 {
        wait_until("ticks between kills", || async {
            complete_ticks(&t).await;
            ticks_of(&t, "tick").await.len() >= round * 2
        })
        .await;
        t.exec(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity \
             WHERE application_name = 'doomed_scheduler'",
        )
        .await;
    }
    wait_until("ticks after the last kill", || async {
        complete_ticks(&t).await;
        ticks_of(&t, "tick").await.len() >= 11
    })
    .await;
    stop.stop();
    for s in schedulers {
        s.await.unwrap().expect("scheduler");
    }
    once_each_and_contiguous(&ticks_of(&t, "tick").await, 1);
}

/// PostgreSQL: a schedule whose job the database refuses (a payload jsonb cannot hold) enqueues
/// nothing and is tried again, and does not hold up another schedule of the same scheduler.
#[cfg(feature = "postgres")]
async fn a_refused_schedule_holds_up_no_other(t: Arc<TestDb>) {
    let db = init(&t).await;
    let refused = Schedule::every("refused", Duration::from_secs(1))
        .job(NewJob::new(json!({"nul": "\u{0}"})).queue("ticks"));
    let stop = Stop::new();
    let running = tokio::spawn({
        let until = stop.until();
        async move {
            Scheduler::new(&db)
                .schedule(refused)
                .schedule(every_second())
                .run(until)
                .await
        }
    });
    wait_until("4 ticks of the good schedule", || async {
        ticks_of(&t, "tick").await.len() >= 4
    })
    .await;
    stop.stop();
    running.await.unwrap().unwrap();
    once_each_and_contiguous(&ticks_of(&t, "tick").await, 1);
    assert!(ticks_of(&t, "refused").await.is_empty());
}

macro_rules! schedule_cases {
    ($backend:expr) => {
        use super::*;
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn three_schedulers_enqueue_each_tick_once() {
            with_db($backend, three_schedulers).await
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn missed_ticks_follow_the_catch_up_policy() {
            with_db($backend, missed_ticks).await
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn a_replaced_definition_stops_firing() {
            with_db($backend, redefined).await
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn a_worker_runs_and_stops_its_schedules() {
            with_db($backend, worker_runs_schedules).await
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn init_makes_the_schedules_component() {
            with_db($backend, init_makes_the_component).await
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn a_scheduler_without_init_says_so() {
            with_db($backend, not_initialised).await
        }
    };
}

#[cfg(feature = "postgres")]
mod postgres {
    schedule_cases!(Backend::Postgres);

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_scheduler_rides_out_killed_sessions() {
        with_db(Backend::Postgres, super::killed_sessions).await
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_refused_schedule_holds_up_no_other() {
        with_db(
            Backend::Postgres,
            super::a_refused_schedule_holds_up_no_other,
        )
        .await
    }
}
#[cfg(feature = "sqlite")]
mod sqlite {
    schedule_cases!(Backend::Sqlite);
}
#[cfg(feature = "mysql")]
mod mysql {
    schedule_cases!(Backend::MySql);
}
