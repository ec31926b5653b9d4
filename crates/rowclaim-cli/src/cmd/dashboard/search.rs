//! What a list of jobs is narrowed to (`?queue=…&status=…&kind=…&q=…`): the list's form
//! (`pages/job_list.rs`) and its actions on every matching job (`actions.rs`) read the same
//! fields the same way.

use rowclaim::{JobFilter, JOB_STATUSES};
use serde::Deserialize;

use super::layout::query_value;

/// What the list's form asks for: each field also a field of the bulk action's form.
#[derive(Deserialize, Default, Clone)]
pub struct JobSearch {
    pub queue: Option<String>,
    pub status: Option<String>,
    pub kind: Option<String>,
    /// Text to look for (an id, or part of a kind, status, payload or last error).
    pub q: Option<String>,
    /// Older jobs than this id (the next page).
    pub before: Option<i64>,
    /// Newer jobs than this id (the page before).
    pub after: Option<i64>,
    pub limit: Option<u32>,
}

/// A field's text, trimmed; none when empty.
pub fn given(field: &Option<String>) -> Option<String> {
    field
        .as_deref()
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(str::to_owned)
}

impl JobSearch {
    /// The search as the library's filter (page and limit aside); a status that is none is
    /// left out.
    pub fn filter(&self) -> JobFilter {
        let mut f = JobFilter::new();
        if let Some(q) = given(&self.queue) {
            f = f.queues([q]);
        }
        if let Some(s) = given(&self.status).filter(|s| JOB_STATUSES.contains(&s.as_str())) {
            f = f.status(s);
        }
        if let Some(k) = given(&self.kind) {
            f = f.kinds([k]);
        }
        if let Some(t) = given(&self.q) {
            f = f.search(t);
        }
        f
    }

    /// The search's fields as a query string (no page), each value encoded.
    pub fn query(&self) -> String {
        let mut q = String::new();
        for (name, value) in self.fields() {
            q.push_str(&format!("&{name}={}", query_value(&value)));
        }
        q
    }

    /// The fields that narrow the list, as the bulk action's form sends them back.
    pub fn fields(&self) -> Vec<(&'static str, String)> {
        let f = self.filter();
        let mut out = Vec::new();
        if let Some(q) = f.queues.first() {
            out.push(("queue", q.clone()));
        }
        if let Some(s) = f.status {
            out.push(("status", s));
        }
        if let Some(k) = f.kinds.first() {
            out.push(("kind", k.clone()));
        }
        if let Some(t) = f.search {
            out.push(("q", t));
        }
        out
    }

    /// What the search narrows to, as the log and the questions say it.
    pub fn said(&self) -> String {
        let parts: Vec<String> = self
            .fields()
            .into_iter()
            .map(|(name, value)| {
                let name = if name == "q" { "search" } else { name };
                format!("{name} {value:?}")
            })
            .collect();
        if parts.is_empty() {
            "every job".to_owned()
        } else {
            parts.join(", ")
        }
    }
}
