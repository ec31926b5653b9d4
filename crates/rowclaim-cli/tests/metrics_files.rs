//! The alert rules (docs/prometheus/rowclaim-alerts.yml) and the Grafana dashboard
//! (docs/grafana/rowclaim-dashboard.json) shipped with rowclaim: the rules load in a real
//! `promtool check rules`, every query of the dashboard parses there too, and every metric they
//! name is one a worker and the dashboard export (scraped from running ones here).

use rowclaim_testkit as common;
mod support;

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use common::{with_db, Backend, TestDb};
use support::scrape::{scrape_until, stop, value, worker_with_metrics};

const RULES: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../../docs/prometheus/rowclaim-alerts.yml"
);
const GRAFANA: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../../docs/grafana/rowclaim-dashboard.json"
);

/// Series the rules may name that no scrape here shows (none today; kept for a series that
/// appears only under conditions a test run does not make).
const PENDING: &[&str] = &[];

/// `promtool`, found as the browser tests find Chromium: on PATH or in /usr/bin.
fn promtool() -> PathBuf {
    let path = std::env::var_os("PATH").unwrap_or_default();
    let mut dirs: Vec<PathBuf> = std::env::split_paths(&path).collect();
    dirs.push(PathBuf::from("/usr/bin"));
    dirs.into_iter()
        .map(|d| d.join("promtool"))
        .find(|p| p.is_file())
        .unwrap_or_else(|| {
            panic!(
                "promtool is not installed (looked on PATH and in /usr/bin): the metrics test \
                 loads the alert rules with it; run scripts/test (it installs it) or \
                 `apt-get install prometheus`"
            )
        })
}

/// `promtool check rules FILE`: panics with its output unless it succeeds.
fn check_rules(file: &Path) -> String {
    let out = std::process::Command::new(promtool())
        .args(["check", "rules"])
        .arg(file)
        .output()
        .expect("run promtool");
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.status.success(),
        "promtool check rules {}:\n{said}",
        file.display()
    );
    said
}

/// Every `rowclaim_…` name in `text`.
fn names(text: &str) -> BTreeSet<String> {
    let mut found = BTreeSet::new();
    let mut rest = text;
    while let Some(at) = rest.find("rowclaim_") {
        let name: String = rest[at..]
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect();
        // Not part of a longer word (a label value such as `public.rowclaim_jobs` is no metric).
        let before = rest[..at].chars().next_back();
        if !before.is_some_and(|c| c.is_ascii_alphanumeric() || c == '_' || c == '.') {
            found.insert(name.clone());
        }
        rest = &rest[at + name.len()..];
    }
    found
}

/// The queries of the Grafana dashboard: its panels' targets and its variables' queries.
fn grafana_queries() -> Vec<String> {
    let text = std::fs::read_to_string(GRAFANA).expect("read the Grafana dashboard");
    let dash: serde_json::Value = serde_json::from_str(&text).expect("the dashboard is JSON");
    let mut queries = Vec::new();
    for panel in dash["panels"].as_array().expect("panels") {
        for target in panel["targets"].as_array().expect("targets") {
            queries.push(target["expr"].as_str().expect("an expr").to_owned());
        }
    }
    assert!(queries.len() >= 10, "{queries:?}");
    queries
}

/// The metric names a scrape shows: every `# TYPE` line's, a histogram's series too.
fn exported(scrapes: &[String]) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    for line in scrapes.iter().flat_map(|s| s.lines()) {
        let Some(rest) = line.strip_prefix("# TYPE ") else {
            continue;
        };
        let mut parts = rest.split(' ');
        let (Some(name), Some(kind)) = (parts.next(), parts.next()) else {
            continue;
        };
        names.insert(name.to_owned());
        if kind == "histogram" {
            for suffix in ["_bucket", "_sum", "_count"] {
                names.insert(format!("{name}{suffix}"));
            }
        }
    }
    names
}

/// Scrapes of a worker on the queue (one job run) and of one on an own table (its gauges).
async fn scrapes(t: &TestDb) -> Vec<String> {
    let out = support::rowclaim(&t.url, &["init"]).output().await.unwrap();
    assert!(out.status.success(), "{out:?}");
    let out = support::run_fed(&t.url, &["enqueue", "--queue", "m"], "{}\n").await;
    assert!(out.status.success(), "{out:?}");
    let (queue_worker, addr) =
        worker_with_metrics(&t.url, &["--queue", "m", "--poll", "200ms", "--", "true"]).await;
    let done = [("queue", "m")];
    let queue = scrape_until(&addr, "the job done and the gauges read", |b| {
        value(b, "rowclaim_jobs_completed_total", &done) == Some(1.0)
            && value(b, "rowclaim_queue_jobs", &[("status", "completed")]) == Some(1.0)
    })
    .await;
    stop(queue_worker).await;
    t.jobs(2).await;
    let mut args: Vec<&str> = support::TABLE.to_vec();
    args.extend(["--", "true"]);
    let (table_worker, addr) = worker_with_metrics(&t.url, &args).await;
    let table = scrape_until(&addr, "the table's gauges", |b| {
        value(b, "rowclaim_source_rows", &[("status", "done")]) == Some(2.0)
    })
    .await;
    stop(table_worker).await;
    vec![queue, table]
}

async fn files_load_and_name_exported_metrics(t: Arc<TestDb>) {
    // The rules load in promtool.
    let said = check_rules(Path::new(RULES));
    assert!(said.contains("SUCCESS"), "{said}");

    // Every query of the dashboard parses: promtool checks them as recording rules, with the
    // dashboard's variables given values.
    let queries = grafana_queries();
    let dir = tempfile::tempdir().expect("temp dir");
    let mut rules = String::from("groups:\n  - name: grafana\n    rules:\n");
    for (n, q) in queries.iter().enumerate() {
        let q = q.replace("$__rate_interval", "5m").replace("$queue", ".*");
        let q = serde_json::to_string(&q).expect("a JSON string is a YAML string");
        rules.push_str(&format!(
            "      - record: grafana_query_{n}\n        expr: {q}\n"
        ));
    }
    let file = dir.path().join("grafana-queries.yml");
    std::fs::write(&file, rules).expect("write the rules");
    check_rules(&file);

    // The names they use are exported.
    let exported = exported(&scrapes(&t).await);
    let grafana: BTreeSet<String> = queries.iter().flat_map(|q| names(q)).collect();
    let unknown: Vec<&String> = grafana.difference(&exported).collect();
    assert!(
        unknown.is_empty(),
        "the dashboard names {unknown:?}, not exported: {exported:?}"
    );
    let rules_text = std::fs::read_to_string(RULES).expect("read the rules");
    // The rules' queries (each on its `expr:` line; the comments name families, not series).
    let exprs: String = rules_text
        .lines()
        .filter_map(|l| l.trim().strip_prefix("expr:"))
        .collect::<Vec<_>>()
        .join("\n");
    assert!(
        exprs.contains("rowclaim_workers{state=\"gone\"}"),
        "{exprs}"
    );
    let unknown: Vec<String> = names(&exprs)
        .into_iter()
        .filter(|n| !exported.contains(n) && !PENDING.contains(&n.as_str()))
        .collect();
    assert!(
        unknown.is_empty(),
        "the rules name {unknown:?}, not exported: {exported:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn alert_rules_and_grafana_dashboard_load_and_name_exported_metrics() {
    with_db(Backend::Sqlite, files_load_and_name_exported_metrics).await
}
