//! A source: a user's table and how its columns map to rowclaim's ideas (id, status, owner, lease,
//! attempts), plus the checked form of that mapping that the backends build their SQL from.

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::mapping::{ident, is_ident, ColType, Column, Mapping, Naming, TableName};
use crate::value::Kind;

/// A table of work and its column mapping.
///
/// Only a table name is required; the rest has defaults (`id`, `status`, and the status values
/// `ready`, `claimed`, `done`, `failed`). Mapping an owner and a lease column unlocks the
/// `skip-locked` and `token` strategies, crash recovery by lease expiry and fencing by token;
/// an attempts column counts claims.
///
/// ```
/// use rowclaim::Source;
/// let source = Source::new("emails")
///     .status_column("state")
///     .status_values("new", "sending", "sent", "bounced")
///     .owner_column("owner")
///     .lease_column("lease_until")
///     .order_by("priority desc, id");
/// assert_eq!(source.table_name(), "emails");
/// ```
///
/// It also reads from a TOML or JSON table with the same keys as the command-line flags
/// (`table`, `id-column`, `status-column`, `ready`, `claimed`, `done`, `failed`, `owner-column`,
/// `lease-column`, `attempts-column`, `order-by`, `where`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct Source {
    table: String,
    #[serde(default = "defaults::id")]
    id_column: String,
    #[serde(default = "defaults::status")]
    status_column: String,
    #[serde(default = "defaults::ready")]
    ready: String,
    #[serde(default = "defaults::claimed")]
    claimed: String,
    #[serde(default = "defaults::done")]
    done: String,
    #[serde(default = "defaults::failed")]
    failed: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    owner_column: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    lease_column: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    attempts_column: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    order_by: Option<String>,
    #[serde(default, rename = "where", skip_serializing_if = "Option::is_none")]
    filter: Option<String>,
}

mod defaults {
    pub fn id() -> String {
        "id".into()
    }
    pub fn status() -> String {
        "status".into()
    }
    pub fn ready() -> String {
        "ready".into()
    }
    pub fn claimed() -> String {
        "claimed".into()
    }
    pub fn done() -> String {
        "done".into()
    }
    pub fn failed() -> String {
        "failed".into()
    }
}

impl Source {
    /// A source over `table` (optionally `schema.table`) with the default mapping.
    pub fn new(table: impl Into<String>) -> Source {
        Source {
            table: table.into(),
            id_column: defaults::id(),
            status_column: defaults::status(),
            ready: defaults::ready(),
            claimed: defaults::claimed(),
            done: defaults::done(),
            failed: defaults::failed(),
            owner_column: None,
            lease_column: None,
            attempts_column: None,
            order_by: None,
            filter: None,
        }
    }

    /// The table as given.
    pub fn table_name(&self) -> &str {
        &self.table
    }

    /// The column holding each row's unique id (integer or text). Default `id`.
    pub fn id_column(mut self, column: impl Into<String>) -> Self {
        self.id_column = column.into();
        self
    }

    /// The column holding each row's status (integer or text). Default `status`.
    pub fn status_column(mut self, column: impl Into<String>) -> Self {
        self.status_column = column.into();
        self
    }

    /// The four status values: ready to claim, claimed, done and failed.
    /// Integers when the status column holds integers.
    pub fn status_values(
        mut self,
        ready: impl Into<String>,
        claimed: impl Into<String>,
        done: impl Into<String>,
        failed: impl Into<String>,
    ) -> Self {
        self.ready = ready.into();
        self.claimed = claimed.into();
        self.done = done.into();
        self.failed = failed.into();
        self
    }

    /// A text column (36 characters or more) that holds the token of the claim that owns a row.
    pub fn owner_column(mut self, column: impl Into<String>) -> Self {
        self.owner_column = Some(column.into());
        self
    }

    /// A column holding when a claim's lease ends: `timestamptz` on PostgreSQL, `DATETIME(6)` in
    /// UTC on MySQL/MariaDB, `INTEGER` unix epoch milliseconds on SQLite.
    pub fn lease_column(mut self, column: impl Into<String>) -> Self {
        self.lease_column = Some(column.into());
        self
    }

    /// An integer column counting how often a row was claimed.
    pub fn attempts_column(mut self, column: impl Into<String>) -> Self {
        self.attempts_column = Some(column.into());
        self
    }

    /// The order rows are claimed in: `"col [asc|desc], …"`. Default: the id column, ascending.
    pub fn order_by(mut self, order: impl Into<String>) -> Self {
        self.order_by = Some(order.into());
        self
    }

    /// An extra SQL condition rows must meet to be claimed, e.g. `"queue = 'mail'"`.
    ///
    /// **Trusted input**: it is pasted into the SQL as written, so it must come from the operator,
    /// never from a user of your application. It must be one expression: it goes into the claim
    /// inside parentheses, after rowclaim's own conditions, so it can only narrow what is
    /// claimed. Refused: unbalanced parentheses, unterminated quotes, comments, `;`, `$` and
    /// backslashes outside quotes (their meaning differs between databases); and, when a
    /// claimer is made, anything the database does not accept as a condition on the table.
    pub fn filter(mut self, condition: impl Into<String>) -> Self {
        self.filter = Some(condition.into());
        self
    }

    /// The extra condition, as given (trimmed), when there is one.
    pub(crate) fn condition(&self) -> Option<&str> {
        self.filter
            .as_deref()
            .map(str::trim)
            .filter(|f| !f.is_empty())
    }

    /// Checks every name and value that can be checked without a database.
    pub fn validate(&self) -> Result<()> {
        self.parts().map(|_| ())
    }

    fn parts(&self) -> Result<Parts> {
        let table = TableName::parse(&self.table)?;
        let id = ident(&self.id_column, "id column")?;
        let status = ident(&self.status_column, "status column")?;
        let owner = self
            .owner_column
            .as_deref()
            .map(|c| ident(c, "owner column"))
            .transpose()?;
        let lease = self
            .lease_column
            .as_deref()
            .map(|c| ident(c, "lease column"))
            .transpose()?;
        let attempts = self
            .attempts_column
            .as_deref()
            .map(|c| ident(c, "attempts column"))
            .transpose()?;
        let mut order = parse_order_by(self.order_by.as_deref().unwrap_or(""))?;
        if !order.iter().any(|(c, _)| c.eq_ignore_ascii_case(&id)) {
            // The id breaks ties, so that the claim order is total and repeatable.
            order.push((id.clone(), "ASC"));
        }
        let filter = match self.condition() {
            None => None,
            Some(f) => match contained(f) {
                Ok(()) => Some(f.to_owned()),
                Err(why) => {
                    return Err(Error::InvalidInput(format!(
                        "--where {f:?} must be one SQL condition: {why}"
                    )))
                }
            },
        };
        let statuses = [&self.ready, &self.claimed, &self.done, &self.failed];
        for (i, a) in statuses.iter().enumerate() {
            if statuses[i + 1..].contains(a) {
                return Err(Error::InvalidInput(format!(
                    "status value {a:?} is used for two states; ready, claimed, done and failed must differ"
                )));
            }
        }
        Ok(Parts {
            table,
            id,
            status,
            owner,
            lease,
            attempts,
            order,
            filter,
        })
    }

    /// Checks the mapping against the table's live columns and builds the quoted SQL pieces.
    pub(crate) fn check(
        &self,
        naming: &Naming,
        columns: &[Column],
        source_key: String,
    ) -> Result<Mapping> {
        let p = self.parts()?;
        let table = p.table.display.clone();
        if columns.is_empty() {
            return Err(Error::MissingTable { table });
        }
        let live = Live {
            table: &table,
            columns,
            naming,
        };
        // Quote the catalog's spelling: a row's JSON keys are the catalog's names too.
        let id_col = live.find(&p.id, "id column")?;
        let id_kind = live.key_kind(id_col, "id column")?;
        let status_col = live.find(&p.status, "status column")?;
        let status = |v: &str, what: &str| live.status_value(status_col, v, what);
        let mut order = Vec::new();
        for (col, dir) in &p.order {
            let c = live.find(col, "order-by column")?;
            order.push(format!("{} {dir}", (naming.quote)(&c.name)));
        }
        Ok(Mapping {
            table: p.table.quoted(naming.quote),
            table_display: table.clone(),
            source_key,
            id: (naming.quote)(&id_col.name),
            id_name: id_col.name.clone(),
            id_kind,
            status: (naming.quote)(&status_col.name),
            ready: status(&self.ready, "ready value")?,
            claimed: status(&self.claimed, "claimed value")?,
            done: status(&self.done, "done value")?,
            failed: status(&self.failed, "failed value")?,
            owner: p.owner.as_deref().map(|o| live.owner(o)).transpose()?,
            lease: p.lease.as_deref().map(|l| live.lease(l)).transpose()?,
            attempts: p
                .attempts
                .as_deref()
                .map(|a| live.attempts(a))
                .transpose()?,
            order_by: order.join(", "),
            filter: p.filter.map(|f| format!(" AND ({f})")).unwrap_or_default(),
            // Only plainly named columns go into a row's JSON: their names are safe as literals.
            columns: columns
                .iter()
                .filter(|c| is_ident(&c.name))
                .map(|c| c.name.clone())
                .collect(),
            lifecycle: None,
        })
    }
}

/// A source's table as its catalog has it: what a mapping is checked against.
struct Live<'a> {
    table: &'a str,
    columns: &'a [Column],
    naming: &'a Naming,
}

impl Live<'_> {
    /// The column `name`, given as the `what` (any case), or the error that names it.
    fn find(&self, name: &str, what: &'static str) -> Result<&Column> {
        self.columns
            .iter()
            .find(|c| c.name.eq_ignore_ascii_case(name))
            .ok_or_else(|| Error::MissingColumn {
                table: self.table.to_owned(),
                column: name.to_owned(),
                what,
            })
    }

    /// The error for column `c`, the `what`, which must be `expected`.
    fn wrong(&self, c: &Column, what: &'static str, expected: &'static str) -> Error {
        Error::WrongColumnType {
            table: self.table.to_owned(),
            column: c.name.clone(),
            what,
            expected,
            found: c.sql_type.clone(),
        }
    }

    /// Whether the id or status column `c` holds integers or text.
    fn key_kind(&self, c: &Column, what: &'static str) -> Result<Kind> {
        match c.ty {
            ColType::Int => Ok(Kind::Int),
            ColType::Text { .. } => Ok(Kind::Text),
            _ => Err(self.wrong(c, what, "an integer or text type")),
        }
    }

    /// A status value, checked as a literal and against what the status column holds: a value
    /// the column cannot hold would fail only at the first claim or settle, as the database's
    /// "value too long" about a column the user did not name.
    fn status_value(&self, status: &Column, v: &str, what: &str) -> Result<crate::id::RowId> {
        check_status_value(v, what)?;
        if let ColType::Text { max_len: Some(n) } = status.ty {
            let len = v.chars().count();
            if len > n as usize {
                return Err(Error::InvalidInput(format!(
                    "{what} {v:?} has {len} characters, but the status column {} of {} \
                     holds at most {n} ({})",
                    status.name, self.table, status.sql_type
                )));
            }
        }
        self.key_kind(status, "status column")?.parse(v, what)
    }

    /// The owner column, quoted: text that holds a token (36 characters).
    fn owner(&self, name: &str) -> Result<String> {
        let c = self.find(name, "owner column")?;
        match c.ty {
            ColType::Text { max_len } if max_len.is_none_or(|n| n >= 36) => {
                Ok((self.naming.quote)(&c.name))
            }
            _ => Err(self.wrong(c, "owner column", "text that holds 36 characters")),
        }
    }

    /// The lease column, quoted: of the type the dialect's lease arithmetic works with.
    fn lease(&self, name: &str) -> Result<String> {
        let c = self.find(name, "lease column")?;
        if c.ty != self.naming.lease_column {
            return Err(self.wrong(c, "lease column", self.naming.lease_type));
        }
        Ok((self.naming.quote)(&c.name))
    }

    /// The attempts column, quoted: an integer.
    fn attempts(&self, name: &str) -> Result<String> {
        let c = self.find(name, "attempts column")?;
        if c.ty != ColType::Int {
            return Err(self.wrong(c, "attempts column", "an integer type"));
        }
        Ok((self.naming.quote)(&c.name))
    }
}

struct Parts {
    table: TableName,
    id: String,
    status: String,
    owner: Option<String>,
    lease: Option<String>,
    attempts: Option<String>,
    order: Vec<(String, &'static str)>,
    filter: Option<String>,
}

/// Status values are part of the mapping, like the column names, and go into the SQL text as
/// literals rather than bound values: PostgreSQL and SQLite can use a partial index such as
/// `WHERE status = 'ready'` only when the query says `status = 'ready'` too (a prepared statement's
/// generic plan with `status = $1` walks the whole primary key instead). So they are held to
/// what a literal can carry safely in every dialect: no quotes, backslashes or control characters.
fn check_status_value(v: &str, what: &str) -> Result<()> {
    let len = v.chars().count();
    if len == 0 || len > 255 || v.chars().any(|c| c == '\'' || c == '\\' || c.is_control()) {
        return Err(Error::InvalidInput(format!(
            "{what} {v:?} must be 1 to 255 characters without quotes, backslashes or control \
             characters (status values are written into the SQL so that indexes on them can be used)"
        )));
    }
    Ok(())
}

fn parse_order_by(text: &str) -> Result<Vec<(String, &'static str)>> {
    let mut out = Vec::new();
    for item in text.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        let mut words = item.split_whitespace();
        let col = ident(words.next().unwrap_or_default(), "order-by column")?;
        let dir = match words.next().map(str::to_ascii_lowercase).as_deref() {
            None | Some("asc") => "ASC",
            Some("desc") => "DESC",
            Some(other) => {
                return Err(Error::InvalidInput(format!(
                    "order-by {item:?}: expected asc or desc after {col}, found {other:?}"
                )))
            }
        };
        if let Some(extra) = words.next() {
            return Err(Error::InvalidInput(format!(
                "order-by {item:?}: unexpected {extra:?} (write \"column [asc|desc], …\")"
            )));
        }
        out.push((col, dir));
    }
    Ok(out)
}

/// Whether `condition`, put inside parentheses, stays inside them on every database: quotes
/// closed, parentheses balanced (never closing one it did not open), and nothing outside quotes
/// that one database reads differently from another (comments, `;`, `$` quoting, backslash
/// escapes, MySQL's `#` comments). What is left is one parenthesised piece of SQL that can only
/// narrow the claim; the database checks that it is a condition (`Db::claimer`).
pub(crate) fn contained(condition: &str) -> std::result::Result<(), String> {
    let mut depth = 0usize;
    let mut chars = condition.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '\'' | '"' | '`' => loop {
                match chars.next() {
                    None => return Err(format!("the quote {c} is not closed")),
                    Some('\\') => {
                        return Err("no backslashes (escapes differ between databases)".into())
                    }
                    // A doubled quote is the quote itself, in every dialect.
                    Some(q) if q == c && chars.peek() == Some(&c) => {
                        chars.next();
                    }
                    Some(q) if q == c => break,
                    Some(_) => {}
                }
            },
            '(' => depth += 1,
            ')' => {
                depth = depth
                    .checked_sub(1)
                    .ok_or("a ')' closes a parenthesis it did not open")?;
            }
            ';' => return Err("no ';'".into()),
            '\\' => return Err("no backslashes (escapes differ between databases)".into()),
            '$' => return Err("no '$' outside quotes (PostgreSQL's dollar quoting)".into()),
            '#' => return Err("no '#' outside quotes (a comment on MySQL)".into()),
            '-' if chars.peek() == Some(&'-') => return Err("no comments (--)".into()),
            '/' if chars.peek() == Some(&'*') => return Err("no comments (/*)".into()),
            _ => {}
        }
    }
    if depth > 0 {
        return Err(format!("{depth} parenthesis(es) not closed"));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::id::RowId;
    use crate::mapping::status_literal;

    #[test]
    fn identifiers_are_validated() {
        assert!(ident("status_2", "x").is_ok());
        let err = ident("x; drop table y", "status column").unwrap_err();
        assert!(err.to_string().contains("status column"), "{err}");
        assert!(ident("2x", "x").is_err());
        assert!(ident("a\"b", "x").is_err());
        assert!(ident("", "x").is_err());
    }

    #[test]
    fn status_values_must_be_safe_literals() {
        assert!(check_status_value("in progress", "ready value").is_ok());
        for bad in ["it's", "back\\slash", "", "tab\t"] {
            let e = check_status_value(bad, "ready value")
                .unwrap_err()
                .to_string();
            assert!(e.contains("ready value"), "{e}");
        }
        assert_eq!(status_literal(&RowId::Text("done".into())), "'done'");
        assert_eq!(status_literal(&RowId::Int(3)), "3");
    }

    #[test]
    fn order_by_parses_and_rejects() {
        let o = parse_order_by("prio desc, created_at").unwrap();
        assert_eq!(
            o,
            vec![("prio".into(), "DESC"), ("created_at".into(), "ASC")]
        );
        assert!(parse_order_by("prio sideways").is_err());
        assert!(parse_order_by("prio; drop").is_err());
    }

    #[test]
    fn filter_with_semicolon_is_rejected() {
        let err = Source::new("t")
            .filter("1=1; drop table t")
            .validate()
            .unwrap_err();
        assert!(err.to_string().contains("no ';'"), "{err}");
    }

    /// Conditions that would leave their parentheses, or be read differently by one database,
    /// are refused naming --where; ordinary ones pass.
    #[test]
    fn filters_stay_inside_their_parentheses() {
        for bad in [
            "1=1) or (1=1",
            ")",
            "(1=1",
            "1=1) --",
            "kind = 'a",
            "kind = \"a",
            "kind = `a",
            "1=1 -- ) or (1=1",
            "1=1 /* ) or (1=1 */",
            "1=1 # ) or (1=1",
            "kind = $$a$$",
            "kind = 'a\\' or 1=1 or kind = ''",
            "kind = E'\\'' ) or (1=1 --'",
            "1=1); delete from t where (1=1",
            "1=1) union select * from t where (1=1",
        ] {
            let err = Source::new("t").filter(bad).validate().unwrap_err();
            assert!(err.to_string().starts_with("--where "), "{bad}: {err}");
        }
        for good in [
            "kind = 'a'",
            "kind = 'it''s'",
            "note = 'a;b -- c /* d */ $e # f) g'",
            "\"Kind\" = 'x' and (priority > 1 or (attempts < 3))",
            "`kind` in ('a', 'b')",
            "payload->>'to' like '%@example.com'",
            "id - 1 > 0",
        ] {
            assert!(Source::new("t").filter(good).validate().is_ok(), "{good}");
        }
    }

    #[test]
    fn duplicate_status_values_are_rejected() {
        let err = Source::new("t")
            .status_values("a", "b", "a", "c")
            .validate()
            .unwrap_err();
        assert!(err.to_string().contains("\"a\""), "{err}");
    }

    #[test]
    fn reads_from_toml_like_keys() {
        let s: Source =
            serde_json::from_str(r#"{"table":"jobs","owner-column":"owner","where":"kind = 'a'"}"#)
                .unwrap();
        assert_eq!(
            s,
            Source::new("jobs")
                .owner_column("owner")
                .filter("kind = 'a'")
        );
    }
}
