//! The managed queue's claim and settle SQL as snapshots (`insta`), built by the statement
//! builders alone: no database server is involved (as `claim/snapshots.rs` does for a user's
//! own table; schedule SQL has its own in `schedule/snapshots.rs`). For each database, with the
//! strategy `auto` gives the queue there: a plain claim of one queue, a claim of several queues
//! and kinds, a claim resumed after a place in the order ([`Position`]), the limited claim
//! (each of its statements, with both ways of picking jobs), and a job's settles (done with
//! output, retried, dead, snoozed, given back unstarted, done and deleted). `cargo insta
//! review` accepts a change.

use std::time::Duration;

use crate::backend::sql::{naming, Dialect, Stmt};
use crate::backend::{ClaimArgs, Outcome, Target};
use crate::claim::snapshots::{claim_args, column, show, Builders};
use crate::claim::Layer;
use crate::mapping::{ColType, Column, Mapping};
use crate::queue::{QueueLimits, Rate};
use crate::strategy::Strategy;
use crate::value::IdList;

use super::claim::{source, Jobs, Position};
use super::limits;
use super::migrate::Schema;

/// `rowclaim_jobs` as its migrations leave it, in dialect `D` (payload as `payload_type`).
fn columns<D: Dialect>(payload_type: &str) -> Vec<Column> {
    let text = || ColType::Text { max_len: None };
    let time = |name: &str| column(name, D::LEASE_TYPE, D::LEASE_COLUMN);
    vec![
        column("id", "bigint", ColType::Int),
        column("queue", "text", text()),
        column("kind", "text", text()),
        column("payload", payload_type, text()),
        column("status", "text", text()),
        column("priority", "integer", ColType::Int),
        time("run_at"),
        column("attempts", "integer", ColType::Int),
        column("max_attempts", "integer", ColType::Int),
        column("owner", "text", text()),
        time("lease_until"),
        column("unique_key", "text", text()),
        column("last_error", "text", text()),
        time("created_at"),
        time("finished_at"),
        column("timeout_ms", "bigint", ColType::Int),
        column("output", payload_type, text()),
        column("limit_key", "text", text()),
        time("attempted_at"),
    ]
}

/// The mapping a claimer of jobs of `queues` and `kinds` works with, in dialect `D`.
fn jobs<D: Dialect>(payload_type: &str, queues: &[&str], kinds: &[&str], delete: bool) -> Mapping {
    let naming = naming::<D>();
    let mut m = match source().check(&naming, &columns::<D>(payload_type), "rowclaim_jobs".into()) {
        Ok(m) => m,
        Err(e) => panic!("the managed queue's source does not check: {e}"),
    };
    let layer = Jobs {
        queues: queues.iter().map(|q| q.to_string()).collect(),
        kinds: kinds.iter().map(|k| k.to_string()).collect(),
        delete_done: delete,
    };
    m.lifecycle = Some(layer.lifecycle(&m, &naming));
    m
}

/// A claim's request for two jobs of `m`, looking at expired leases too.
fn args<'a>(
    m: &'a Mapping,
    strategy: Strategy,
    arms: Option<&'a [crate::mapping::Fragment]>,
) -> ClaimArgs<'a> {
    ClaimArgs {
        arms,
        ..claim_args(m, strategy)
    }
}

/// The ordinary claims: of one queue, of several queues and kinds, resumed after a place.
fn claims<B: Builders>(payload_type: &str, strategy: Strategy) -> String {
    let one = jobs::<B::D>(payload_type, &["default"], &[], false);
    let many = jobs::<B::D>(payload_type, &["mail", "sms"], &["send", "bounce"], false);
    let place = Position {
        priority: 5,
        run_at_us: 1_767_225_600_000_000,
        id: 42,
    };
    let arms = place.arms();
    let mut text = format!(
        "-- claim of queue default\n{}",
        show(B::claim(&args(&one, strategy, None)))
    );
    text.push_str(&format!(
        "\n\n-- claim of queues mail and sms, kinds send and bounce\n{}",
        show(B::claim(&args(&many, strategy, None)))
    ));
    text.push_str(&format!(
        "\n\n-- claim of queue default resumed after priority 5, 2026-01-01, id 42\n{}",
        show(B::claim(&args(&one, strategy, Some(&arms))))
    ));
    text
}

/// The limited claim of queue `mail` (kinds `send`), statement by statement, picking under
/// per-key limits of one (each job on its own, through indexes) and of more than one (lines
/// numbered).
fn limited<D: Schema>(payload_type: &str, strategy: Strategy) -> String {
    let m = jobs::<D>(payload_type, &[], &[], false);
    let a = claim_args(&m, strategy);
    let kinds = vec!["send".to_owned()];
    let ids = IdList::Int(vec![7, 9]);
    let first_only = QueueLimits::default()
        .concurrency(10)
        .key_concurrency(1)
        .key_rate(Rate::new(1, Duration::from_secs(60)));
    let one_per_key = QueueLimits::default().key_concurrency(1);
    let two_per_key = QueueLimits::default().key_concurrency(2);
    let lines = QueueLimits::default()
        .key_concurrency(3)
        .rate(Rate::new(100, Duration::from_secs(1)))
        .key_rate(Rate::new(5, Duration::from_secs(60)));
    let mut steps: Vec<(&str, Stmt<D>)> = vec![
        ("the queue's turn", limits::turn_sql("mail", false)),
        ("its limits and counts", limits::read_sql("mail")),
        (
            "pick: key concurrency 1, key rate 1 per minute",
            limits::pick_ids_sql("mail", &kinds, &first_only, 2, true),
        ),
        (
            "pick: one at a time per key",
            limits::pick_ids_sql("mail", &kinds, &one_per_key, 2, true),
        ),
        (
            "pick: key concurrency 2",
            limits::pick_ids_sql("mail", &kinds, &two_per_key, 2, true),
        ),
        (
            "pick: key concurrency 3, key rate 5 per minute",
            limits::pick_ids_sql("mail", &kinds, &lines, 2, true),
        ),
        ("mark jobs 7 and 9 ours", limits::mark_sql(&a, &ids)),
        ("record their starts", limits::starts_sql(&a, &ids)),
        (
            "forget old starts",
            limits::prune_starts_sql("mail", 60_000),
        ),
        ("the jobs claimed", limits::claimed_sql(&a, &ids)),
    ];
    if D::SKIP_SCAN {
        let heads = limits::heads_sql("mail", &kinds, &first_only, 2, true);
        steps.insert(
            3,
            (
                "the first of lines further back: key concurrency 1, key rate 1 per minute",
                heads,
            ),
        );
        steps.insert(3, ("whether more wait behind", limits::waiting_sql("mail")));
        let fronts = limits::heads_sql("mail", &kinds, &two_per_key, 2, false);
        steps.insert(
            6,
            (
                "the first two of lines further back, keyed jobs only",
                fronts,
            ),
        );
        steps.insert(
            7,
            (
                "pick with few keys (the fronts read first): jobs whose lease ran out",
                limits::pick_ids_sql("mail", &kinds, &two_per_key, 2, false),
            ),
        );
        steps.insert(
            8,
            (
                "jobs without a key, where every front was busy",
                limits::keyless_sql("mail", &kinds, 2),
            ),
        );
        steps.insert(
            9,
            (
                "runs of idle lines, for the worker to run one after another: key \
                 concurrency 1, up to 50 jobs a line",
                limits::runs_sql("mail", &kinds, 1, 50, 200, true, &[]),
            ),
        );
        steps.insert(
            10,
            (
                "runs of lines, where the worker runs its own claims' lines whole: a key whose \
                 running jobs are all held under those tokens counts as idle",
                limits::runs_sql(
                    "mail",
                    &kinds,
                    1,
                    50,
                    200,
                    false,
                    &["0193a1b2-0000-7000-8000-00000000002a".to_owned()],
                ),
            ),
        );
        steps.push((
            "mark jobs 7 and 9 ours, returning their rows (a claim that took runs)",
            limits::mark_returning_sql(&a, &ids),
        ));
        steps.push((
            "the first of lines further back: one at a time per key",
            limits::heads_sql("mail", &kinds, &one_per_key, 2, true),
        ));
    }
    if let Some(setup) = D::LIMITED_CLAIM_SETUP {
        let setup = Stmt::new(setup.to_owned(), crate::backend::sql::Binder::new());
        steps.insert(0, ("the transaction's setting", setup));
    }
    steps
        .into_iter()
        .map(|(what, s)| format!("-- {what}\n{}", show([s])))
        .collect::<Vec<_>>()
        .join("\n\n")
}

/// A job's settles by token: each outcome the runtime records, for job 7.
fn settles<B: Builders>(payload_type: &str, strategy: Strategy) -> String {
    let kept = jobs::<B::D>(payload_type, &["default"], &[], false);
    let deleted = jobs::<B::D>(payload_type, &["default"], &[], true);
    let boom = || Some("boom".to_owned());
    let cases = [
        (
            "done with output",
            &kept,
            Outcome::Done(Some(r#"{"sent":true}"#.to_owned())),
        ),
        (
            "done, completed jobs deleted",
            &deleted,
            Outcome::Done(None),
        ),
        (
            "retried in 30s",
            &kept,
            Outcome::Retry {
                after: Duration::from_secs(30),
                error: boom(),
            },
        ),
        ("dead", &kept, Outcome::Failed(boom())),
        (
            "snoozed for 5s",
            &kept,
            Outcome::Snooze {
                after: Duration::from_secs(5),
            },
        ),
        ("given back unstarted", &kept, Outcome::Unstarted),
    ];
    let ids = IdList::Int(vec![7]);
    cases
        .into_iter()
        .map(|(what, m, outcome)| {
            let sent = match B::settle(m, strategy, &Target::Ids(&ids, 1), &outcome) {
                Ok(s) => show(s),
                Err(e) => format!("-- refused: {e}"),
            };
            format!("-- {what}\n{sent}")
        })
        .collect::<Vec<_>>()
        .join("\n\n")
}

fn snapshot_dialect<B: Builders>(dialect: &str, payload_type: &str, strategy: Strategy)
where
    B::D: Schema,
{
    let server = B::server();
    let m = jobs::<B::D>(payload_type, &[], &[], false);
    assert_eq!(
        Strategy::Auto.resolve(&server, &m).ok(),
        Some(strategy),
        "the snapshots show the strategy auto gives the queue on {dialect}"
    );
    insta::assert_snapshot!(
        format!("{dialect}__claim"),
        claims::<B>(payload_type, strategy)
    );
    insta::assert_snapshot!(
        format!("{dialect}__limited_claim"),
        limited::<B::D>(payload_type, strategy)
    );
    insta::assert_snapshot!(
        format!("{dialect}__settle"),
        settles::<B>(payload_type, strategy)
    );
}

#[cfg(feature = "postgres")]
#[test]
fn postgres_queue_sql() {
    snapshot_dialect::<crate::claim::snapshots::Postgres>(
        "postgres",
        "jsonb",
        Strategy::SkipLocked,
    );
}

#[cfg(feature = "mysql")]
#[test]
fn mysql_queue_sql() {
    snapshot_dialect::<crate::claim::snapshots::MySql>("mysql", "longtext", Strategy::SkipLocked);
}

#[cfg(feature = "sqlite")]
#[test]
fn sqlite_queue_sql() {
    snapshot_dialect::<crate::claim::snapshots::Sqlite>("sqlite", "text", Strategy::Token);
}
