//! The jobs of one enqueue call, as they come to a store's enqueue: a slice given whole, or
//! chunks from a caller's stream, which it may still be making while the database writes the
//! chunks before (`rowclaim enqueue` parses stdin so). One transaction either way.
//!
//! A stream's chunks are kept as they come: a transient failure enqueues them all again from
//! the first (see [`Incoming::rewind`]), and the jobs that wait are read again after the last.

use std::pin::Pin;

use futures_util::{Stream, StreamExt};

use super::job::JobParts;
use super::NewJob;
use crate::error::{Error, Result};

/// A caller's chunks of jobs; an `Err` ends the enqueue and rolls it back.
pub(crate) type Chunks<'a> = Pin<Box<dyn Stream<Item = Result<Vec<NewJob>>> + Send + 'a>>;

/// The jobs of one enqueue call; a store takes them chunk by chunk ([`Incoming::next`]).
pub(crate) struct Incoming<'a> {
    from: From<'a>,
    /// Chunks handed out in this attempt.
    handed: usize,
    /// Jobs handed out in this attempt.
    counted: usize,
    /// The stream gave an error (or a job that does not pass its checks): the call has failed
    /// for good, and is neither replayed nor taken further.
    failed: bool,
    /// Whether a job of the call (a slice's, or a chunk's taken so far) waits for others.
    waits: bool,
}

enum From<'a> {
    Slice(&'a [NewJob]),
    Stream {
        /// Every chunk the stream gave so far, each checked.
        kept: Vec<Vec<NewJob>>,
        /// The rest of the stream (`None`: it ended).
        rest: Option<Chunks<'a>>,
    },
}

impl<'a> Incoming<'a> {
    /// Jobs given whole, checked already: one chunk.
    pub(crate) fn slice(jobs: &'a [NewJob]) -> Self {
        Incoming {
            waits: jobs.iter().any(NewJob::waits),
            ..Self::new(From::Slice(jobs))
        }
    }

    /// Jobs as a caller's stream gives them; each chunk is checked as it comes.
    pub(crate) fn stream(rest: Chunks<'a>) -> Self {
        Self::new(From::Stream {
            kept: Vec::new(),
            rest: Some(rest),
        })
    }

    fn new(from: From<'a>) -> Self {
        Incoming {
            from,
            handed: 0,
            counted: 0,
            failed: false,
            waits: false,
        }
    }

    /// Starts again from the first chunk (a transient failure rolled the enqueue back).
    pub(crate) fn rewind(&mut self) {
        self.handed = 0;
        self.counted = 0;
    }

    /// The next chunk, with the number of jobs handed out before it (a job's place in the whole
    /// call is that plus its place in the chunk); `None` after the last. An `Err` is the
    /// stream's own, or a job of it that does not pass [`NewJob::check`], named by its place.
    pub(crate) async fn next(&mut self) -> Result<Option<(usize, &[NewJob])>> {
        let before = self.counted;
        if self.failed {
            // A replay after the failure would commit the chunks before it.
            return Err(Error::InvalidInput(
                "the stream of jobs failed; the enqueue cannot go on".into(),
            ));
        }
        let chunk: &[NewJob] = match &mut self.from {
            From::Slice(jobs) => match self.handed {
                0 if !jobs.is_empty() => jobs,
                _ => return Ok(None),
            },
            From::Stream { kept, rest } => {
                // Replay what was kept first; then take new chunks, skipping empty ones.
                while kept.len() == self.handed {
                    let Some(stream) = rest else {
                        return Ok(None);
                    };
                    let checked = match stream.next().await {
                        Some(chunk) => chunk.and_then(|c| {
                            self.waits |= super::job::check_jobs_from(&c, before)?;
                            Ok(c)
                        }),
                        None => {
                            *rest = None;
                            continue;
                        }
                    };
                    match checked {
                        Ok(chunk) if chunk.is_empty() => {}
                        Ok(chunk) => kept.push(chunk),
                        Err(e) => {
                            *rest = None;
                            self.failed = true;
                            return Err(e);
                        }
                    }
                }
                &kept[self.handed]
            }
        };
        self.handed += 1;
        self.counted += chunk.len();
        Ok(Some((before, chunk)))
    }

    /// Whether a job of the call waits for others (of a stream, among the chunks taken so far):
    /// when none does, the look at what each waits for is passed over.
    pub(crate) fn waits(&self) -> bool {
        self.waits
    }

    /// The jobs handed out so far, as [`Incoming::handed`], when one of them waits for others;
    /// none when none does (an enqueue's `after::hold` and its list of waiting jobs then have
    /// nothing to walk).
    pub(crate) fn to_hold(&self) -> impl Iterator<Item = &NewJob> + Send + '_ {
        self.handed().take(if self.waits { usize::MAX } else { 0 })
    }

    /// The jobs handed out so far, in order: after the last chunk, every job of the call.
    pub(crate) fn handed(&self) -> impl Iterator<Item = &NewJob> + Send + '_ {
        let chunks: &[Vec<NewJob>] = match &self.from {
            From::Slice(_) => &[],
            From::Stream { kept, .. } => &kept[..self.handed.min(kept.len())],
        };
        let slice: &[NewJob] = match (&self.from, self.handed) {
            (From::Slice(jobs), 1) => jobs,
            _ => &[],
        };
        slice.iter().chain(chunks.iter().flatten())
    }

    /// The chunks a stream gave, to be freed by the caller (none for a slice, the caller's).
    pub(crate) fn into_kept(self) -> Vec<Vec<NewJob>> {
        match self.from {
            From::Slice(_) => Vec::new(),
            From::Stream { kept, .. } => kept,
        }
    }

    /// Whether the stream failed (its error is the call's, whatever its kind: a transient
    /// error of the caller's is not a reason to replay).
    pub(crate) fn failed(&self) -> bool {
        self.failed
    }

    /// How many jobs were handed out so far.
    pub(crate) fn count(&self) -> usize {
        self.counted
    }
}

/// One statement's share of a chunk, as every store inserts it. Jobs without a unique key go
/// together, many rows per statement; a job with one goes alone, in its place (it may meet a
/// pending job with its key, which a many-row insert cannot answer for), so that the ids follow
/// the order the jobs were given in (the id breaks ties in the claim order).
pub(crate) enum Piece<'a> {
    /// Jobs without a unique key, for one statement.
    Bulk(Vec<JobParts<'a>>),
    /// A job with a unique key.
    Keyed(JobParts<'a>),
}

/// The pieces of `jobs`, in their order, each made when asked for (so a store that takes the
/// jobs' columns as it goes never holds a whole chunk's). A bulk piece holds at most `rows` jobs
/// and at most `bytes` bytes of payload, unless one job alone has more.
pub(crate) fn pieces<'a, I: Iterator<Item = JobParts<'a>>>(
    jobs: impl IntoIterator<IntoIter = I>,
    rows: usize,
    bytes: usize,
) -> Pieces<I> {
    Pieces {
        jobs: jobs.into_iter().peekable(),
        rows,
        bytes,
    }
}

/// See [`pieces`].
pub(crate) struct Pieces<I: Iterator> {
    jobs: std::iter::Peekable<I>,
    rows: usize,
    bytes: usize,
}

impl<'a, I: Iterator<Item = JobParts<'a>>> Iterator for Pieces<I> {
    type Item = Piece<'a>;

    fn next(&mut self) -> Option<Piece<'a>> {
        let first = self.jobs.next()?;
        if first.unique_key.is_some() {
            return Some(Piece::Keyed(first));
        }
        let mut bytes = first.payload.len();
        let mut bulk = vec![first];
        while bulk.len() < self.rows {
            let fits = |j: &JobParts<'_>| {
                j.unique_key.is_none() && bytes.saturating_add(j.payload.len()) <= self.bytes
            };
            let Some(job) = self.jobs.next_if(fits) else {
                break;
            };
            bytes += job.payload.len();
            bulk.push(job);
        }
        Some(Piece::Bulk(bulk))
    }
}

/// Alike jobs ([`alike`]) at least this many in a row go in one statement of their own: their
/// settings bound once, their payloads a value each (SQLite) or one JSON array the database
/// reads back element by element (MariaDB's `JSON_TABLE`). Fewer go with their neighbours, a
/// row of values each.
pub(crate) const MIN_RUN: usize = 16;

/// Whether `a` and `b` differ only in their payloads. Both are jobs of a bulk piece (without a
/// unique key), so unique keys are not compared.
pub(crate) fn alike(a: &JobParts<'_>, b: &JobParts<'_>) -> bool {
    (a.queue, a.kind, a.priority, a.delay_ms, a.run_at_ms)
        == (b.queue, b.kind, b.priority, b.delay_ms, b.run_at_ms)
        && (a.max_attempts, a.timeout_ms, a.limit_key)
            == (b.max_attempts, b.timeout_ms, b.limit_key)
}

/// A chunk's pieces written statement by statement, as SQLite and MySQL write them: a bulk
/// piece in runs ([`MIN_RUN`]) and rows of values, a keyed job alone.
pub(crate) struct Walk<'a, I: Iterator<Item = JobParts<'a>>> {
    pieces: Pieces<I>,
    /// The bulk piece being written: `bulk[at..]` has no statement yet.
    bulk: Vec<JobParts<'a>>,
    at: usize,
}

/// Where a [`Walk`] stands.
pub(crate) enum Next<'a> {
    /// Every job has its statement.
    Done,
    /// A job with a unique key, which goes alone.
    Keyed(JobParts<'a>),
    /// Jobs of a bulk piece wait for theirs ([`Walk::take`]).
    Bulk,
}

impl<'a, I: Iterator<Item = JobParts<'a>>> Walk<'a, I> {
    pub(crate) fn new(pieces: Pieces<I>) -> Self {
        Walk {
            pieces,
            bulk: Vec::new(),
            at: 0,
        }
    }

    /// Where the walk stands: once the bulk piece being written has its statements, the next
    /// piece.
    pub(crate) fn next(&mut self) -> Next<'a> {
        if self.at == self.bulk.len() {
            // The piece before is written: nothing of it is left behind.
            (self.bulk, self.at) = (Vec::new(), 0);
            match self.pieces.next() {
                None => return Next::Done,
                Some(Piece::Keyed(job)) => return Next::Keyed(job),
                Some(Piece::Bulk(bulk)) => self.bulk = bulk,
            }
        }
        Next::Bulk
    }

    /// Whether every job has its statement (what [`Walk::next`] would say is [`Next::Done`],
    /// without moving on).
    pub(crate) fn finished(&mut self) -> bool {
        self.at == self.bulk.len() && self.pieces.jobs.peek().is_none()
    }

    /// How many jobs of the bulk piece have no statement yet.
    pub(crate) fn waiting(&self) -> usize {
        self.bulk.len() - self.at
    }

    /// The job of a bulk piece of one, taken to go alone.
    pub(crate) fn take_one(&mut self) -> Option<JobParts<'a>> {
        match self.bulk.len() == 1 && self.at == 0 {
            true => self.bulk.pop(),
            false => None,
        }
    }

    /// The jobs of the next statement and whether they are a run ([`segment`]); the walk moves
    /// past them.
    pub(crate) fn take(
        &mut self,
        rows: usize,
        run_len: impl Fn(&[JobParts<'_>]) -> usize,
    ) -> (&[JobParts<'a>], bool) {
        let from = self.at;
        let (to, is_run) = segment(&self.bulk, from, rows, run_len);
        self.at = to;
        (&self.bulk[from..to], is_run)
    }
}

/// Where the statement for `bulk[at..]` (a bulk piece from `at`) ends, and whether it is a run:
/// a run when at least [`MIN_RUN`] jobs from `at` make one, else the jobs up to the next run, at
/// most `rows` of them, a row of values each. `run_len(jobs)`: how many jobs from the first of
/// `jobs` the store takes as one run (0 when it takes none).
fn segment(
    bulk: &[JobParts<'_>],
    at: usize,
    rows: usize,
    run_len: impl Fn(&[JobParts<'_>]) -> usize,
) -> (usize, bool) {
    let mut end = at;
    while end < bulk.len() && end - at < rows {
        let run = run_len(&bulk[end..]);
        if run >= MIN_RUN {
            return match end == at {
                true => (at + run, true),
                false => (end, false),
            };
        }
        end += run.max(1);
    }
    (end.min(at.saturating_add(rows)), false)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn jobs(n: i64) -> Vec<NewJob> {
        (0..n).map(|i| NewJob::new(serde_json::json!(i))).collect()
    }

    async fn drain(i: &mut Incoming<'_>) -> Result<Vec<(usize, usize)>> {
        let mut got = Vec::new();
        while let Some((before, chunk)) = i.next().await? {
            got.push((before, chunk.len()));
        }
        Ok(got)
    }

    #[tokio::test]
    async fn a_stream_is_replayed_from_the_first_chunk_after_a_rewind() {
        let chunks = vec![Ok(jobs(2)), Ok(vec![]), Ok(jobs(3))];
        let mut i = Incoming::stream(Box::pin(futures_util::stream::iter(chunks)));
        assert_eq!(drain(&mut i).await.unwrap(), [(0, 2), (2, 3)]);
        assert_eq!(i.count(), 5);
        assert_eq!(i.handed().count(), 5);
        i.rewind();
        assert_eq!(i.handed().count(), 0);
        assert_eq!(drain(&mut i).await.unwrap(), [(0, 2), (2, 3)]);
        assert_eq!(i.handed().count(), 5);
    }

    #[tokio::test]
    async fn a_slice_is_one_chunk() {
        let all = jobs(4);
        let mut i = Incoming::slice(&all);
        assert_eq!(drain(&mut i).await.unwrap(), [(0, 4)]);
        assert_eq!(i.handed().count(), 4);
        let none = Incoming::slice(&[]).next().await.unwrap().is_none();
        assert!(none);
    }

    #[tokio::test]
    async fn a_bad_job_is_named_by_its_place_in_the_whole_call() {
        let bad = vec![NewJob::new(serde_json::json!(1)).queue("")];
        let chunks = vec![Ok(jobs(3)), Ok(bad)];
        let mut i = Incoming::stream(Box::pin(futures_util::stream::iter(chunks)));
        let e = drain(&mut i).await.unwrap_err().to_string();
        assert!(e.contains("job 4:"), "{e}");
    }

    /// A stream's error ends the call: after a rewind (a retry), the chunks before it are not
    /// handed out again as if they were all, nor is the stream read past its error.
    #[tokio::test]
    async fn a_stream_that_failed_is_not_replayed() {
        let line_9 = Err(Error::InvalidInput("line 9".into()));
        let chunks = vec![Ok(jobs(1)), line_9, Ok(jobs(2))];
        let mut i = Incoming::stream(Box::pin(futures_util::stream::iter(chunks)));
        let e = drain(&mut i).await.unwrap_err().to_string();
        assert!(e.contains("line 9"), "{e}");
        assert!(i.failed());
        i.rewind();
        let again = drain(&mut i).await;
        assert!(again.is_err(), "{again:?}");
    }

    /// What `pieces` made of jobs given as (unique key, payload bytes): `b<n>` a bulk piece of
    /// n jobs, `k` a keyed job.
    fn shape(jobs: &[(Option<&str>, usize)], rows: usize, bytes: usize) -> Vec<String> {
        let all: Vec<NewJob> = jobs
            .iter()
            .map(|&(key, len)| {
                let job = NewJob::new(serde_json::json!("x".repeat(len.saturating_sub(2))));
                match key {
                    Some(k) => job.unique_key(k),
                    None => job,
                }
            })
            .collect();
        pieces(all.iter().map(NewJob::parts), rows, bytes)
            .map(|p| match p {
                Piece::Bulk(b) => format!("b{}", b.len()),
                Piece::Keyed(_) => "k".to_owned(),
            })
            .collect()
    }

    /// The statements [`segment`] makes of groups of jobs (`true`: jobs that make runs
    /// together, priority 0; `false`: jobs that make none), at most `rows` rows of values each:
    /// "r" runs, "v" rows of values, with their jobs' places.
    fn segments(groups: &[(usize, bool)], rows: usize) -> Vec<String> {
        let jobs: Vec<NewJob> = groups
            .iter()
            .flat_map(|&(n, run)| {
                (0..n).map(move |_| NewJob::new(serde_json::json!(1)).priority(i32::from(!run)))
            })
            .collect();
        let parts: Vec<JobParts<'_>> = jobs.iter().map(NewJob::parts).collect();
        let run_len = |jobs: &[JobParts<'_>]| jobs.iter().take_while(|j| j.priority == 0).count();
        let (mut at, mut made) = (0, Vec::new());
        while at < parts.len() {
            let (to, is_run) = segment(&parts, at, rows, run_len);
            made.push(format!("{}{at}..{to}", if is_run { "r" } else { "v" }));
            at = to;
        }
        made
    }

    #[test]
    fn a_statement_of_rows_ends_at_its_limit_or_where_a_run_begins() {
        assert_eq!(segments(&[(5, false), (20, true)], 10), ["v0..5", "r5..25"]);
        assert_eq!(
            segments(&[(25, false)], 10),
            ["v0..10", "v10..20", "v20..25"]
        );
        // A run beginning on the last row a statement may take, and on the first it may not.
        assert_eq!(segments(&[(9, false), (20, true)], 10), ["v0..9", "r9..29"]);
        assert_eq!(
            segments(&[(10, false), (20, true)], 10),
            ["v0..10", "r10..30"]
        );
        // Too few alike jobs for a run, across the limit: rows, cut at it.
        assert_eq!(
            segments(&[(8, false), (5, true), (1, false)], 10),
            ["v0..10", "v10..14"]
        );
        // A run is as long as it goes, past the rows' limit.
        assert_eq!(
            segments(&[(40, true), (2, false)], 10),
            ["r0..40", "v40..42"]
        );
        assert_eq!(segments(&[(15, true)], 10), ["v0..10", "v10..15"]);
    }

    #[test]
    fn keyed_jobs_go_alone_in_their_place() {
        let (k, n) = (Some("key"), None);
        let jobs = [(n, 2), (n, 2), (k, 2), (k, 2), (n, 2), (k, 2)];
        assert_eq!(shape(&jobs, 100, 1000), ["b2", "k", "k", "b1", "k"]);
        assert!(shape(&[], 100, 1000).is_empty());
    }

    #[test]
    fn a_bulk_piece_keeps_to_its_rows_and_bytes() {
        let five = [(None, 10); 5];
        assert_eq!(shape(&five, 2, 1000), ["b2", "b2", "b1"]);
        assert_eq!(shape(&five, 100, 30), ["b3", "b2"]);
        // A job larger than the bound goes, alone.
        assert_eq!(shape(&[(None, 50), (None, 10)], 100, 30), ["b1", "b1"]);
    }
}
