//! The heartbeat: renews one claim's lease every third of it while the claim has open rows,
//! stops the jobs of rows it finds lost, and gives the whole claim up when renewals keep failing
//! until the lease may soon end.

use std::sync::Arc;

use tokio::time::Instant;

use super::held::Held;
use super::Shared;
use crate::metrics::secs;
use crate::worker::handler::StopReason;
use crate::worker::outage::pause;

/// Renews one claim's lease every third of it until every row is settled or given up. A row it
/// finds lost is stopped; when renewals keep failing until the lease may soon end, every row of
/// the claim is given up and its running jobs stopped, early enough for the handler to stop
/// before the lease ends (a quarter of the lease at most).
pub(super) async fn heartbeat(sh: Arc<Shared>, held: Arc<Held>) {
    let every = held.lease.length() / 3;
    let early = sh.handler.stop_grace().min(held.lease.length() / 4);
    let mut failures = 0u32;
    loop {
        let next = if failures == 0 {
            held.lease.confirmed() + every
        } else {
            Instant::now() + pause(failures - 1)
        };
        let give_up_at = held.lease.end() - early;
        tokio::select! {
            () = tokio::time::sleep_until(next.min(give_up_at)) => {}
            () = held.claim.all_settled() => {}
        }
        held.stop_forgotten();
        if held.claim.open_count() == 0 {
            return;
        }
        if failures > 0 && Instant::now() >= give_up_at {
            // From now on another worker may soon hold these rows: stop their jobs, give them up.
            held.lease.abandon();
            let rows = held.claim.open_rows();
            tracing::debug!(
                "claim {}: lease not renewed in time, {} row(s) given up",
                held.claim.token(),
                rows.len()
            );
            // Row by row too, so that one row's story can be followed through the log.
            for id in &rows {
                tracing::debug!("row {id}: given up: its claim's lease was not renewed in time");
            }
            held.give_up(&rows);
            return;
        }
        // When this renewal was due: a third of the lease after the last confirmation.
        let due = held.lease.confirmed() + every;
        if renew(&sh, &held, due, give_up_at).await {
            failures = 0;
        } else {
            failures += 1;
        }
    }
}

/// One renewal, given up at `give_up_at`; stops the jobs of rows it finds lost. Returns whether
/// the lease was renewed.
async fn renew(sh: &Shared, held: &Held, due: Instant, give_up_at: Instant) -> bool {
    let sent = Instant::now();
    let limit = sh.attempt_timeout(give_up_at);
    let m = &sh.metrics;
    match tokio::time::timeout(limit, held.claim.beat()).await {
        Ok(Ok(beat)) => {
            sh.health.answered();
            if !beat.lost.is_empty() {
                held.mark_lines_broken();
            }
            held.stop(&beat.lost, StopReason::LeaseLost);
            if beat.renewed {
                held.lease.confirm(sent);
                m.renewed.increment(1);
                m.heartbeat_lag
                    .record(secs(Instant::now().saturating_duration_since(due)));
                return true;
            }
        }
        Ok(Err(e)) => sh.health.failed("renewing leases", &e),
        Err(_) => sh.health.no_answer("renewing leases"),
    }
    m.renewal_failed.increment(1);
    false
}
