//! A stand-in database for the statement snapshots: it keeps every statement a flow sends it,
//! with its bound values, and answers as a database would on the path the test follows (each
//! change touches `changes` rows; each look-up finds one row whose numbers are 1). So a
//! snapshot shows the statements of a whole flow (a schedule's tick, a migration) in the order
//! the code sends them, without a server. Transactions show as `BEGIN`, `COMMIT`, `ROLLBACK`.

use std::marker::PhantomData;
use std::sync::Mutex;

use crate::backend::run::{Col, Fetch, Finish, Run, Transact};
use crate::backend::sql::{Dialect, Stmt};
use crate::error::Result;
use crate::value::Value;

pub(crate) struct Script<D> {
    log: Mutex<Vec<String>>,
    changes: u64,
    _dialect: PhantomData<D>,
}

impl<D: Dialect> Script<D> {
    /// A database where every change touches one row.
    pub(crate) fn new() -> Self {
        Script::changing(1)
    }

    /// A database where every change touches `changes` rows.
    pub(crate) fn changing(changes: u64) -> Self {
        Script {
            log: Mutex::new(Vec::new()),
            changes,
            _dialect: PhantomData,
        }
    }

    /// What it was sent, one statement (and its values) after the other.
    pub(crate) fn log(&self) -> String {
        self.log.lock().map(|l| l.join("\n")).unwrap_or_default()
    }

    fn note(&self, line: String) {
        if let Ok(mut l) = self.log.lock() {
            l.push(line);
        }
    }

    pub(crate) fn keep(&self, s: Stmt<D>) {
        self.note(format!("{}\n  -- {:?}", s.sql, s.binder.values()));
    }
}

impl<D: Dialect> Run for Script<D> {
    type Sql = D;

    async fn execute(&self, s: Stmt<D>) -> Result<u64> {
        self.keep(s);
        Ok(self.changes)
    }

    async fn fetch_all<T: Fetch<D>>(&self, s: Stmt<D>) -> Result<Vec<T>> {
        self.keep(s);
        Ok(Vec::new())
    }

    async fn fetch_optional<T: Fetch<D>>(&self, s: Stmt<D>) -> Result<Option<T>> {
        self.keep(s);
        Ok(None)
    }

    async fn values(&self, s: Stmt<D>, columns: &[Col]) -> Result<Vec<Vec<Value>>> {
        self.keep(s);
        let one = |c: &Col| match c {
            Col::Int => Value::Int(1),
            Col::OptInt => Value::OptInt(Some(1)),
            Col::Text => Value::Text(String::new()),
            Col::OptText => Value::OptText(None),
        };
        Ok(vec![columns.iter().map(one).collect()])
    }
}

/// A transaction of a [`Script`].
pub(crate) struct Step<'s, D>(pub &'s Script<D>);

impl<D: Dialect> Transact for Script<D> {
    type Tx<'t> = Step<'t, D>;

    async fn transaction(&self, _durable: bool) -> Result<Step<'_, D>> {
        self.note("BEGIN".into());
        Ok(Step(self))
    }

    async fn applies_others_late(&self) -> Result<bool> {
        Ok(false)
    }
}

impl<D: Dialect> Run for Step<'_, D> {
    type Sql = D;

    async fn execute(&self, s: Stmt<D>) -> Result<u64> {
        self.0.execute(s).await
    }

    async fn fetch_all<T: Fetch<D>>(&self, s: Stmt<D>) -> Result<Vec<T>> {
        self.0.fetch_all(s).await
    }

    async fn fetch_optional<T: Fetch<D>>(&self, s: Stmt<D>) -> Result<Option<T>> {
        self.0.fetch_optional(s).await
    }

    async fn values(&self, s: Stmt<D>, columns: &[Col]) -> Result<Vec<Vec<Value>>> {
        self.0.values(s, columns).await
    }
}

impl<D: Dialect> Finish for Step<'_, D> {
    async fn commit_as(self, _what: impl FnOnce() -> String) -> Result<()> {
        self.commit().await
    }

    async fn commit(self) -> Result<()> {
        self.0.note("COMMIT".into());
        Ok(())
    }

    async fn rollback(self) -> Result<()> {
        self.0.note("ROLLBACK".into());
        Ok(())
    }
}

/// Runs a future of the stand-in to its end (nothing in it waits).
pub(crate) fn block_on<F: std::future::Future>(f: F) -> F::Output {
    tokio::runtime::Builder::new_current_thread()
        .build()
        .map(|rt| rt.block_on(f))
        .expect("a current-thread runtime")
}
