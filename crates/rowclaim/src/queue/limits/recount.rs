//! The recount of a limited claim on a node that applies other nodes' writes late (a Galera
//! node), once the claim committed.
//!
//! There the queue's turn (`turn_sql`) does not always keep two nodes' claims apart: a claim on
//! one node counted what ran, and another node's claim committed in between, and both claims
//! committed with the same turn (seen in `tests/galera.rs`, about one run in ten: a queue
//! limited to 2 ran 3 jobs at once; Jepsen reports lost updates on healthy Galera clusters
//! too). So the jobs a claim took run only once a count made after its commit, waiting for
//! every write the cluster committed before it (`wsrep_sync_wait`), finds the queue within its
//! limits; otherwise the claim gives them back, unstarted. Of two claims that crossed a limit
//! together, the one that committed later always sees both in its count, so no crossing runs;
//! at worst both give back and claim again, their starts (for rate limits) forgotten.

use crate::backend::run::Run;
use crate::backend::sql::{self, Binder, Dialect, Stmt};
use crate::backend::ClaimArgs;
use crate::backend::{Outcome, Target};
use crate::error::Result;
use crate::value::IdList;

use super::RUNNING;

/// Whether the jobs `ids` a limited claim of `queue` took and committed were given back:
/// because a count after the commit found one of the queue's limits crossed.
pub(crate) async fn gave_back<R: Run + ?Sized>(
    r: &R,
    a: &ClaimArgs<'_>,
    queue: &str,
    ids: &IdList,
) -> Result<bool> {
    if r.count(crossed_sql(queue, ids)).await? == 0 {
        return Ok(false);
    }
    // The starts first, while the jobs are still the claim's: a rate counts no start of a job
    // that did not start.
    for one in singles(ids) {
        r.execute(unstart_sql(queue, a.token, &one)).await?;
    }
    let target = Target::Ids(ids, ids.len());
    let back = sql::settle_in_table_sql(a.m, a.token, &target, &Outcome::Unstarted)?;
    let n = r.execute(back).await?;
    tracing::debug!(
        queue,
        jobs = n,
        "a limited claim crossed a limit with another node's claim: its jobs are given back"
    );
    Ok(true)
}

/// Each id of `ids` as a list of its own.
fn singles(ids: &IdList) -> Vec<IdList> {
    match ids {
        IdList::Int(v) => v.iter().map(|id| IdList::Int(vec![*id])).collect(),
        IdList::Text(v) => v.iter().map(|id| IdList::Text(vec![id.clone()])).collect(),
    }
}

/// Forgets the start the claim of `token` recorded for the job `id` (`starts_sql`: at the job's
/// `attempted_at`), one row of them: the same start of another claim is the same row, and
/// either one goes. MariaDB's SQL (`<=>`, `DELETE … LIMIT`): only a Galera node asks.
fn unstart_sql<D: Dialect>(queue: &str, token: &str, id: &IdList) -> Stmt<D> {
    let mut b = Binder::<D>::new();
    let name = b.bind(queue.to_owned());
    let which = D::id_in(&mut b, "j.id", id);
    let owner = b.bind(token.to_owned());
    let sql = format!(
        "DELETE FROM rowclaim_starts WHERE queue = {name} AND EXISTS (SELECT 1 FROM \
         rowclaim_jobs j WHERE {which} AND j.owner = {owner} AND j.status = {RUNNING} \
         AND j.limit_key <=> rowclaim_starts.limit_key \
         AND {} = rowclaim_starts.started_ms) LIMIT 1",
        D::epoch_ms("j.attempted_at")
    );
    Stmt::new(sql, b)
}

/// 1 when the queue's jobs now cross one of its limits where the jobs `ids` count (what runs in
/// the queue, and within each of their keys; the starts of the rate periods), else 0; read once
/// this node applied what the cluster committed before (`wsrep_sync_wait = 1`: reads).
pub(crate) fn crossed_sql<D: Dialect>(queue: &str, ids: &IdList) -> Stmt<D> {
    let (now, now_ms) = (D::NOW, D::epoch_ms(D::NOW));
    let mut b = Binder::<D>::new();
    let name = b.bind(queue.to_owned());
    // The keys of the claim's jobs, bound where each use stands (placeholders are positional
    // on MySQL).
    let mut keys = || {
        format!(
            "(SELECT c.limit_key FROM rowclaim_jobs c WHERE {})",
            D::id_in(&mut b, "c.id", ids)
        )
    };
    let (keys, rate_keys) = (keys(), keys());
    let running = format!(
        "rowclaim_jobs j WHERE j.queue = q.name AND j.status = {RUNNING} AND j.lease_until >= {now}"
    );
    let wait = sql::read_after_applied(true);
    let sql = format!(
        "{wait}SELECT COUNT(*) FROM rowclaim_queues q \
         WHERE q.name = {name} AND ( \
         (q.concurrency IS NOT NULL AND (SELECT COUNT(*) FROM {running}) > q.concurrency) \
         OR (q.key_concurrency IS NOT NULL AND EXISTS (SELECT 1 FROM {running} \
           AND j.limit_key IN {keys} GROUP BY j.limit_key HAVING COUNT(*) > q.key_concurrency)) \
         OR (q.rate IS NOT NULL AND (SELECT COUNT(*) FROM rowclaim_starts s \
           WHERE s.queue = q.name AND s.started_ms >= {now_ms} - q.rate_period_ms) > q.rate) \
         OR (q.key_rate IS NOT NULL AND EXISTS (SELECT 1 FROM rowclaim_starts s \
           WHERE s.queue = q.name AND s.started_ms >= {now_ms} - q.key_rate_period_ms \
           AND s.limit_key IN {rate_keys} GROUP BY s.limit_key HAVING COUNT(*) > q.key_rate)))"
    );
    Stmt::new(sql, b)
}

#[cfg(all(test, feature = "mysql"))]
mod tests;
