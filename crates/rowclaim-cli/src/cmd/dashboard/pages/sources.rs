//! `GET /sources/{table}`: a recorded table's counts, chart, holders and rows; and
//! `GET /sources/{table}/rows/{id}`: one of its rows, with the action that gives it back.

use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Extension;
use maud::html;
use rowclaim::RowFilter;
use serde::Deserialize;

use crate::cmd::dashboard::charts::{chart, colour_of, Line};
use crate::cmd::dashboard::layout::{
    action_button, expired, layout, path_segment, query_value, trouble, when, LIMITS,
};
use crate::cmd::dashboard::state::{Dashboard, State as St, Who};

#[derive(Deserialize, Default)]
pub struct RowSearch {
    status: Option<String>,
    after: Option<String>,
    limit: Option<u32>,
}

/// `GET /sources/{table}`: a recorded table's counts, chart, holders and rows.
pub async fn source(
    State(state): State<St>,
    Extension(who): Extension<Who>,
    Path(table): Path<String>,
    Query(search): Query<RowSearch>,
) -> Response {
    let (record, claimer) = match recorded(&state, &who, &table).await {
        Ok(found) => found,
        Err(page) => return page,
    };
    let stats = match claimer.stats().await {
        Ok(s) => s,
        Err(e) => {
            return trouble(
                &state,
                &who,
                StatusCode::INTERNAL_SERVER_ERROR,
                &e.to_string(),
            )
        }
    };
    let limit = search.limit.filter(|l| LIMITS.contains(l)).unwrap_or(50);
    let status = search.status.clone().filter(|s| !s.is_empty());
    let mut f = RowFilter::new().limit(limit);
    if let Some(s) = &status {
        f = f.status(s.clone());
    }
    if let Some(a) = search.after.as_deref().filter(|a| !a.is_empty()) {
        f = f.after(a);
    }
    let (rows, rows_problem) = match claimer.rows(&f).await {
        Ok(r) => (r, None),
        Err(e) => (Vec::new(), Some(e.to_string())),
    };
    // Which registered worker holds each claim (none without the registry).
    let workers = state.db.workers().await.unwrap_or_default();
    let samples = state.history.samples();
    let statuses: Vec<String> = stats.by_status.keys().cloned().collect();
    let lines: Vec<Line> = statuses
        .iter()
        .map(|st| Line {
            name: st.clone(),
            colour: colour_of(if *st == record.ready {
                "ready"
            } else if *st == record.claimed {
                "claimed"
            } else {
                st
            }),
            points: samples
                .iter()
                .filter_map(|s| {
                    s.sources
                        .get(&table)
                        .map(|c| (s.at, c.get(st).copied().unwrap_or(0) as f64))
                })
                .collect(),
        })
        .collect();
    let next = (rows.len() as u32 == limit)
        .then(|| rows.last().map(|r| r.id.to_string()))
        .flatten()
        .map(|last| {
            let mut q = format!("?after={}&limit={limit}", query_value(&last));
            if let Some(s) = &status {
                q.push_str(&format!("&status={}", query_value(s)));
            }
            q
        });
    let base = format!("/sources/{}", path_segment(&table));
    let body = html! {
        p.muted {
            "id " code { (record.id_column) } ", status " code { (record.status_column) }
            " (ready " code { (record.ready) } ", claimed " code { (record.claimed) } ")"
            @if let Some(o) = &record.owner_column { ", owner " code { (o) } }
            @if let Some(l) = &record.lease_column { ", lease " code { (l) } }
            "; claims kept " (record.claims) " by " (record.strategy)
        }
        table #counts {
            tr { @for (st, _) in &stats.by_status { th.num { (st) } } th.num { "expired leases" } }
            tr {
                @for (st, n) in &stats.by_status { td.num data-status=(st) { (n) } }
                td.num.problem[stats.expired_leases > 0] { (stats.expired_leases) }
            }
        }
        (chart("Rows by status", "rows", &lines))
        h2 { "Holders" }
        @if stats.claimed_by_owner.is_empty() { p.muted { "No row is claimed." } } @else {
            table #holders {
                tr { th { "owner (claim token)" } th { "worker (host, pid)" } th.num { "rows" } }
                @for (owner, n) in &stats.claimed_by_owner {
                    tr {
                        td { code { (owner) } }
                        td { (super::workers::worker_of(&workers, owner)) }
                        td.num { (n) }
                    }
                }
            }
        }
        h2 { "Rows" }
        form method="get" {
            label { "status " select name="status" {
                option value="" { "any" }
                @for st in &statuses { option value=(st) selected[status.as_deref() == Some(st.as_str())] { (st) } }
            } }
            " " label { "per page " select name="limit" {
                @for l in LIMITS { option value=(l) selected[l == limit] { (l) } }
            } }
            " " button type="submit" { "Search" }
        }
        @if let Some(p) = rows_problem { p.problem { (p) } }
        @if rows.is_empty() { p.muted { "No rows." } } @else {
            table #rows {
                tr { th { "id" } th { "status" } th { "owner" } th { "lease end" } }
                @for r in &rows {
                    @let id = r.id.to_string();
                    tr data-row=(id) {
                        td { a href=(format!("{base}/rows/{}", path_segment(&id))) { (id) } }
                        td { (r.status) }
                        td { code { (r.owner.as_deref().unwrap_or("")) } }
                        td.problem[stale(&record, r)] { (r.lease_until.map(when).unwrap_or_default()) @if stale(&record, r) { " expired" } }
                    }
                }
            }
        }
        @if let Some(q) = next { p { a href=(q) { "More rows →" } } }
    };
    layout(&state, &who, &format!("Table {table}"), true, body).into_response()
}

/// `GET /sources/{table}/rows/{id}`: one row's columns, status, holder and lease.
pub async fn row(
    State(state): State<St>,
    Extension(who): Extension<Who>,
    Path((table, id)): Path<(String, String)>,
) -> Response {
    let (record, claimer) = match recorded(&state, &who, &table).await {
        Ok(found) => found,
        Err(page) => return page,
    };
    let found = match claimer.parse_id(&id) {
        Ok(row_id) => claimer.row(&row_id).await,
        Err(e) => Err(e),
    };
    let row = match found {
        Ok(Some(r)) => r,
        Ok(None) => {
            return trouble(
                &state,
                &who,
                StatusCode::NOT_FOUND,
                &format!("{table} has no row {id}."),
            )
        }
        Err(e) => return trouble(&state, &who, StatusCode::BAD_REQUEST, &e.to_string()),
    };
    let held = row.status == record.claimed || row.owner.is_some();
    // Only where the holder can be fenced out (Claimer::release_row refuses elsewhere).
    let releasable = record.strategy != rowclaim::Strategy::Transaction
        && (record.owner_column.is_some() || record.strategy == rowclaim::Strategy::LeaseTable);
    let data = serde_json::to_string_pretty(&row.data).unwrap_or_default();
    let body = html! {
        p { a href=(format!("/sources/{}", path_segment(&table))) { "← " (table) } }
        table #row {
            tr { th { "status" } td #status { (row.status) } }
            tr { th { "owner" } td { code { (row.owner.as_deref().unwrap_or("")) } } }
            tr { th { "lease end" } td.problem[stale(&record, &row)] #lease { (row.lease_until.map(when).unwrap_or_default()) @if stale(&record, &row) { " expired" } } }
        }
        h2 { "Columns" }
        pre #columns { (data) }
        @if !state.read_only && held && releasable {
            h2 { "Actions" }
            p #actions {
                (action_button(
                    &who,
                    &format!("/sources/{}/rows/{}/release", path_segment(&table), path_segment(&id)),
                    &[("holder", row.owner.as_deref().unwrap_or_default())],
                    "Release",
                    &format!("Give row {id} back (ready again)? Its holder's result will be refused."),
                    true,
                ))
            }
        }
    };
    layout(&state, &who, &format!("{table} row {id}"), true, body).into_response()
}

/// Whether `row`'s lease has expired while it is still claimed. A done or failed row keeps its
/// last lease in the table; that one ended as it should have.
fn stale(record: &rowclaim::registry::RecordedSource, row: &rowclaim::SourceRow) -> bool {
    row.status == record.claimed && expired(row.lease_until)
}

/// The record of `table` and a claimer for it, or the page that says why there is none.
async fn recorded(
    state: &Dashboard,
    who: &Who,
    table: &str,
) -> Result<(rowclaim::registry::RecordedSource, rowclaim::Claimer), Response> {
    match state.source(table).await {
        Ok(Some(found)) => Ok(found),
        Ok(None) => Err(trouble(
            state,
            who,
            StatusCode::NOT_FOUND,
            &format!("No recorded source {table}."),
        )),
        Err(e) => Err(trouble(
            state,
            who,
            StatusCode::INTERNAL_SERVER_ERROR,
            &e.to_string(),
        )),
    }
}
