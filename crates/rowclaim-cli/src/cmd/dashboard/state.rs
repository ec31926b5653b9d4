//! What the handlers share: the [`Dashboard`] (the database, the sessions, the actions' log, the
//! charts' history, the claimers of recorded sources), which every handler gets as its
//! [`State`]; and [`Who`], the session a request came in, which the session check hands on to
//! every handler behind it.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, PoisonError};

use rowclaim::registry::RecordedSource;
use rowclaim::{Claimer, Db};

use super::action_log::ActionLog;
use super::history::History;
use super::sessions::{Auth, Session};

/// Everything the handlers share.
pub struct Dashboard {
    pub db: Db,
    /// Where the database is, without a password ([`Db::endpoint`]): all a page ever says of it.
    pub endpoint: String,
    pub auth: Auth,
    /// Actions are not offered, and every POST is refused.
    pub read_only: bool,
    pub actions: ActionLog,
    pub history: History,
    /// Claimers of recorded sources, made once per record (making one asks the catalog).
    claimers: Mutex<HashMap<String, (RecordedSource, Claimer)>>,
}

/// The state handlers get.
pub type State = Arc<Dashboard>;

impl Dashboard {
    pub fn new(db: Db, auth: Auth, read_only: bool, history: History) -> Dashboard {
        Dashboard {
            endpoint: db.endpoint().to_owned(),
            actions: ActionLog::new(db.clone()),
            db,
            auth,
            read_only,
            history,
            claimers: Mutex::default(),
        }
    }

    /// The recorded source of `table` and a claimer for it (which records nothing, and is
    /// never asked to claim), or `None` when the table has no record.
    pub async fn source(&self, table: &str) -> rowclaim::Result<Option<(RecordedSource, Claimer)>> {
        let records = self.db.recorded_sources().await?;
        let Some(record) = records.into_iter().find(|r| r.table == table) else {
            return Ok(None);
        };
        self.claimer_of(record).await.map(Some)
    }

    /// A claimer for `record`, made again when the record changed (`rowclaim source replace`).
    pub async fn claimer_of(
        &self,
        record: RecordedSource,
    ) -> rowclaim::Result<(RecordedSource, Claimer)> {
        let cached = self
            .claimers
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(&record.table)
            .filter(|(r, _)| *r == record)
            .cloned();
        if let Some(found) = cached {
            return Ok(found);
        }
        let claimer = self.db.claimer(record.source(), record.strategy).await?;
        self.claimers
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(record.table.clone(), (record.clone(), claimer.clone()));
        Ok((record, claimer))
    }
}

/// The session of the request, and where it came from: what the actions log says of who.
#[derive(Clone, Debug)]
pub struct Who {
    pub session: Session,
    pub peer: Option<SocketAddr>,
}

impl std::fmt::Display for Who {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.peer {
            Some(p) => write!(f, "session {} from {}", self.session.name, p.ip()),
            None => write!(f, "session {}", self.session.name),
        }
    }
}
