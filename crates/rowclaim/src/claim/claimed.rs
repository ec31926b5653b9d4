//! A claim: the rows a token holds under a lease, settled one by one or together, kept alive by
//! heartbeats; and rows held by a locking read.

use super::*;

/// Rows claimed under one token. Settle each row with [`Claim::complete`], [`Claim::fail`] or
/// [`Claim::release`]; the methods take `&self`, so one claim's rows can be worked on
/// concurrently (wrap it in an `Arc`).
///
/// Rows left unsettled stay claimed until their lease expires, then others claim them again;
/// with the transaction strategy, dropping the claim rolls back at once.
#[derive(Debug)]
pub struct Claim {
    pub(super) claimer: Claimer,
    pub(super) token: Token,
    pub(super) rows: Vec<ClaimedRow>,
    /// The rows' ids in the claim's order (they outlive `rows` when the runtime takes those).
    pub(super) ids: Vec<RowId>,
    /// Rows that run one after another ([`Line`]), as the layer that shaped the claim set them.
    pub(super) lines: Vec<Line>,
    /// Every row of a line's key among its rows is in that line (see [`Claim::lines_whole`]).
    pub(super) lines_whole: bool,
    pub(super) open: StdMutex<HashSet<RowId>>,
    pub(super) held: Mutex<Option<Held>>,
    /// Signalled when the last open row is settled or given up (ends [`Claim::keep_alive`]).
    pub(super) settled: Notify,
    pub(super) lease: Duration,
    pub(super) claimed_at: Instant,
}

impl fmt::Debug for Held {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Held(open transaction)")
    }
}

impl Claim {
    /// The claim's token.
    pub fn token(&self) -> &Token {
        &self.token
    }

    /// The claimer that took it.
    pub(crate) fn claimer(&self) -> &Claimer {
        &self.claimer
    }

    /// The claimed rows.
    pub fn rows(&self) -> &[ClaimedRow] {
        &self.rows
    }

    /// The claimed rows as structs of yours, each with its id (to complete or fail it by),
    /// in the claim's order: [`ClaimedRow::data_as`] of each. The first row that does not fit
    /// is the error, naming its id and column; to go on with the others, read each with
    /// `data_as` and fail those that do not.
    ///
    /// ```no_run
    /// # async fn demo(claimer: rowclaim::Claimer) -> rowclaim::Result<()> {
    /// #[derive(serde::Deserialize)]
    /// struct Email {
    ///     address: String,
    /// }
    /// let claim = claimer.claim(50, std::time::Duration::from_secs(30)).await?;
    /// for (id, email) in claim.rows_as::<Email>()? {
    ///     println!("sending to {}", email.address);
    ///     claim.complete(&id).await?;
    /// }
    /// # Ok(()) }
    /// ```
    pub fn rows_as<T: serde::de::DeserializeOwned>(&self) -> Result<Vec<(RowId, T)>> {
        self.rows
            .iter()
            .map(|row| {
                let data = crate::shape::from_json(&row.data, || {
                    format!(
                        "row {} of {} does not read as {}",
                        row.id,
                        self.claimer.table_name(),
                        crate::shape::type_name::<T>()
                    )
                })?;
                Ok((row.id.clone(), data))
            })
            .collect()
    }

    /// Whether nothing was claimed.
    pub fn is_empty(&self) -> bool {
        self.rows.is_empty()
    }

    /// How many rows were claimed.
    pub fn len(&self) -> usize {
        self.rows.len()
    }

    /// The lease the claim was taken (or last extended) with.
    pub fn lease(&self) -> Duration {
        self.lease
    }

    /// When the claim was taken, by this process's monotonic clock: the moment its statement was
    /// sent (on SQLite: when it had the write lock), so that `claimed_at() + lease()` is never
    /// later than the deadline the database keeps (for scheduling heartbeats).
    pub fn claimed_at(&self) -> Instant {
        self.claimed_at
    }

    /// Rows not yet completed, failed or released.
    pub fn open_rows(&self) -> Vec<RowId> {
        let open = self.open.lock().unwrap_or_else(|p| p.into_inner());
        self.ids
            .iter()
            .filter(|id| open.contains(id))
            .cloned()
            .collect()
    }

    /// The claimed rows, for the layer that shaped the claim to read what it returned with them.
    pub(crate) fn rows_mut(&mut self) -> &mut [ClaimedRow] {
        &mut self.rows
    }

    /// Hands the rows over (to the worker runtime, which moves each to its job instead of
    /// copying it); [`Claim::rows`] is empty afterwards, the claim's bookkeeping unchanged.
    pub(crate) fn take_rows(&mut self) -> Vec<ClaimedRow> {
        std::mem::take(&mut self.rows)
    }

    /// Sets which of its rows run one after another (see [`Line`]), and whether every row
    /// of a line's key among them is in that line (`whole`).
    pub(crate) fn set_lines(&mut self, lines: Vec<Line>, whole: bool) {
        self.lines = lines;
        self.lines_whole = whole;
    }

    /// Whether it holds lines ([`Line`]) and every row of a line's key among its rows is in
    /// that line: while the worker runs them whole, the next rows of those lines may be
    /// claimed to join them ([`crate::Claimer::claim_behind`]).
    pub(crate) fn lines_whole(&self) -> bool {
        self.lines_whole
    }

    /// Hands the lines over, with the rows ([`Claim::take_rows`]).
    pub(crate) fn take_lines(&mut self) -> Vec<Line> {
        std::mem::take(&mut self.lines)
    }

    /// Marks a row done. [`Error::LeaseLost`] if this claim no longer holds it.
    pub async fn complete(&self, id: &RowId) -> Result<()> {
        self.settle(id, Outcome::Done(None)).await
    }

    /// Marks a row failed.
    pub async fn fail(&self, id: &RowId) -> Result<()> {
        self.settle(id, Outcome::Failed(None)).await
    }

    /// Gives a row back, ready to be claimed again.
    pub async fn release(&self, id: &RowId) -> Result<()> {
        self.settle(id, Outcome::Ready).await
    }

    /// Gives back every row not yet settled.
    pub async fn release_open(&self) -> Result<()> {
        for id in self.open_rows() {
            self.release(&id).await?;
        }
        Ok(())
    }

    /// Pushes the lease of the rows not yet settled to now + `lease` (database clock).
    pub async fn extend(&self, lease: Duration) -> Result<()> {
        check_lease(lease)?;
        if self.open_rows().is_empty() {
            return Ok(());
        }
        if self.claimer.strategy() == Strategy::Transaction {
            let mut held = self.held.lock().await;
            let Some(h) = held.as_mut() else {
                return Err(self.lost(self.forget_all()));
            };
            let b = self.claimer.inner.db.backend.store();
            return b
                .held_extend(h, lease)
                .await
                .map_err(|e| self.lost_if_gone(e));
        }
        // Every row the token still holds: one row lost to another claimer does not stop the
        // others from being extended.
        self.claimer
            .extend(&self.token, &[], lease)
            .await
            .map(|_| ())
    }

    /// The heartbeat: extends the lease of the open rows every third of `lease` until every row
    /// is settled (it returns at once then) or the lease is lost. A failed extension is tried
    /// again at the next beat. Run it beside the work, e.g. `tokio::spawn` on an `Arc<Claim>`.
    ///
    /// It keeps rows for as long as they are open: settle every row (also when your code fails
    /// or panics), or stop it. [`crate::Worker`] does all of this, and stops a job whose lease
    /// is lost; prefer it to a loop of your own.
    pub async fn keep_alive(&self, lease: Duration) {
        let every = (lease / 3).max(Duration::from_millis(100));
        loop {
            if self.open_rows().is_empty() {
                return;
            }
            tokio::select! {
                () = tokio::time::sleep(every) => {}
                () = self.settled.notified() => return,
            }
            match self.extend(lease).await {
                Ok(()) => {}
                Err(Error::LeaseLost { .. }) => return,
                Err(e) => tracing::warn!("extending the lease of claim {}: {e}", self.token),
            }
        }
    }

    pub(crate) async fn settle_as(&self, id: &RowId, outcome: Outcome) -> Result<()> {
        self.settle(id, outcome).await
    }

    pub(super) async fn settle(&self, id: &RowId, outcome: Outcome) -> Result<()> {
        let result = self.settle_keep(id, outcome).await;
        // Settled or not, this claim no longer looks after the row: if the settle failed and the
        // row is still claimed, it comes back when its lease expires (no heartbeat keeps it).
        self.forget(id);
        result
    }

    /// Settles one row. Unlike [`Claim::settle`], a failure that leaves the row held (the
    /// database could not be reached) keeps it open, so that the caller may try again while a
    /// heartbeat keeps its lease; the worker runtime does.
    pub(crate) async fn settle_keep(&self, id: &RowId, outcome: Outcome) -> Result<()> {
        if !self.is_open(id) {
            return Err(self.lost(vec![id.clone()]));
        }
        let result = if self.claimer.strategy() == Strategy::Transaction {
            let mut held = self.held.lock().await;
            let Some(h) = held.as_mut() else {
                // The transaction is gone, and with it the rows (they went back at rollback).
                return Err(self.lost(self.forget_all()));
            };
            let c = &self.claimer.inner;
            let list = IdList::new(c.m.id_kind, std::slice::from_ref(id))?;
            if let Err(e) =
                c.db.backend
                    .store()
                    .held_settle(h, &c.m, &list, outcome)
                    .await
            {
                // A failed statement poisons the transaction (a deadlock victim's is rolled back
                // whole by the server): every row of it went back, and is given up here at once
                // so that the jobs still running on them can be stopped.
                *held = None;
                tracing::warn!(
                    "the transaction holding claim {} failed ({e}); its rows went back",
                    self.token
                );
                return Err(self.lost(self.forget_all()));
            }
            // The transaction commits once every row is settled. A row given up meanwhile (the
            // claim was abandoned) is not this claim's to settle any more.
            let last = {
                let open = self.open.lock().unwrap_or_else(|p| p.into_inner());
                if !open.contains(id) {
                    return Err(self.lost(vec![id.clone()]));
                }
                open.len() == 1
            };
            match held.take_if(|_| last) {
                Some(h) => h.commit().await.map_err(|e| self.lost_if_gone(e)),
                None => Ok(()),
            }
        } else {
            self.claimer
                .settle(&self.token, std::slice::from_ref(id), outcome)
                .await
                .map(|_| ())
        };
        if matches!(result, Ok(()) | Err(Error::LeaseLost { .. })) {
            self.forget(id);
        }
        result
    }

    /// Whether the row `id` shows `outcome` written by this claim ([`Claimer::shows`] with its
    /// token): for a write whose answer was lost, the row then needs nothing more.
    pub(crate) async fn settled_as(&self, id: &RowId, outcome: &Outcome) -> Result<bool> {
        let token = self.token.to_string();
        self.claimer.shows(id, outcome, Some(&token)).await
    }

    /// Gives back rows of this claim that never started, in one statement where the strategy
    /// allows: ready, with the claim's attempt taken back (they never ran), in their place.
    /// Returns the rows it could not give back because the claim no longer held them.
    pub(crate) async fn release_rows(&self, ids: &[RowId]) -> Result<Vec<RowId>> {
        self.settle_rows(ids, Outcome::Unstarted).await
    }

    /// Moves rows of this claim to `outcome`, in one statement where the strategy allows (the
    /// transaction strategy settles row by row inside its transaction). Returns the rows that the
    /// claim no longer held (nothing was changed for them); the others were settled. A database
    /// error leaves every row not yet settled open, to be tried again.
    pub(crate) async fn settle_rows(&self, ids: &[RowId], outcome: Outcome) -> Result<Vec<RowId>> {
        if self.claimer.strategy() == Strategy::Transaction {
            let mut lost = Vec::new();
            for id in ids {
                match self.settle_keep(id, outcome.clone()).await {
                    Ok(()) => {}
                    Err(Error::LeaseLost { .. }) => lost.push(id.clone()),
                    Err(e) => return Err(e),
                }
            }
            return Ok(lost);
        }
        let (mut ask, mut lost): (Vec<RowId>, Vec<RowId>) =
            ids.iter().cloned().partition(|id| self.is_open(id));
        if ask.is_empty() {
            return Ok(lost);
        }
        // Where the dialect can say which rows one statement changed, one statement does.
        let c = &self.claimer.inner;
        let list = IdList::new(c.m.id_kind, &ask)?;
        let token = self.token.to_string();
        let each = retry_transient!(
            c.db.backend
                .store()
                .settle_each(&c.m, c.strategy, &token, &list, outcome.clone())
                .await
        )
        .map_err(|e| unknown_if_cut(e, Change::Settle(outcome.clone()).verb(), ask.len()))?;
        if let Some(done) = each {
            let done: HashSet<RowId> = done.into_iter().collect();
            ask.iter().for_each(|id| self.forget(id));
            lost.extend(ask.into_iter().filter(|id| !done.contains(id)));
            return Ok(lost);
        }
        // Named rows change all together or not at all: drop the ones found lost and go again.
        // Each such round drops at least one row, or none when a race hid which (then it simply
        // goes again); the bound keeps a pathological race from looping.
        for _ in 0..ask.len() + 2 {
            if ask.is_empty() {
                return Ok(lost);
            }
            match self
                .claimer
                .settle(&self.token, &ask, outcome.clone())
                .await
            {
                Ok(_) => {
                    ask.iter().for_each(|id| self.forget(id));
                    return Ok(lost);
                }
                Err(Error::LeaseLost { ids, .. }) => {
                    ids.iter().for_each(|id| self.forget(id));
                    ask.retain(|id| !ids.contains(id));
                    lost.extend(ids);
                }
                Err(e) => return Err(e),
            }
        }
        Err(Error::InvalidInput(format!(
            "could not tell which of {} rows claim {} still holds: try again",
            ask.len(),
            self.token
        )))
    }

    /// The heartbeat's one beat: pushes the lease of the rows still open to now + the claim's
    /// lease. Rows it finds no longer held by this claim (their lease expired and another
    /// claimer took them, or someone settled or cancelled them) are forgotten at once, so that no
    /// later beat keeps them, and reported in [`Beat::lost`]. Named rows are extended all
    /// together or not at all, so each round that finds rows lost drops them and goes again.
    pub(crate) async fn beat(&self) -> Result<Beat> {
        let open = self.open_rows();
        if open.is_empty() {
            return Ok(Beat {
                lost: vec![],
                renewed: true,
            });
        }
        if self.claimer.strategy() == Strategy::Transaction {
            return match self.extend(self.lease).await {
                Ok(()) => Ok(Beat {
                    lost: vec![],
                    renewed: true,
                }),
                Err(Error::LeaseLost { ids, .. }) => Ok(Beat {
                    lost: ids,
                    renewed: true,
                }),
                Err(e) => Err(e),
            };
        }
        let (mut ask, mut lost) = (open, Vec::new());
        // Each round that does not renew drops at least one row, or none when a race hid which
        // (then it simply goes again); the bound keeps a pathological race from looping.
        for _ in 0..ask.len() + 2 {
            match self.claimer.extend(&self.token, &ask, self.lease).await {
                Ok(_) => {
                    return Ok(Beat {
                        lost,
                        renewed: true,
                    })
                }
                Err(Error::LeaseLost { ids, .. }) => {
                    ids.iter().for_each(|id| self.forget(id));
                    ask.retain(|id| !ids.contains(id));
                    lost.extend(ids);
                    if ask.is_empty() {
                        break;
                    }
                }
                Err(e) => return Err(e),
            }
        }
        let renewed = ask.is_empty();
        Ok(Beat { lost, renewed })
    }

    /// Stops looking after every open row, without touching the database (for the transaction
    /// strategy the held transaction is dropped, which rolls it back). Their rows come back when
    /// their lease ends. Returns them.
    pub(crate) async fn abandon(&self) -> Vec<RowId> {
        *self.held.lock().await = None;
        self.forget_all()
    }

    /// For the transaction strategy, once no row is open (the last ones were given up rather
    /// than settled): commits what was settled (a row given up was not changed, and its lock
    /// goes with the commit) instead of rolling it all back when the claim is dropped.
    pub(crate) async fn commit_if_done(&self) {
        if self.claimer.strategy() == Strategy::Transaction && self.open_count() == 0 {
            if let Some(h) = self.held.lock().await.take() {
                // A dead connection cannot commit: its rows went back at rollback already.
                let _ = h.commit().await;
            }
        }
    }

    /// How many rows are not yet settled or given up.
    pub(crate) fn open_count(&self) -> usize {
        self.open.lock().map(|o| o.len()).unwrap_or(0)
    }

    /// Resolves once every row is settled or given up.
    pub(crate) async fn all_settled(&self) {
        if self.open_rows().is_empty() {
            return;
        }
        self.settled.notified().await;
    }

    /// Whether this claim still looks after the row.
    pub(crate) fn is_open(&self, id: &RowId) -> bool {
        self.open.lock().map(|o| o.contains(id)).unwrap_or(false)
    }

    /// Stops looking after one row (see [`Claim::abandon`]).
    pub(crate) fn forget(&self, id: &RowId) {
        let mut open = self.open.lock().unwrap_or_else(|p| p.into_inner());
        open.remove(id);
        if open.is_empty() {
            self.settled.notify_one();
        }
    }

    pub(super) fn lost(&self, ids: Vec<RowId>) -> Error {
        Error::LeaseLost {
            token: self.token.to_string(),
            ids,
        }
    }

    /// Gives up every open row; returns them.
    pub(super) fn forget_all(&self) -> Vec<RowId> {
        let ids = self.open_rows();
        self.open.lock().unwrap_or_else(|p| p.into_inner()).clear();
        self.settled.notify_one();
        ids
    }

    /// A held transaction whose connection died (idle timeout = lease expiry) or whose deadline
    /// passed (SQLite) lost its rows.
    pub(super) fn lost_if_gone(&self, e: Error) -> Error {
        match e {
            Error::LeaseLost { .. } => self.lost(self.forget_all()),
            Error::Database(ref d) if d.connection_broke() => self.lost(self.forget_all()),
            other => other,
        }
    }
}

/// What one heartbeat did.
#[derive(Debug)]
pub(crate) struct Beat {
    /// Rows found no longer held (forgotten already).
    pub lost: Vec<RowId>,
    /// Whether every row still held had its lease renewed.
    pub renewed: bool,
}

/// Rows locked by a locking read, with the transaction that holds the locks.
#[derive(Debug)]
pub struct LockedRows {
    pub(super) rows: Vec<ClaimedRow>,
    pub(super) held: Option<Held>,
}

impl LockedRows {
    /// The locked rows.
    pub fn rows(&self) -> &[ClaimedRow] {
        &self.rows
    }

    /// Commits the transaction, releasing the locks.
    pub async fn commit(mut self) -> Result<()> {
        match self.held.take() {
            Some(h) => h.commit().await,
            None => Ok(()),
        }
    }

    /// Rolls the transaction back, releasing the locks.
    pub async fn rollback(mut self) -> Result<()> {
        match self.held.take() {
            Some(h) => h.rollback().await,
            None => Ok(()),
        }
    }
}
