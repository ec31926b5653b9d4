//! `rowclaim enqueue`: add jobs to the managed queue, one from the argument or many from JSON
//! lines on stdin (all or nothing).

use std::io::{stdin, Write};
use std::time::Duration;

use clap::Args;
use rowclaim::Db;

use crate::error::CliError;
use crate::say::say;

#[derive(Args, Debug)]
pub struct EnqueueArgs {
    /// The queue.
    #[arg(long, value_name = "Q", default_value = "default")]
    queue: String,
    /// The job's kind, for routing to a handler.
    #[arg(long, value_name = "K", default_value = "")]
    kind: String,
    /// Higher runs first.
    #[arg(
        long,
        value_name = "P",
        default_value_t = 0,
        allow_negative_numbers = true
    )]
    priority: i32,
    /// Run no earlier than this long from now, e.g. 10s, 5m.
    #[arg(long, value_name = "DURATION", value_parser = super::values::duration_or_zero, allow_hyphen_values = true, conflicts_with = "run_at")]
    delay: Option<Duration>,
    /// Run no earlier than this time, e.g. 2026-12-01T08:00:00Z or 2026-12-01T09:00:00+01:00.
    /// A time without an offset is read as UTC (and the time taken is said).
    #[arg(long, value_name = "RFC3339", value_parser = super::values::run_at)]
    run_at: Option<super::values::RunAt>,
    /// Runs before the job is dead.
    #[arg(long, value_name = "N", default_value_t = rowclaim::DEFAULT_MAX_ATTEMPTS as u32, value_parser = super::values::count, allow_hyphen_values = true)]
    max_attempts: u32,
    /// While a job with this key is ready or running, return it instead of adding another.
    #[arg(long, value_name = "K")]
    unique_key: Option<String>,
    /// The key the queue's per-key limits count the job under (`rowclaim queue limit`): jobs
    /// of one key run at most --key-concurrency at once, in enqueue order. With JSON lines,
    /// every job gets it.
    #[arg(long, value_name = "K")]
    limit_key: Option<String>,
    /// Stop a run of the job that takes longer than this, e.g. 5m; it then fails ("timed out
    /// after 5m") and is retried like any failure. Default: the worker's --timeout.
    #[arg(long, value_name = "DURATION", value_parser = super::values::duration, allow_hyphen_values = true)]
    timeout: Option<Duration>,
    /// Wait for these jobs (ids, comma-separated): the job runs only once every one of them
    /// has completed, and is cancelled, naming it, if one ends dead or cancelled (unless
    /// --run-anyway). Its status meanwhile is waiting. With JSON lines, every job waits.
    #[arg(long, value_name = "ID,ID", value_delimiter = ',', value_parser = clap::value_parser!(i64).range(1..))]
    after: Vec<i64>,
    /// With --after: run once those jobs have finished, also when one ended dead or cancelled.
    #[arg(long, requires = "after")]
    run_anyway: bool,
    /// The payload; without it, one payload per line is read from stdin. Prints each job's id as
    /// one JSON line, {"id":…,"existing":…}, in the order of the input.
    #[arg(value_name = "JSON")]
    json: Option<String>,
}

/// `rowclaim enqueue`: one job from the argument, or JSON lines from stdin, all or nothing.
pub async fn run(url: &str, a: EnqueueArgs) -> Result<(), CliError> {
    let template = |payload: serde_json::Value| {
        let mut job = rowclaim::NewJob::new(payload)
            .queue(&a.queue)
            .kind(&a.kind)
            .priority(a.priority)
            .max_attempts(i32::try_from(a.max_attempts).unwrap_or(i32::MAX));
        if let Some(d) = a.delay {
            job = job.delay(d);
        }
        if let Some(t) = a.run_at {
            job = job.run_at(t.at);
        }
        if let Some(k) = &a.unique_key {
            job = job.unique_key(k);
        }
        if let Some(limit) = a.timeout {
            job = job.timeout(limit);
        }
        if let Some(k) = &a.limit_key {
            job = job.limit_key(k);
        }
        if !a.after.is_empty() {
            job = job.after(a.after.iter().copied());
        }
        if a.run_anyway {
            job = job.run_anyway();
        }
        job
    };
    if let Some(t) = a.run_at.filter(|t| t.naive) {
        let utc = humantime::format_rfc3339_seconds(t.at);
        say!("--run-at has no offset: read as UTC, {utc}");
    }
    let db = Db::connect(url).await?;
    let queue = db.queue();
    if let Some(text) = &a.json {
        let payload: serde_json::Value = serde_json::from_str(text)
            .map_err(|e| CliError::BadInput(format!("the JSON argument is not valid JSON: {e}")))?;
        let done = queue.enqueue(&template(payload)).await?;
        let text =
            serde_json::to_string(&done).map_err(|e| CliError::io("writing the job")(e.into()))?;
        println!("{text}");
        if done.existing {
            say!("job {} with that unique key is pending already", done.id);
        }
        return Ok(());
    }
    if a.unique_key.is_some() {
        let why = "--unique-key goes with one job given as an argument, not with JSON lines";
        return Err(CliError::BadInput(why.into()));
    }
    let progress = indicatif::ProgressBar::new_spinner();
    progress.set_draw_target(if crate::say::quiet() {
        indicatif::ProgressDrawTarget::hidden()
    } else {
        indicatif::ProgressDrawTarget::stderr()
    });
    // All of stdin first (nothing is enqueued unless every line is a job), then its lines
    // parsed on every core: the database waits for them.
    let mut text = String::new();
    std::io::Read::read_to_string(&mut stdin().lock(), &mut text)
        .map_err(CliError::io("reading stdin"))?;
    progress.set_message("reading the jobs");
    progress.tick();
    // The stdin line of each job (blank lines are skipped), to name it in errors.
    let numbered: Vec<(usize, &str)> = text
        .lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
        .map(|(i, l)| (i + 1, l))
        .collect();
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    let per_thread = numbered.len().div_ceil(threads).max(1);
    let parse = |part: &[(usize, &str)]| -> Result<Vec<rowclaim::NewJob>, CliError> {
        part.iter()
            .map(|(line, l)| match serde_json::from_str(l) {
                Ok(payload) => Ok(template(payload)),
                Err(e) => Err(CliError::BadInput(format!(
                    "line {line}: not valid JSON ({e}); nothing was enqueued"
                ))),
            })
            .collect()
    };
    // Parts in order, each stopping at its first bad line: the first error is the first line's.
    let parts: Vec<Result<Vec<rowclaim::NewJob>, CliError>> = std::thread::scope(|s| {
        let parse = &parse;
        let running: Vec<_> = numbered
            .chunks(per_thread)
            .map(|part| s.spawn(move || parse(part)))
            .collect();
        running
            .into_iter()
            .map(|t| t.join().unwrap_or_else(|p| std::panic::resume_unwind(p)))
            .collect()
    });
    let mut jobs = Vec::with_capacity(numbered.len());
    for part in parts {
        jobs.extend(part?);
    }
    let lines: Vec<usize> = numbered.iter().map(|(line, _)| *line).collect();
    drop(numbered);
    drop(text);
    progress.set_message(format!("enqueueing {} jobs", jobs.len()));
    progress.enable_steady_tick(Duration::from_millis(200));
    let done = match queue.enqueue_all(&jobs).await {
        Ok(done) => done,
        Err(rowclaim::Error::PayloadTooLarge { job, bytes, limit }) => {
            let line = lines.get(job.wrapping_sub(1)).copied().unwrap_or(job);
            return Err(CliError::BadInput(format!(
                "line {line}: its payload is {bytes} bytes, more than one statement may carry to \
                 this server (max_allowed_packet is {limit} bytes); nothing was enqueued"
            )));
        }
        Err(e) => return Err(e.into()),
    };
    progress.finish_and_clear();
    // Each job's id, one JSON line per job, as for a job given as the argument.
    let mut out = std::io::BufWriter::new(std::io::stdout().lock());
    for job in &done {
        // Written straight to stdout: no String per job.
        serde_json::to_writer(&mut out, job)
            .map_err(|e| CliError::io("writing to stdout")(e.into()))?;
        writeln!(out).map_err(CliError::io("writing to stdout"))?;
    }
    out.flush().map_err(CliError::io("writing to stdout"))?;
    let added = done.iter().filter(|j| !j.existing).count();
    say!("enqueued {added} jobs on queue {}", a.queue);
    Ok(())
}
