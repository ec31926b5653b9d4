//! When results wait for company before a flush: a settle delay, [`FLUSH_EVERY`] while they
//! come one by one, and never where a result written frees room for the next claim.

use super::super::batch::{COMPANY, FLUSH_EVERY};
use super::*;

#[tokio::test(start_paused = true)]
async fn a_delay_gathers_results_that_come_one_by_one() {
    let a = Fake::new();
    let (tx, _settler) = start(Duration::from_millis(50));
    let mut answers = vec![send(&tx, &a, 0, done())];
    for n in 1..6 {
        tokio::time::sleep(Duration::from_millis(5)).await;
        answers.push(send(&tx, &a, n, done()));
    }
    recorded(answers).await;
    assert_eq!(a.sizes(), [6]);
}

#[tokio::test(start_paused = true)]
async fn without_a_delay_results_coming_one_by_one_are_written_every_flush_every() {
    let a = Fake::new();
    let (tx, _settler) = start(Duration::ZERO);
    let mut answers = vec![send(&tx, &a, 0, done())];
    settle_down().await;
    assert_eq!(a.sizes(), [1], "the first result is written at once");
    // One a millisecond: they wait until FLUSH_EVERY has passed since that flush started.
    for n in 1..4 {
        answers.push(send(&tx, &a, n, done()));
        settle_down().await;
    }
    assert!(Duration::from_millis(4) < FLUSH_EVERY);
    assert_eq!(
        a.sizes(),
        [1],
        "written with the next flush, not one by one"
    );
    recorded(answers).await;
    assert_eq!(a.sizes(), [1, 3]);
    // After a quiet spell a result is written at once again.
    tokio::time::sleep(2 * FLUSH_EVERY).await;
    let last = send(&tx, &a, 9, done());
    settle_down().await;
    assert_eq!(a.sizes(), [1, 3, 1]);
    // COMPANY results waiting go at once: where results come fast nothing waits.
    let mut answers = vec![last];
    answers.extend((10..10 + COMPANY as i64).map(|n| send(&tx, &a, n, done())));
    settle_down().await;
    assert_eq!(a.sizes(), [1, 3, 1, COMPANY]);
    recorded(answers).await;
}

/// Under limits that count running jobs a result written frees room for the next claim: no
/// result waits for company.
#[tokio::test(start_paused = true)]
async fn where_results_free_room_for_claims_none_waits() {
    let a = Fake::new();
    let (tx, rx) = mpsc::unbounded_channel();
    let _settler = spawn_gathering(rx, Duration::ZERO, WriteTurns::default(), || false);
    let mut answers = Vec::new();
    for n in 0..4 {
        answers.push(send(&tx, &a, n, done()));
        settle_down().await;
    }
    assert_eq!(a.sizes(), [1, 1, 1, 1]);
    recorded(answers).await;
}
