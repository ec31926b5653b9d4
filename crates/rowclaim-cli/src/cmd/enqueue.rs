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
    if let Some(t) = a.run_at.filter(|t| t.naive) {
        let utc = humantime::format_rfc3339_seconds(t.at);
        say!("--run-at has no offset: read as UTC, {utc}");
    }
    let db = Db::connect(url).await?;
    let queue = db.queue();
    if let Some(text) = &a.json {
        let job = rowclaim::NewJob::from_json(text.as_str())
            .map_err(|e| CliError::BadInput(format!("the JSON argument is not valid JSON: {e}")))?;
        let done = queue.enqueue(&job_of(&a, job)).await?;
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
    // All of stdin first; then its lines are parsed on every core, chunk by chunk, while the
    // database writes the chunks before (one transaction: nothing is enqueued unless every line
    // is a job).
    let mut text = String::new();
    std::io::Read::read_to_string(&mut stdin().lock(), &mut text)
        .map_err(CliError::io("reading stdin"))?;
    let lines = std::sync::Arc::new(Lines::of(text));
    progress.set_message(format!("enqueueing {} jobs", lines.jobs.len()));
    progress.enable_steady_tick(Duration::from_millis(200));
    let args = std::sync::Arc::new(a);
    let (chunks, bad_line) = parse_in_chunks(&lines, {
        let args = args.clone();
        move |job| job_of(&args, job)
    })
    .map_err(CliError::io("starting the threads that parse stdin"))?;
    let done = match queue.enqueue_stream(chunks).await {
        Ok(done) => done,
        Err(rowclaim::Error::PayloadTooLarge { job, bytes, limit }) => {
            let line = lines.line_of(job);
            return Err(CliError::BadInput(format!(
                "line {line}: its payload is {bytes} bytes, more than one statement may carry to \
                 this server (max_allowed_packet is {limit} bytes); nothing was enqueued"
            )));
        }
        // A line that is not JSON ended the stream (it is in the slot then); nothing was written.
        Err(e) => match bad_line.get() {
            Some(why) => return Err(CliError::BadInput(why.clone())),
            None => return Err(e.into()),
        },
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
    say!("enqueued {added} jobs on queue {}", args.queue);
    Ok(())
}

/// A job with a payload given, with the settings of the command's flags.
fn job_of(a: &EnqueueArgs, job: rowclaim::NewJob) -> rowclaim::NewJob {
    let mut job = job
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
}

/// Jobs per chunk parsed and sent to the database at a time: small enough that the database
/// starts at once, large enough that a statement per chunk costs little.
const CHUNK: usize = 20_000;

/// Stdin's text and where its jobs are: one per line that is not blank.
struct Lines {
    text: String,
    /// Each job's stdin line (from 1) and its byte range in `text`.
    jobs: Vec<(usize, std::ops::Range<usize>)>,
}

impl Lines {
    fn of(text: String) -> Lines {
        let mut jobs = Vec::new();
        let mut start = 0;
        for (i, line) in text.split_inclusive('\n').enumerate() {
            let end = start + line.len();
            let l = line.trim_end_matches(['\n', '\r']);
            if !l.trim().is_empty() {
                jobs.push((i + 1, start..start + l.len()));
            }
            start = end;
        }
        Lines { text, jobs }
    }

    /// The stdin line of job `n` (from 1).
    fn line_of(&self, n: usize) -> usize {
        n.checked_sub(1)
            .and_then(|i| self.jobs.get(i))
            .map_or(n, |(line, _)| *line)
    }
}

/// A chunk of jobs, or why its first bad line is not a job.
type Parsed = Result<Vec<rowclaim::NewJob>, String>;

/// Why the bad line that ended the stream of jobs is not a job, if one did (then the enqueue
/// failed for it).
type BadLine = std::sync::Arc<std::sync::OnceLock<String>>;

/// What each parser thread shares: stdin's text, where its jobs are, and how a job with a
/// payload gets the flags' settings. A line is checked to be JSON and kept as its text
/// ([`rowclaim::NewJob::from_json`]), not parsed into a value to be written out again as text
/// (which took a third of the command's CPU per job, enqueueing to PostgreSQL).
struct Parser<F> {
    lines: std::sync::Arc<Lines>,
    make: F,
}

impl<F: Fn(rowclaim::NewJob) -> rowclaim::NewJob> Parser<F> {
    /// The jobs of chunk `c`, or why its first bad line is not a job.
    fn chunk(&self, c: usize) -> Parsed {
        let all = &self.lines.jobs;
        let part = &all[c * CHUNK..((c + 1) * CHUNK).min(all.len())];
        let mut jobs = Vec::with_capacity(part.len());
        for (line, range) in part {
            match rowclaim::NewJob::from_json(&self.lines.text[range.clone()]) {
                Ok(job) => jobs.push((self.make)(job)),
                Err(e) => {
                    return Err(format!(
                        "line {line}: not valid JSON ({e}); nothing was enqueued"
                    ))
                }
            }
        }
        Ok(jobs)
    }
}

/// The jobs of `lines` as a stream of chunks in order, parsed by one thread per core (thread
/// `t` parses chunks `t`, `t + threads`, …). A bad line ends the stream with an error, which
/// rolls the enqueue back, and is left in the slot returned: the stream reads the chunks in
/// order, so it is the first bad line of stdin, and only a bad line the enqueue reached is
/// left there (an enqueue that failed first for another reason says that reason).
fn parse_in_chunks<F>(
    lines: &std::sync::Arc<Lines>,
    make: F,
) -> std::io::Result<(
    impl futures_util::Stream<Item = rowclaim::Result<Vec<rowclaim::NewJob>>> + Send + 'static,
    BadLine,
)>
where
    F: Fn(rowclaim::NewJob) -> rowclaim::NewJob + Send + Sync + 'static,
{
    let parser = std::sync::Arc::new(Parser {
        lines: lines.clone(),
        make,
    });
    let chunks = lines.jobs.len().div_ceil(CHUNK);
    let threads = std::thread::available_parallelism()
        .map_or(1, |n| n.get())
        .clamp(1, chunks.max(1));
    let mut receivers = Vec::with_capacity(threads);
    for t in 0..threads {
        // Two chunks ahead per thread: parsing stays ahead of the database, memory bounded.
        let (tx, rx) = tokio::sync::mpsc::channel::<Parsed>(2);
        receivers.push(rx);
        let parser = parser.clone();
        std::thread::Builder::new()
            .name(format!("parse-{t}"))
            .spawn(move || {
                for c in (t..chunks).step_by(threads) {
                    let chunk = parser.chunk(c);
                    let bad = chunk.is_err();
                    // A send fails once the enqueue has ended (it failed): nothing more to parse.
                    if tx.blocking_send(chunk).is_err() || bad {
                        return;
                    }
                }
            })?;
    }
    let bad_line = BadLine::default();
    let slot = bad_line.clone();
    let stream = futures_util::stream::unfold((receivers, 0), move |(mut rx, c)| {
        let slot = slot.clone();
        async move {
            if c == chunks {
                return None;
            }
            let got = match rx[c % threads].recv().await {
                Some(Ok(jobs)) => Ok(jobs),
                Some(Err(why)) => {
                    // The first error ends the stream: the slot is set once.
                    let _ = slot.set(why.clone());
                    Err(rowclaim::Error::InvalidInput(why))
                }
                None => Err(rowclaim::Error::Internal(format!(
                    "the parser of chunk {c} stopped without a word"
                ))),
            };
            Some((got, (rx, c + 1)))
        }
    });
    Ok((stream, bad_line))
}
