//! Making a claimer: a source checked against its live table (names, columns, types, the
//! operator's `--where`), completed by a layer above when one owns the table, its strategy
//! resolved and agreed with the table's record.

use super::{Claimer, Layer};
use crate::backend::ServerInfo;
use crate::db::Db;
use crate::error::{Error, Result};
use crate::mapping::{Mapping, TableName};
use crate::source::Source;
use crate::strategy::Strategy;

impl Db {
    /// Checks `source` against the live table (names, columns, types), the strategy against the
    /// server and the mapping, and the mapping against the one recorded for the table by its
    /// first claim (see [`crate::registry`]), and returns a claimer for it. `Strategy::Auto`
    /// picks the best one (on a table whose record keeps claims in `rowclaim_leases`,
    /// lease-table); [`Claimer::strategy`] says which.
    ///
    /// Nothing is written here, except that the lease-table strategy creates `rowclaim_leases`
    /// if it is missing. The claimer's first claim records its mapping when the table has no
    /// record yet (creating `rowclaim_sources` the first time); a claimer that only settles,
    /// extends or reports writes no record.
    pub async fn claimer(&self, source: Source, strategy: Strategy) -> Result<Claimer> {
        let (mapping, chosen, server) = self.checked_mapping(&source, strategy, None).await?;
        self.id_unique(&mapping).await?;
        let made = || async {
            let (chosen, recorded) = self.check_recorded(&mapping, chosen, strategy).await?;
            self.claimer_of(mapping.clone(), chosen, server.clone(), recorded)
                .await
        };
        // Each step reads, or makes a table if it is missing, so all of them run again after a
        // transient error: on a Galera cluster another node making `rowclaim_leases` or
        // `rowclaim_sources` at the same moment aborts a read of that table here (1213, seen
        // with three `rowclaim work --strategy lease-table` starting at once, one per node).
        // Reading the record or making the lease table may be refused: say which privilege.
        match crate::backend::retry_transient!(made().await) {
            Err(e) => Err(self.explain_denied(&mapping, chosen, false, e).await),
            made => made,
        }
    }

    /// A claimer that only looks ([`Claimer::stats`], [`Claimer::backlog`], reading rows): the
    /// source is checked as for [`Db::claimer`], but nothing is created and no record is
    /// needed, so it works for a user who may only read. A record it may not read is taken as
    /// none. Claim with a claimer made by [`Db::claimer`].
    pub async fn reader(&self, source: Source, strategy: Strategy) -> Result<Claimer> {
        let (mapping, chosen, server) = self.checked_mapping(&source, strategy, None).await?;
        let (chosen, recorded) = match self.check_recorded(&mapping, chosen, strategy).await {
            Err(e) if e.kind() == crate::error::ErrorKind::PermissionDenied => (chosen, false),
            other => other?,
        };
        Claimer::new(self.clone(), mapping, chosen, server, recorded)
    }

    /// A claimer of a table that `layer` owns (the managed queue's): its mapping completed by
    /// the layer, its claims shaped by the layer, strategy auto. Such a table has no record: its
    /// mapping is the layer's, the same for every claimer.
    pub(crate) async fn layered_claimer(
        &self,
        source: &Source,
        layer: &dyn Layer,
    ) -> Result<Claimer> {
        let (mapping, chosen, server) = self
            .checked_mapping(source, Strategy::Auto, Some(layer))
            .await?;
        let claimer = self.claimer_of(mapping, chosen, server, true).await?;
        Ok(claimer.shaped(layer.shape()))
    }

    /// Refuses a table whose id column could name two rows ([`Error::IdNotUnique`]). A table a
    /// layer owns has its id as its primary key, and is not asked.
    pub(crate) async fn id_unique(&self, m: &Mapping) -> Result<()> {
        let table = TableName::parse(&m.table_display)?;
        if self.backend.catalog().id_unique(&table, &m.id_name).await? {
            return Ok(());
        }
        // Both parts are checked identifiers, so the name needs no quotes.
        let index = format!("{}_{}_unique", table.name, m.id_name);
        Err(Error::IdNotUnique {
            table: m.table_display.clone(),
            column: m.id_name.clone(),
            fix: format!("CREATE UNIQUE INDEX {index} ON {} ({})", m.table, m.id),
        })
    }

    /// A claimer of a checked mapping, with the lease table made when its strategy needs it.
    async fn claimer_of(
        &self,
        mapping: Mapping,
        chosen: Strategy,
        server: ServerInfo,
        recorded: bool,
    ) -> Result<Claimer> {
        if chosen == Strategy::LeaseTable {
            let catalog = self.backend.catalog();
            let leases = TableName::parse("rowclaim_leases")?;
            let missing = catalog.columns(&leases).await?.is_empty();
            catalog.ensure_lease_table().await?;
            if missing {
                self.announce_created(
                    "rowclaim_leases",
                    "where the lease-table strategy keeps its claims",
                );
            }
        }
        Claimer::new(self.clone(), mapping, chosen, server, recorded)
    }

    /// `source` checked against the live table (completed by `layer`, when a layer above owns
    /// it), and the strategy it resolves to.
    pub(crate) async fn checked_mapping(
        &self,
        source: &Source,
        strategy: Strategy,
        layer: Option<&dyn Layer>,
    ) -> Result<(Mapping, Strategy, ServerInfo)> {
        let (mapping, _) = self.live_mapping(source, layer).await?;
        let server = self.backend.catalog().server().await?;
        let chosen = strategy.resolve(&server, &mapping)?;
        Ok((mapping, chosen, server))
    }

    /// `source` checked against the live table (names, columns, types, `--where`) and
    /// completed by `layer`, and the table's columns.
    pub(crate) async fn live_mapping(
        &self,
        source: &Source,
        layer: Option<&dyn Layer>,
    ) -> Result<(Mapping, Vec<crate::mapping::Column>)> {
        source.validate()?;
        let catalog = self.backend.catalog();
        let table = TableName::parse(source.table_name())?;
        let columns = catalog.columns(&table).await?;
        if columns.is_empty() {
            return Err(Error::MissingTable {
                table: table.display,
            });
        }
        let key = catalog.table_key(&table).await?;
        let naming = catalog.naming();
        let mut mapping = source.check(&naming, &columns, key)?;
        if let Some(layer) = layer {
            mapping.lifecycle = Some(layer.lifecycle(&mapping, &naming));
        }
        if let Some(condition) = source.condition() {
            self.check_filter(&mapping, condition, &table.display)
                .await?;
        }
        Ok((mapping, columns))
    }

    /// Asks the database whether the source's `--where` is a condition on its table (a statement
    /// that reads no row), so that a typo is refused here, naming `--where`, instead of failing
    /// every claim.
    async fn check_filter(&self, m: &Mapping, condition: &str, table: &str) -> Result<()> {
        let probe = self.backend.catalog().probe_filter(m).await;
        match probe {
            Ok(_) => Ok(()),
            Err(e) if e.is_connection() || e.kind() == crate::error::ErrorKind::Transient => Err(e),
            Err(e) => Err(Error::InvalidInput(format!(
                "--where {condition:?} is not a condition on {table}: {e}"
            ))),
        }
    }
}
