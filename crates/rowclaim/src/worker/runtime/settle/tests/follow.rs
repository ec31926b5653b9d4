//! What follows a committed statement (the managed queue's look for waiting jobs): beside the
//! next flush, one at a time, and before its rows are answered.

use super::*;

#[tokio::test(start_paused = true)]
async fn what_follows_a_statement_runs_beside_the_next_flush_and_answers_its_rows_after() {
    let a = Fake::with(false, [Answer::Lost(vec![id(1)])]);
    a.following.send_replace(false);
    let (tx, rx) = mpsc::unbounded_channel();
    // Nothing waits for company: each result makes a flush of its own once none runs.
    let settler = spawn_gathering(rx, Duration::ZERO, WriteTurns::default(), || false);
    let mut first = vec![send(&tx, &a, 0, done()), send(&tx, &a, 1, done())];
    settle_down().await;
    assert_eq!(a.sizes(), [2]);
    let mut second = send(&tx, &a, 2, done());
    settle_down().await;
    assert_eq!(
        a.sizes(),
        [2, 1],
        "the next flush does not wait for what follows the one before"
    );
    for answer in &mut first {
        assert!(
            answer.try_recv().is_err(),
            "a row is answered only once what follows its statement is done"
        );
    }
    assert!(second.try_recv().is_err());
    assert_eq!(
        a.following_started.load(Ordering::SeqCst),
        1,
        "one follow-up at a time: the second waits for the first"
    );
    drop(tx);
    settle_down().await;
    assert!(!settler.is_finished(), "the settler waits for what follows");
    a.following.send_replace(true);
    let first: Vec<Flushed> = futures_util::future::join_all(first)
        .await
        .into_iter()
        .map(|a| a.expect("answered"))
        .collect();
    assert!(matches!(first[..], [Flushed::Recorded, Flushed::Lost]));
    recorded(vec![second]).await;
    settler.await.expect("the settler ends after what follows");
    let mut settled = a.settled.lock().unwrap().clone();
    settled.sort();
    assert_eq!(
        settled,
        [(vec![id(0), id(1)], vec![id(1)]), (vec![id(2)], vec![])],
        "each committed statement is followed once, told which rows it lost"
    );
}

#[tokio::test(start_paused = true)]
async fn a_statement_that_failed_answers_at_once_and_nothing_follows_it() {
    let a = Fake::with(false, [Answer::Fail(broke())]);
    a.following.send_replace(false);
    let (tx, _settler) = start(Duration::ZERO);
    let answer = send(&tx, &a, 0, done()).await.expect("answered");
    assert!(matches!(answer, Flushed::Failed(_)), "{answer:?}");
    assert_eq!(a.following_started.load(Ordering::SeqCst), 0);
}

#[tokio::test(start_paused = true)]
async fn where_nothing_follows_or_every_row_was_lost_the_rows_are_answered_at_once() {
    let (nothing, all_lost) = (Fake::new(), Fake::with(false, [Answer::Lost(vec![id(1)])]));
    nothing.follows.store(false, Ordering::SeqCst);
    for fake in [&nothing, &all_lost] {
        fake.following.send_replace(false);
    }
    let (tx, _settler) = start(Duration::ZERO);
    let answer = send(&tx, &nothing, 0, done()).await.expect("answered");
    assert!(matches!(answer, Flushed::Recorded), "{answer:?}");
    let answer = send(&tx, &all_lost, 1, done()).await.expect("answered");
    assert!(matches!(answer, Flushed::Lost), "{answer:?}");
    for fake in [&nothing, &all_lost] {
        assert_eq!(fake.following_started.load(Ordering::SeqCst), 0);
    }
}

/// A look still running when the flush's time limit has passed since its statement started is
/// cut off, and its rows are answered: a recorder waits that long for an answer. One queued
/// behind it counts from its own statement's start too, not from its turn.
#[tokio::test(start_paused = true)]
async fn what_follows_ends_within_the_limit_of_its_statement_start() {
    let a = Fake::new();
    a.following.send_replace(false);
    let (tx, rx) = mpsc::unbounded_channel();
    let _settler = spawn_gathering(rx, Duration::ZERO, WriteTurns::default(), || false);
    let answered_in_time = |answer: oneshot::Receiver<Flushed>| async move {
        let sent = Instant::now();
        let answer = answer.await.expect("answered");
        assert!(matches!(answer, Flushed::Recorded), "{answer:?}");
        assert!(
            sent.elapsed() <= LIMIT + Duration::from_millis(10),
            "answered {:?} after it was sent",
            sent.elapsed()
        );
    };
    let first = tokio::spawn(answered_in_time(send(&tx, &a, 0, done())));
    tokio::time::sleep(LIMIT / 2).await;
    let second = answered_in_time(send(&tx, &a, 1, done()));
    settle_down().await;
    assert_eq!(a.sizes(), [1, 1], "two flushes, the second's look queued");
    second.await;
    first.await.expect("the first in time");
    assert!(a.settled.lock().unwrap().is_empty(), "both cut off");
}
