//! The settler and the recorder against a fake claim: what they promise, without a database.

use std::collections::{HashSet, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use tokio::sync::{mpsc, oneshot, watch};
use tokio::task::JoinHandle;
use tokio::time::Instant;

use super::super::turns::WriteTurns;
use super::batch::{FLUSHES_AT_ONCE, FLUSH_MOST, PILE_UP};
use super::*;

mod follow;
mod gather;
use crate::worker::outage::Health;
use crate::worker::runtime::tally::Tally;

/// A flush's time limit, and a try's: a third of [`LEASE`], as the runtime makes them.
const LIMIT: Duration = Duration::from_secs(10);
const LEASE: Duration = Duration::from_secs(30);

/// What the fake's next statement does (when nothing is scripted: writes every row).
enum Answer {
    /// Writes the rows but these, which it no longer held.
    Lost(Vec<RowId>),
    Fail(Error),
    /// Never answers.
    Hang,
}

/// One statement the fake was asked for.
struct Statement {
    ids: Vec<RowId>,
    outcome: Outcome,
    at: Instant,
}

/// A claim without a database: it answers as scripted and remembers what it was asked.
struct Fake {
    lease: Lease,
    script: Mutex<VecDeque<Answer>>,
    /// Statements wait while this is false.
    open: watch::Sender<bool>,
    statements: Mutex<Vec<Statement>>,
    given_up: Mutex<Vec<RowId>>,
    /// Holds a transaction: an unanswered write gives the whole claim up.
    transaction: bool,
    abandoned: AtomicUsize,
    /// What the row shows when looked at after a lost answer: this claim's outcome or not.
    shows_ours: AtomicBool,
    /// What follows a committed statement waits while this is false.
    following: watch::Sender<bool>,
    /// The rows each follow-up was for, and the rows it was told were lost.
    settled: Mutex<Vec<(Vec<RowId>, Vec<RowId>)>>,
    /// Follow-ups started.
    following_started: AtomicUsize,
    /// Whether anything follows its settles (see [`Settle::follows`]).
    follows: AtomicBool,
}

impl Fake {
    fn new() -> Arc<Fake> {
        Fake::with(false, [])
    }

    fn with(transaction: bool, script: impl IntoIterator<Item = Answer>) -> Arc<Fake> {
        Arc::new(Fake {
            lease: Lease::new(LEASE, Instant::now()),
            script: Mutex::new(script.into_iter().collect()),
            open: watch::Sender::new(true),
            statements: Mutex::default(),
            given_up: Mutex::default(),
            transaction,
            abandoned: AtomicUsize::new(0),
            shows_ours: AtomicBool::new(false),
            following: watch::Sender::new(true),
            settled: Mutex::default(),
            following_started: AtomicUsize::new(0),
            follows: AtomicBool::new(true),
        })
    }

    fn statements(&self) -> Vec<(Vec<RowId>, Outcome)> {
        let s = self.statements.lock().unwrap();
        s.iter()
            .map(|s| (s.ids.clone(), s.outcome.clone()))
            .collect()
    }

    fn sizes(&self) -> Vec<usize> {
        let s = self.statements.lock().unwrap();
        s.iter().map(|s| s.ids.len()).collect()
    }

    fn given_up(&self) -> Vec<RowId> {
        self.given_up.lock().unwrap().clone()
    }
}

impl Settle for Fake {
    fn lease(&self) -> &Lease {
        &self.lease
    }

    async fn settle(&self, ids: &[RowId], outcome: Outcome) -> Result<Vec<RowId>> {
        self.statements.lock().unwrap().push(Statement {
            ids: ids.to_vec(),
            outcome,
            at: Instant::now(),
        });
        let answer = self.script.lock().unwrap().pop_front();
        let _ = self.open.subscribe().wait_for(|open| *open).await;
        match answer {
            None => Ok(vec![]),
            Some(Answer::Lost(lost)) => Ok(lost),
            Some(Answer::Fail(e)) => Err(e),
            Some(Answer::Hang) => std::future::pending().await,
        }
    }

    fn follows(&self, _outcome: &Outcome) -> bool {
        self.follows.load(Ordering::SeqCst)
    }

    async fn settled(&self, ids: &[RowId], lost: &[RowId]) {
        self.following_started.fetch_add(1, Ordering::SeqCst);
        let _ = self.following.subscribe().wait_for(|open| *open).await;
        self.settled
            .lock()
            .unwrap()
            .push((ids.to_vec(), lost.to_vec()));
    }

    fn give_up(&self, ids: &[RowId]) {
        self.given_up.lock().unwrap().extend_from_slice(ids);
    }

    async fn settled_as(&self, _id: &RowId, _outcome: &Outcome) -> bool {
        self.shows_ours.load(Ordering::SeqCst)
    }

    async fn abandon_if_unsure(&self) -> bool {
        if self.transaction {
            self.abandoned.fetch_add(1, Ordering::SeqCst);
            self.lease.abandon();
        }
        self.transaction
    }
}

/// The connection broke: worth another try.
fn broke() -> Error {
    Error::Database(crate::error::DatabaseError::sorted(
        sqlx::Error::PoolTimedOut,
        |_| (None, None),
    ))
}

fn done() -> Outcome {
    Outcome::Done(None)
}

fn id(n: i64) -> RowId {
    RowId::Int(n)
}

/// Sends row `n`'s result straight to the settler; the answer comes on the receiver.
fn send(
    tx: &mpsc::UnboundedSender<Settling<Fake>>,
    target: &Arc<Fake>,
    n: i64,
    outcome: Outcome,
) -> oneshot::Receiver<Flushed> {
    let (reply, answer) = oneshot::channel();
    let settling = Settling {
        target: target.clone(),
        id: id(n),
        outcome,
        reply: Reply::Wait(reply),
    };
    assert!(tx.send(settling).is_ok(), "the settler is gone");
    answer
}

/// A settler with this delay, where writes take no turns, and its channel.
fn start(delay: Duration) -> (mpsc::UnboundedSender<Settling<Fake>>, JoinHandle<()>) {
    let (tx, rx) = mpsc::unbounded_channel();
    (tx, spawn_settler(rx, delay, WriteTurns::default()))
}

/// The settler with this delay and these turns, reading `rx`; results may wait for company.
fn spawn_settler(
    rx: mpsc::UnboundedReceiver<Settling<Fake>>,
    delay: Duration,
    turns: WriteTurns,
) -> JoinHandle<()> {
    spawn_gathering(rx, delay, turns, || true)
}

/// The settler, where `gather` says whether results may wait for company.
fn spawn_gathering(
    rx: mpsc::UnboundedReceiver<Settling<Fake>>,
    delay: Duration,
    turns: WriteTurns,
    gather: fn() -> bool,
) -> JoinHandle<()> {
    tokio::spawn(settler(
        rx,
        delay,
        LIMIT,
        FlushMetrics::noop(),
        turns,
        gather,
    ))
}

/// Lets every task run until it waits (the clock is paused: it moves only when all wait).
async fn settle_down() {
    tokio::time::sleep(Duration::from_millis(1)).await;
}

async fn recorded(answers: Vec<oneshot::Receiver<Flushed>>) {
    for answer in answers {
        let flushed = answer.await.expect("every result is answered");
        assert!(matches!(flushed, Flushed::Recorded), "{flushed:?}");
    }
}

#[tokio::test(start_paused = true)]
async fn results_that_piled_up_make_one_statement_per_claim_and_outcome() {
    let (a, b) = (Fake::new(), Fake::new());
    let (tx, rx) = mpsc::unbounded_channel();
    let failed = Outcome::Failed(Some("no".into()));
    let answers: Vec<_> = (0..30)
        .map(|n| match n % 3 {
            0 => send(&tx, &a, n, done()),
            1 => send(&tx, &a, n, failed.clone()),
            _ => send(&tx, &b, n, done()),
        })
        .collect();
    let settler = spawn_settler(rx, Duration::ZERO, WriteTurns::default());
    recorded(answers).await;
    let of = |n: i64| (0..30).filter(|i| i % 3 == n).map(id).collect::<Vec<_>>();
    assert_eq!(a.statements(), [(of(0), done()), (of(1), failed)]);
    assert_eq!(b.statements(), [(of(2), done())]);
    drop(tx);
    settler
        .await
        .expect("the settler ends once its senders are gone");
}

#[tokio::test(start_paused = true)]
async fn another_flush_starts_only_when_results_pile_up_and_few_run_at_once() {
    let a = Fake::new();
    a.open.send_replace(false);
    let (tx, _settler) = start(Duration::ZERO);
    let mut next = 0;
    let mut answers = Vec::new();
    let mut send_many = |k: usize| {
        for _ in 0..k {
            answers.push(send(&tx, &a, next, done()));
            next += 1;
        }
    };
    send_many(1);
    settle_down().await;
    assert_eq!(a.sizes(), [1]);
    // Results waiting behind a running flush wait for it until there are PILE_UP of them.
    send_many(PILE_UP - 1);
    settle_down().await;
    assert_eq!(a.sizes(), [1]);
    send_many(1);
    settle_down().await;
    assert_eq!(a.sizes(), [1, PILE_UP]);
    for _ in 2..FLUSHES_AT_ONCE + 2 {
        send_many(PILE_UP);
        settle_down().await;
    }
    assert_eq!(a.statements().len(), FLUSHES_AT_ONCE, "never more at once");
    a.open.send_replace(true);
    recorded(answers).await;
    let written: Vec<RowId> = a.statements().into_iter().flat_map(|s| s.0).collect();
    let once: HashSet<&RowId> = written.iter().collect();
    assert_eq!(written.len(), next as usize);
    assert_eq!(once.len(), written.len(), "no row in two flushes");
}

/// SQLite: the claim loop and the settler take turns at the one write lock.
#[tokio::test(start_paused = true)]
async fn where_writes_take_turns_one_statement_writes_at_a_time() {
    let (a, b) = (Fake::new(), Fake::new());
    a.open.send_replace(false);
    b.open.send_replace(false);
    let turns = WriteTurns::new(true);
    let (tx, rx) = mpsc::unbounded_channel();
    let claim = turns.take().await;
    let _settler = spawn_settler(rx, Duration::ZERO, turns.clone());
    let mut answers = vec![send(&tx, &a, 0, done()), send(&tx, &b, 1, done())];
    settle_down().await;
    let started = || a.sizes().len() + b.sizes().len();
    assert_eq!(started(), 0, "the flush waits while a claim has the turn");
    drop(claim);
    settle_down().await;
    assert_eq!(started(), 1, "one claim's statement at a time");
    // Results that pile up start no second flush: it could only wait for the lock.
    answers.extend((2..2 + PILE_UP as i64).map(|n| send(&tx, &a, n, done())));
    settle_down().await;
    assert_eq!(started(), 1);
    a.open.send_replace(true);
    b.open.send_replace(true);
    recorded(answers).await;
    assert_eq!(a.sizes().iter().sum::<usize>(), PILE_UP + 1);
    assert_eq!(b.sizes(), [1]);
}

#[tokio::test(start_paused = true)]
async fn a_flush_writes_at_most_flush_most_rows() {
    let a = Fake::new();
    a.open.send_replace(false);
    let (tx, rx) = mpsc::unbounded_channel();
    let total = 2 * FLUSH_MOST + 10;
    let answers: Vec<_> = (0..total as i64)
        .map(|n| send(&tx, &a, n, done()))
        .collect();
    let _settler = spawn_settler(rx, Duration::ZERO, WriteTurns::default());
    settle_down().await;
    // The rest is fewer than PILE_UP: it waits for a running flush.
    assert_eq!(a.sizes(), [FLUSH_MOST, FLUSH_MOST]);
    a.open.send_replace(true);
    recorded(answers).await;
    assert_eq!(a.sizes(), [FLUSH_MOST, FLUSH_MOST, 10]);
}

#[tokio::test(start_paused = true)]
async fn rows_the_claim_no_longer_held_are_answered_lost() {
    let a = Fake::with(false, [Answer::Lost(vec![id(1)])]);
    let (tx, rx) = mpsc::unbounded_channel();
    let answers: Vec<_> = (0..3).map(|n| send(&tx, &a, n, done())).collect();
    let _settler = spawn_settler(rx, Duration::ZERO, WriteTurns::default());
    let mut flushed = Vec::new();
    for answer in answers {
        flushed.push(answer.await.expect("answered"));
    }
    assert!(matches!(
        flushed[..],
        [Flushed::Recorded, Flushed::Lost, Flushed::Recorded]
    ));
}

#[tokio::test(start_paused = true)]
async fn a_failed_or_unanswered_statement_answers_its_own_rows_only() {
    let (hung, failing, fine) = (
        Fake::with(false, [Answer::Hang]),
        Fake::with(false, [Answer::Fail(broke())]),
        Fake::new(),
    );
    let (tx, rx) = mpsc::unbounded_channel();
    let answers = [
        send(&tx, &hung, 0, done()),
        send(&tx, &failing, 1, done()),
        send(&tx, &fine, 2, done()),
    ];
    let _settler = spawn_settler(rx, Duration::ZERO, WriteTurns::default());
    let [hung_answer, failed_answer, fine_answer] = answers;
    let started = Instant::now();
    assert!(matches!(fine_answer.await, Ok(Flushed::Recorded)));
    assert!(matches!(failed_answer.await, Ok(Flushed::Failed(e)) if e.is_connection()));
    assert!(matches!(hung_answer.await, Ok(Flushed::TimedOut)));
    assert!(
        started.elapsed() >= LIMIT,
        "a statement is given its time limit"
    );
}

/// A worker's recording side around a running settler.
struct World {
    tally: Tally,
    health: Health,
    hurry: AtomicBool,
    tx: mpsc::UnboundedSender<Settling<Fake>>,
    _settler: JoinHandle<()>,
}

impl World {
    fn new() -> World {
        let (tx, settler) = start(Duration::ZERO);
        World {
            tally: Tally::detached(),
            health: Health::new("fake", false, metrics::Counter::noop()),
            hurry: AtomicBool::new(false),
            tx,
            _settler: settler,
        }
    }

    fn recorder(&self, renews: bool) -> Recorder<'_, Fake> {
        Recorder {
            settles: &self.tx,
            tally: &self.tally,
            health: &self.health,
            hurry: &self.hurry,
            renews,
            attempt_most: LIMIT,
        }
    }

    async fn record(&self, renews: bool, target: &Arc<Fake>) {
        let counter = &self.tally.completed;
        self.recorder(renews)
            .record(target, &id(7), done(), counter)
            .await;
    }

    /// completed, lost, given up, unconfirmed.
    fn counts(&self) -> [u64; 4] {
        let t = &self.tally;
        [&t.completed, &t.lost, &t.given_up, &t.unconfirmed].map(|c| c.get())
    }
}

#[tokio::test(start_paused = true)]
async fn a_result_is_retried_while_the_database_fails_and_counted_once() {
    let w = World::new();
    let a = Fake::with(false, (0..3).map(|_| Answer::Fail(broke())));
    w.record(true, &a).await;
    assert_eq!(w.counts(), [1, 0, 0, 0]);
    assert_eq!(a.statements().len(), 4);
    assert!(a.given_up().is_empty());
}

/// The runtime's path: a first try sent with a callback and no recorder waiting; its failed
/// answer goes to `record_after`, which tries again and counts the result once.
#[tokio::test(start_paused = true)]
async fn a_first_try_that_failed_goes_on_in_a_recorder_and_counts_once() {
    let w = World::new();
    let a = Fake::with(false, (0..2).map(|_| Answer::Fail(broke())));
    let (heard, first) = oneshot::channel();
    let settling = Settling {
        target: a.clone(),
        id: id(7),
        outcome: done(),
        reply: Reply::Then(Box::new(move |flushed| {
            let _ = heard.send(flushed);
        })),
    };
    assert!(w.tx.send(settling).is_ok(), "the settler is gone");
    let first = first.await.expect("the settler calls back");
    assert!(matches!(first, Flushed::Failed(_)), "{first:?}");
    assert_eq!(
        w.counts(),
        [0, 0, 0, 0],
        "nothing counted before it is recorded"
    );
    w.recorder(true)
        .record_after(&a, &id(7), done(), &w.tally.completed, first)
        .await;
    assert_eq!(w.counts(), [1, 0, 0, 0]);
    assert_eq!(a.statements().len(), 3, "the first try and two more");
}

#[tokio::test(start_paused = true)]
async fn a_result_not_recorded_before_its_lease_would_end_is_given_up() {
    let w = World::new();
    let a = Fake::with(false, (0..1000).map(|_| Answer::Fail(broke())));
    w.record(true, &a).await;
    assert_eq!(w.counts(), [0, 0, 1, 0]);
    assert_eq!(a.given_up(), [id(7)]);
    let tries = a.statements.lock().unwrap();
    assert!(tries.len() > 1, "retried before giving up");
    assert!(
        tries.iter().all(|t| t.at < a.lease.end()),
        "no try once the lease may have ended"
    );
}

#[tokio::test(start_paused = true)]
async fn a_result_whose_lease_ended_is_not_sent() {
    let w = World::new();
    let a = Fake::new();
    tokio::time::advance(LEASE).await;
    w.record(true, &a).await;
    settle_down().await;
    assert_eq!(w.counts(), [0, 0, 1, 0]);
    assert!(a.statements().is_empty());
    assert_eq!(a.given_up(), [id(7)]);
}

#[tokio::test(start_paused = true)]
async fn without_a_lease_a_result_is_retried_past_any_lease_end() {
    let w = World::new();
    let a = Fake::with(false, (0..15).map(|_| Answer::Fail(broke())));
    w.record(false, &a).await;
    assert_eq!(w.counts(), [1, 0, 0, 0]);
    let last = a.statements.lock().unwrap().last().map(|t| t.at);
    assert!(last.is_some_and(|at| at > a.lease.end()));
}

#[tokio::test(start_paused = true)]
async fn hurrying_a_result_gets_one_try() {
    let w = World::new();
    w.hurry.store(true, Ordering::SeqCst);
    let a = Fake::with(false, [Answer::Fail(broke())]);
    w.record(true, &a).await;
    assert_eq!(w.counts(), [0, 0, 1, 0]);
    assert_eq!(a.statements().len(), 1);
    assert_eq!(a.given_up(), [id(7)]);
}

#[tokio::test(start_paused = true)]
async fn a_refused_result_counts_as_lost_or_given_up_when_the_claim_was_let_go() {
    let w = World::new();
    let a = Fake::with(false, [Answer::Lost(vec![id(7)])]);
    w.record(true, &a).await;
    assert_eq!(w.counts(), [0, 1, 0, 0]);
    let b = Fake::with(false, [Answer::Lost(vec![id(7)])]);
    b.lease.abandon();
    w.record(true, &b).await;
    assert_eq!(w.counts(), [0, 1, 1, 0]);
    assert!(a.given_up().is_empty() && b.given_up().is_empty());
}

#[tokio::test(start_paused = true)]
async fn a_refusal_after_an_unanswered_try_counts_as_unconfirmed() {
    let w = World::new();
    let a = Fake::with(false, [Answer::Hang, Answer::Lost(vec![id(7)])]);
    w.record(true, &a).await;
    assert_eq!(w.counts(), [0, 0, 0, 1]);
    let unknown = Error::OutcomeUnknown {
        what: "a settle".into(),
        source: crate::error::DatabaseError::sorted(sqlx::Error::PoolTimedOut, |_| (None, None)),
    };
    let b = Fake::with(false, [Answer::Fail(unknown), Answer::Lost(vec![id(7)])]);
    w.record(true, &b).await;
    assert_eq!(w.counts(), [0, 0, 0, 2]);
    // A refusal after a try that surely failed proves the row was lost.
    let c = Fake::with(false, [Answer::Fail(broke()), Answer::Lost(vec![id(7)])]);
    w.record(true, &c).await;
    assert_eq!(w.counts(), [0, 1, 0, 2]);
}

#[tokio::test(start_paused = true)]
async fn a_refusal_after_an_unanswered_try_of_a_row_showing_our_result_counts_it_recorded() {
    let w = World::new();
    let a = Fake::with(false, [Answer::Hang, Answer::Lost(vec![id(7)])]);
    a.shows_ours.store(true, Ordering::SeqCst);
    w.record(true, &a).await;
    assert_eq!(w.counts(), [1, 0, 0, 0]);
    // Looked at only after an unanswered try: a plain refusal is a lost row.
    let b = Fake::with(false, [Answer::Lost(vec![id(7)])]);
    b.shows_ours.store(true, Ordering::SeqCst);
    w.record(true, &b).await;
    assert_eq!(w.counts(), [1, 1, 0, 0]);
}

#[tokio::test(start_paused = true)]
async fn an_error_that_is_not_an_outage_gives_the_row_up_at_once() {
    let w = World::new();
    let a = Fake::with(false, [Answer::Fail(Error::InvalidInput("no".into()))]);
    w.record(true, &a).await;
    assert_eq!(w.counts(), [0, 0, 1, 0]);
    assert_eq!(a.statements().len(), 1);
    assert_eq!(a.given_up(), [id(7)]);
}

#[tokio::test(start_paused = true)]
async fn an_unanswered_write_gives_a_claim_holding_a_transaction_up_whole() {
    let w = World::new();
    let a = Fake::with(true, [Answer::Hang]);
    w.record(true, &a).await;
    assert_eq!(w.counts(), [0, 0, 1, 0]);
    assert_eq!(a.statements().len(), 1);
    assert_eq!(a.abandoned.load(Ordering::SeqCst), 1);
    // Other claims try again after a write that went unanswered.
    let b = Fake::with(false, [Answer::Hang]);
    w.record(true, &b).await;
    assert_eq!(w.counts(), [1, 0, 1, 0]);
    assert_eq!(
        (b.statements().len(), b.abandoned.load(Ordering::SeqCst)),
        (2, 0)
    );
}
