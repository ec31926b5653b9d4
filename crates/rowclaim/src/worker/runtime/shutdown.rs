//! Shutdown, once the claim loop ended: claims under way finish so that their rows go back now;
//! rows not started go back at once; running jobs get the grace period (none when stopping now,
//! or after an error), then are stopped, and their supervisors give their rows back. Being told
//! to stop now ([`Phase::Now`]) cuts every wait short.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use futures_util::stream::{FuturesUnordered, StreamExt};
use tokio::sync::watch;
use tokio::task::JoinSet;

use super::dispatch::Local;
use super::held::Held;
use super::producer::Claiming;
use super::{Phase, Shared};
use crate::claim::{Claim, ClaimedRow};
use crate::id::RowId;
use crate::worker::handler::StopReason;

/// Shuts the worker down after its claim loop ended (`ok`: without an error). Returns whether
/// it was told to stop now.
pub(super) async fn shutdown(
    sh: &Arc<Shared>,
    mut local: Local,
    under_way: Vec<Claiming>,
    phase: &watch::Receiver<Phase>,
    ok: bool,
) -> bool {
    // Running jobs go on meanwhile: the claim loop's task, which drove them, is this one.
    // Claims under way finish, so that their rows go back now rather than at lease end; also
    // after an error, which another claim beside them may have ended the loop with.
    if !under_way.is_empty() && !stopping_now(phase) {
        let (got, ended) = local.jobs.beside(answers(under_way, phase)).await;
        local.ended(sh, ended);
        for claim in got {
            // Their rows all go back below (as if started before every break, those of lines
            // that broke go back here already).
            local.hold(sh, claim, 0, None);
        }
    }
    let waiting = local.waiting.take_all();
    let give_back = async {
        tokio::select! {
            () = release_waiting(sh, waiting) => {}
            () = now(phase) => {}
        }
    };
    let ((), ended) = local.jobs.beside(give_back).await;
    local.ended(sh, ended);
    if !stopping_now(phase) && ok && !sh.aborted() {
        drain(sh, &mut local, phase).await;
    }
    let interrupted = stopping_now(phase);
    sh.hurry.store(interrupted || !ok, Ordering::SeqCst);
    sh.closing.store(true, Ordering::SeqCst);
    for held in &local.helds {
        held.stop_all(StopReason::Shutdown);
    }
    wait_for_supervisors(sh, local).await;
    interrupted
}

/// The claims of `under_way` that answered with rows, each kept as it answers, until all have
/// answered or the worker is told to stop now.
async fn answers(under_way: Vec<Claiming>, phase: &watch::Receiver<Phase>) -> Vec<Claim> {
    let mut claims: FuturesUnordered<Claiming> = under_way.into_iter().collect();
    let mut got = Vec::new();
    loop {
        tokio::select! {
            answer = claims.next() => match answer {
                Some(Some(Ok(claim))) => got.push(claim),
                Some(_) => {}
                None => return got,
            },
            () = now(phase) => return got,
        }
    }
}

fn stopping_now(phase: &watch::Receiver<Phase>) -> bool {
    *phase.borrow() == Phase::Now
}

/// Resolves once the worker is told to stop now (at once if it was).
async fn now(phase: &watch::Receiver<Phase>) {
    let mut phase = phase.clone();
    // The switch outlives this function (the caller holds it), so this only ends on Now.
    if phase.wait_for(|p| *p == Phase::Now).await.is_err() {
        std::future::pending::<()>().await;
    }
}

/// The grace period: running jobs may end and their results be recorded, until it is over or
/// the worker is told to stop now.
async fn drain(sh: &Arc<Shared>, local: &mut Local, phase: &watch::Receiver<Phase>) {
    let grace = tokio::time::sleep(sh.cfg.grace);
    let now = now(phase);
    tokio::pin!(grace, now);
    loop {
        tokio::select! {
            ended = local.jobs.next() => match ended {
                Some(ended) => local.job_ended(sh, ended),
                None => break,
            },
            () = &mut grace => break,
            () = &mut now => break,
        }
    }
}

/// Supervisors end soon after a stop: the handler's wind-down, then giving the row back, and its
/// result is recorded. Past that, whatever is left comes back through its lease.
async fn wait_for_supervisors(sh: &Arc<Shared>, mut local: Local) {
    let wind_down = sh.handler.stop_grace() + Duration::from_secs(10);
    let _ = tokio::time::timeout(wind_down, async {
        while let Some(ended) = local.jobs.next().await {
            local.job_ended(sh, ended);
        }
        sh.results.all_through().await;
    })
    .await;
    local.jobs.stop_all();
    sh.results.abandon();
    local.beats.abort_all();
}

/// Gives back rows that never started, one statement per claim, all claims at once. One try
/// each, within a few seconds: at shutdown there is no time to wait out an outage; rows not
/// given back come back through their lease.
async fn release_waiting(sh: &Shared, waiting: Vec<(Arc<Held>, ClaimedRow)>) {
    let mut by_claim: Vec<(Arc<Held>, Vec<RowId>)> = Vec::new();
    for (held, row) in waiting {
        match by_claim.iter_mut().find(|(h, _)| Arc::ptr_eq(h, &held)) {
            Some((_, ids)) => ids.push(row.id),
            None => by_claim.push((held, vec![row.id])),
        }
    }
    let mut releases = JoinSet::new();
    for (held, ids) in by_claim {
        releases.spawn(async move {
            let limit = Duration::from_secs(5);
            let result = tokio::time::timeout(limit, held.claim.release_rows(&ids)).await;
            (held, ids, result)
        });
    }
    while let Some(Ok((held, ids, result))) = releases.join_next().await {
        match result {
            Ok(Ok(lost)) => {
                let released = ids.len() - lost.len();
                sh.tally.released.add(released as u64);
                sh.tally.lost(&lost);
            }
            failed => {
                if let Ok(Err(e)) = failed {
                    tracing::warn!(
                        "giving back {} unstarted row(s): {e}; they come back when their lease \
                         ends",
                        ids.len()
                    );
                }
                held.give_up(&ids);
                sh.tally.gave_up(&ids);
            }
        }
    }
}
