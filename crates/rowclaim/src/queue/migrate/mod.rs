//! The managed queue's migrations, written once: each schema component (the jobs', the
//! schedules', the enqueue routine's) has a version in `rowclaim_schema`, and an init runs the
//! steps of every later version, recording each version as it is done. Each database gives only
//! what differs: its DDL ([`Schema`], in a file of its own in this module) and how concurrent
//! inits take turns (its store's `init`: PostgreSQL's advisory lock in the init's transaction,
//! MySQL's named lock on one connection, SQLite's write transaction).

#[cfg(feature = "mysql")]
mod mysql;
#[cfg(feature = "postgres")]
mod postgres;
#[cfg(feature = "sqlite")]
mod sqlite;

use crate::backend::run::{Fetch, Run};
use crate::backend::sql::{Binder, Dialect, Stmt};
use crate::error::{Error, Result};

/// What a database's schema is made of. Its migrations are lists of statements, one per
/// version: append, never edit (they are the schema every install has).
pub(crate) trait Schema: Dialect {
    /// `rowclaim_schema`, the components' versions: made first, by every init.
    const SCHEMA_TABLE: &'static str;
    /// The managed queue's migrations.
    const JOBS: &'static [&'static [&'static str]];
    /// The schedules' migrations.
    const SCHEDULES: &'static [&'static [&'static str]];
    /// The enqueue routine's versions (`enqueue_sql.rs`).
    const ENQUEUE: &'static [&'static [&'static str]];
    /// The column a limited claim reads a key's line by (`limits/pick.rs`), after `queue` and
    /// `limit_key` in the limit index: `status`; on MySQL a column that is the status of keyed
    /// jobs only, so that a change of status of a job without a key leaves that index alone.
    const LINE_STATUS: &'static str = "status";
    /// A statement a limited claim's transaction starts with, if any (`limits/claiming.rs`).
    const LIMITED_CLAIM_SETUP: Option<&'static str> = None;
    /// "Job `o` is ahead of job `j` in their key's line", both of status `status` (a quoted
    /// literal), as a bound the limit index reads (`limits/pick.rs`).
    fn ahead_in_line(_status: &str) -> String {
        "o.id < j.id".to_owned()
    }
    /// The end of the `INSERT` that records a component's version: on a row there already,
    /// the version becomes `to` (bound here when the text needs it).
    fn set_version(b: &mut Binder<Self>, to: i32) -> String;
    /// Whether `step` failed only because its change is made already: it ran before its
    /// version's record (MySQL commits DDL at once), or another init made it at the same moment
    /// (on the nodes of a Galera cluster, which take no turns). Only where the error can mean
    /// nothing else for that step: DDL is transactional elsewhere.
    fn made_already(_step: &str, _: &Error) -> bool {
        false
    }
}

/// A schema component, versioned on its own.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Component {
    /// `rowclaim_jobs`, `rowclaim_queues`, `rowclaim_starts`.
    Jobs,
    /// `rowclaim_schedules`.
    Schedules,
    /// The SQL routine `rowclaim_enqueue` (`enqueue_sql.rs`), after the tables it writes.
    Enqueue,
}

impl Component {
    /// Every component, in the order an init migrates them.
    pub(crate) const ALL: [Component; 3] =
        [Component::Jobs, Component::Schedules, Component::Enqueue];

    /// Its name in `rowclaim_schema`.
    pub(crate) fn name(self) -> &'static str {
        match self {
            Component::Jobs => "jobs",
            Component::Schedules => "schedules",
            Component::Enqueue => "enqueue",
        }
    }

    fn versions<D: Schema>(self) -> &'static [&'static [&'static str]] {
        match self {
            Component::Jobs => D::JOBS,
            Component::Schedules => D::SCHEDULES,
            Component::Enqueue => D::ENQUEUE,
        }
    }
}

/// Brings `component` to its latest version on `r`, which holds the database's init turn.
/// Every step must be safe to run again: MySQL commits DDL at once, so a crash (or a Galera
/// retry) between a step and its version's record runs that step again.
pub(crate) async fn migrate<R: Run>(r: &R, component: Component) -> Result<()>
where
    R::Sql: Schema,
    (i32,): Fetch<R::Sql>,
{
    r.execute(plain(<R::Sql as Schema>::SCHEMA_TABLE)).await?;
    let version = r
        .fetch_optional::<(i32,)>(version_of(component))
        .await?
        .map_or(0, |(v,)| v);
    let versions = component.versions::<R::Sql>();
    let done = usize::try_from(version).unwrap_or(0);
    for (i, steps) in versions.iter().enumerate().skip(done) {
        for step in *steps {
            match r.execute(plain(step)).await {
                Err(e) if !<R::Sql as Schema>::made_already(step, &e) => return Err(e),
                _ => {}
            }
        }
        let to = i32::try_from(i + 1).unwrap_or(i32::MAX);
        r.execute(record(component, to)).await?;
    }
    Ok(())
}

/// A statement without values (DDL).
fn plain<D: Dialect>(sql: &str) -> Stmt<D> {
    Stmt::new(sql.to_owned(), Binder::new())
}

/// The version `component` is at (no row: none yet).
fn version_of<D: Dialect>(component: Component) -> Stmt<D> {
    let mut b = Binder::new();
    let sql = format!(
        "SELECT version FROM rowclaim_schema WHERE component = {}",
        b.bind(component.name().to_owned())
    );
    Stmt::new(sql, b)
}

/// Records that `component` is at version `to`.
fn record<D: Schema>(component: Component, to: i32) -> Stmt<D> {
    let mut b = Binder::new();
    let (c, v) = (b.bind(component.name().to_owned()), b.bind(to));
    let sql = format!(
        "INSERT INTO rowclaim_schema (component, version) VALUES ({c}, {v}) {}",
        D::set_version(&mut b, to)
    );
    Stmt::new(sql, b)
}

/// The migration loop's statements on each database, from nothing to the schedules' latest
/// version, as snapshots (`snapshots/` beside this file); made without a server.
#[cfg(test)]
mod tests {
    use super::*;
    use crate::queue::script::{block_on, Script};

    fn schedules<D: Schema>() -> String
    where
        (i32,): Fetch<D>,
    {
        let db = Script::<D>::new();
        block_on(migrate(&db, Component::Schedules)).expect("the migration");
        db.log()
    }

    #[cfg(feature = "postgres")]
    #[test]
    fn postgres() {
        insta::assert_snapshot!(schedules::<crate::backend::postgres::Sql>());
    }

    #[cfg(feature = "mysql")]
    #[test]
    fn mysql() {
        insta::assert_snapshot!(schedules::<crate::backend::mysql::Sql>());
    }

    #[cfg(feature = "sqlite")]
    #[test]
    fn sqlite() {
        insta::assert_snapshot!(schedules::<crate::backend::sqlite::Sql>());
    }
}
