//! PGMQ runner for scripts/bench-peers.
//!
//!   peers-pgmq --url URL --jobs N --concurrency C [--stats stale|fresh] [--out FILE]
//!
//! Installs PGMQ as plain SQL (the crate's embedded install scripts; no extension needed), makes
//! the queue "bench" anew, sends N messages with send_batch in chunks of 1,000, CHECKPOINTs
//! (--stats stale, the default: the planner knows what it knew before the messages came) or runs
//! VACUUM ANALYZE and then CHECKPOINT (--stats fresh), and only then starts the clock: C loops, each on its own pooled connection, read_batch 100 messages
//! (visibility timeout 30 s) and delete_batch them, until a read comes back empty. Reports jobs
//! per second, this process's CPU per job and the CPU per job of every `postgres` process on
//! the machine (from /proc, before and after the drain), as one JSON object.
//!
//! Checks itself: every message sent was read exactly once (read_ct 1, no id twice), every
//! delete removed its messages, and the queue is empty at the end; otherwise it exits 1.

use pgmq::{Message, PGMQueueExt};
use serde_json::{json, Value};
use std::time::{Duration, Instant};

const QUEUE: &str = "bench";
const SEND_CHUNK: usize = 1000;
const READ_BATCH: i32 = 100;
const VT_SECONDS: i32 = 30;

type Res<T> = Result<T, Box<dyn std::error::Error + Send + Sync>>;

struct Args {
    url: String,
    jobs: usize,
    concurrency: usize,
    fresh_stats: bool,
    out: Option<String>,
}

fn args() -> Res<Args> {
    let mut a = Args {
        url: String::new(),
        jobs: 200_000,
        concurrency: 8,
        fresh_stats: false,
        out: None,
    };
    let mut it = std::env::args().skip(1);
    while let Some(k) = it.next() {
        let mut v = || it.next().ok_or_else(|| format!("{k} needs a value"));
        match k.as_str() {
            "--url" => a.url = v()?,
            "--jobs" => a.jobs = v()?.parse()?,
            "--concurrency" => a.concurrency = v()?.parse()?,
            "--out" => a.out = Some(v()?),
            "--stats" => {
                a.fresh_stats = match v()?.as_str() {
                    "fresh" => true,
                    "stale" => false,
                    other => return Err(format!("--stats {other}: use stale or fresh").into()),
                }
            }
            _ => return Err(format!("unknown argument {k}").into()),
        }
    }
    if a.url.is_empty() || a.jobs == 0 || a.concurrency == 0 {
        return Err("usage: peers-pgmq --url URL --jobs N --concurrency C [--stats stale|fresh] [--out FILE]".into());
    }
    Ok(a)
}

fn fail(msg: String) -> ! {
    eprintln!("pgmq runner FAILED its own check: {msg}");
    std::process::exit(1);
}

#[tokio::main(flavor = "multi_thread")]
async fn main() -> Res<()> {
    let a = args()?;
    // A pool of our own: PGMQueueExt::new parses the URL itself, wants a password and drops its
    // query (so ?sslmode=disable would be lost and TLS negotiated); sqlx's own parser keeps it.
    let opts: sqlx::postgres::PgConnectOptions = a.url.parse()?;
    let pool = sqlx::postgres::PgPoolOptions::new()
        .max_connections(a.concurrency as u32 + 1)
        .acquire_timeout(Duration::from_secs(30))
        .connect_with(opts)
        .await?;
    let q = PGMQueueExt::new_with_pool(pool).await;

    // Setup, before the clock.
    q.install_sql_from_embedded().await?;
    let installed = q
        .installed_version()
        .await?
        .map(|v| v.to_string())
        .unwrap_or_default();
    let _ = q.drop_queue(QUEUE).await; // absent on a fresh database
    q.create(QUEUE).await?;
    let t_send = Instant::now();
    let mut sent: Vec<i64> = Vec::with_capacity(a.jobs);
    let mut i = 0usize;
    while i < a.jobs {
        let n = SEND_CHUNK.min(a.jobs - i);
        let msgs: Vec<Value> = (i..i + n).map(|k| json!({ "i": k })).collect();
        let ids = q.send_batch(QUEUE, &msgs).await?;
        if ids.len() != n {
            fail(format!("send_batch of {n} returned {} ids", ids.len()));
        }
        sent.extend(ids);
        i += n;
    }
    let send_seconds = t_send.elapsed().as_secs_f64();
    eprintln!(
        "pgmq: {} messages sent in {send_seconds:.2} s ({:.0}/s)",
        a.jobs,
        a.jobs as f64 / send_seconds
    );
    // The planner's statistics for the drain: stale (only a checkpoint) or fresh.
    if a.fresh_stats {
        sqlx::raw_sql("VACUUM ANALYZE").execute(&q.connection).await?;
    }
    if let Err(e) = sqlx::raw_sql("CHECKPOINT").execute(&q.connection).await {
        eprintln!("pgmq: CHECKPOINT not allowed ({e}); the drain may include one");
    }
    // Open every connection the loops will use before the clock starts.
    {
        let mut held = Vec::new();
        for _ in 0..a.concurrency {
            held.push(q.connection.acquire().await?);
        }
    }

    // The drain.
    let cpu0 = self_cpu();
    let srv0 = server_cpu();
    let started = Instant::now();
    // When the first loop had its first messages: the first job's handler, as the other
    // runners measure it.
    let first = std::sync::Arc::new(std::sync::OnceLock::new());
    let mut tasks = Vec::new();
    for _ in 0..a.concurrency {
        let (q, first) = (q.clone(), first.clone());
        tasks.push(tokio::spawn(async move {
            let mut seen: Vec<i64> = Vec::new();
            let mut reread = 0usize;
            loop {
                let msgs: Vec<Message<Value>> = q.read_batch(QUEUE, VT_SECONDS, READ_BATCH).await?;
                if msgs.is_empty() {
                    break;
                }
                first.get_or_init(Instant::now);
                let ids: Vec<i64> = msgs.iter().map(|m| m.msg_id).collect();
                reread += msgs.iter().filter(|m| m.read_ct != 1).count();
                // The no-op job: nothing to do with the message.
                let deleted = q.delete_batch(QUEUE, &ids).await?;
                if deleted != ids.len() {
                    return Err(format!(
                        "delete_batch of {} messages deleted {deleted}",
                        ids.len()
                    )
                    .into());
                }
                seen.extend(ids);
            }
            Res::Ok((seen, reread))
        }));
    }
    let mut seen: Vec<i64> = Vec::with_capacity(a.jobs);
    let mut reread = 0usize;
    for t in tasks {
        let (s, r) = t.await??;
        seen.extend(s);
        reread += r;
    }
    let seconds = started.elapsed().as_secs_f64();
    let worker_cpu = self_cpu().saturating_sub(cpu0);
    let server = srv0
        .zip(server_cpu())
        .map(|(b, e)| e.saturating_sub(b));

    // The check.
    let left: i64 = sqlx::query_scalar(&format!("SELECT count(*) FROM pgmq.q_{QUEUE}"))
        .fetch_one(&q.connection)
        .await?;
    let metrics_len: i64 = sqlx::query_scalar("SELECT queue_length FROM pgmq.metrics($1)")
        .bind(QUEUE)
        .fetch_one(&q.connection)
        .await?;
    seen.sort_unstable();
    let dups = seen.windows(2).filter(|w| w[0] == w[1]).count();
    sent.sort_unstable();
    if left != 0 || metrics_len != 0 {
        fail(format!("{left} messages left in the queue (metrics: {metrics_len})"));
    }
    if dups != 0 || reread != 0 {
        fail(format!("{dups} messages read twice, {reread} with read_ct > 1"));
    }
    if seen != sent {
        fail(format!(
            "read {} distinct messages, sent {}",
            seen.len(),
            sent.len()
        ));
    }
    q.connection.close().await;

    let per_job = |d: Duration| d.as_secs_f64() * 1e6 / a.jobs as f64;
    let report = json!({
        "system": "pgmq",
        "pgmq_crate": "0.33.7",
        "pgmq_sql_version": installed,
        "jobs": a.jobs,
        "concurrency": a.concurrency,
        "stats": if a.fresh_stats { "fresh" } else { "stale" },
        "read_batch": READ_BATCH,
        "vt_seconds": VT_SECONDS,
        "send_seconds": send_seconds,
        "seconds": seconds,
        "seconds_to_first_handler": first.get().map(|t| t.duration_since(started).as_secs_f64()),
        "jobs_per_second": a.jobs as f64 / seconds,
        "worker_cpu_us_per_job": per_job(worker_cpu),
        "server_cpu_us_per_job": server.map(per_job),
        "check": "passed",
    });
    let text = serde_json::to_string_pretty(&report)?;
    match &a.out {
        Some(path) => std::fs::write(path, text + "\n")?,
        None => println!("{text}"),
    }
    Ok(())
}

/// This process's CPU time (user + system) so far.
fn self_cpu() -> Duration {
    // SAFETY: getrusage writes into the struct we pass and reads nothing else.
    let mut u: libc::rusage = unsafe { std::mem::zeroed() };
    if unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut u) } != 0 {
        return Duration::ZERO;
    }
    let tv = |t: libc::timeval| {
        Duration::from_secs(t.tv_sec.max(0) as u64) + Duration::from_micros(t.tv_usec.max(0) as u64)
    };
    tv(u.ru_utime) + tv(u.ru_stime)
}

/// CPU time of every process named `postgres` on this machine, with what each reaped
/// (utime + stime + cutime + cstime from /proc/PID/stat), the same sum rowclaim's bench takes.
fn server_cpu() -> Option<Duration> {
    // SAFETY: sysconf has no preconditions.
    let ticks = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if ticks <= 0 {
        return None;
    }
    let mut total = 0u64;
    let mut found = false;
    for entry in std::fs::read_dir("/proc").ok()?.flatten() {
        let Ok(stat) = std::fs::read_to_string(entry.path().join("stat")) else {
            continue;
        };
        let (Some(open), Some(close)) = (stat.find('('), stat.rfind(')')) else {
            continue;
        };
        if &stat[open + 1..close] != "postgres" {
            continue;
        }
        let fields: Vec<&str> = stat[close + 2..].split_whitespace().collect();
        let field = |n: usize| {
            fields
                .get(n - 3)
                .and_then(|f| f.parse::<u64>().ok())
                .unwrap_or(0)
        };
        total += field(14) + field(15) + field(16) + field(17);
        found = true;
    }
    found.then(|| Duration::from_secs_f64(total as f64 / ticks as f64))
}
