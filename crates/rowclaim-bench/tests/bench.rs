//! The `rowclaim-bench` binary on real databases: every scenario drains what it made, checks
//! itself, reports JSON that adds up, and exits 2 naming the flag on bad input. The same
//! arguments work after `rowclaim bench`.

use rowclaim_testkit as common;

use std::process::{Output, Stdio};
use std::sync::Arc;

use common::{with_db, Backend, TestDb};

const BIN: &str = env!("CARGO_BIN_EXE_rowclaim-bench");

/// `rowclaim-bench --database URL ARGS…`, with nothing from the environment that would change
/// it, no stdin, and killed if the test drops it.
async fn output(t: &TestDb, args: &[&str]) -> Output {
    tokio::process::Command::new(BIN)
        .arg("--database")
        .arg(&t.url)
        .args(args)
        .env_remove("DATABASE_URL")
        .env_remove("ROWCLAIM_LOG")
        .stdin(Stdio::null())
        .kill_on_drop(true)
        .output()
        .await
        .expect("run rowclaim-bench")
}

/// `bench drain` drains a table and the managed queue, checks its own work and reports it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bench_drain_reports_and_checks_itself() {
    with_db(Backend::Sqlite, |t| async move {
        for extra in [&[][..], &["--queue"][..]] {
            let args = [
                &[
                    "drain",
                    "--rows",
                    "300",
                    "--workers",
                    "3",
                    "--batch",
                    "7",
                    "--json",
                ][..],
                extra,
            ]
            .concat();
            let out = output(&t, &args).await;
            assert!(
                out.status.success(),
                "{}",
                String::from_utf8_lossy(&out.stderr)
            );
            let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
            assert_eq!(report["rows"], 300);
            assert_eq!(report["workers"], 3);
            assert_eq!(report["strategy"], "token", "auto on SQLite");
            let target = if extra.is_empty() {
                "own table"
            } else {
                "managed queue"
            };
            assert_eq!(report["target"], target);
            let rate = report["jobs_per_second"].as_f64().unwrap();
            let secs = report["seconds"].as_f64().unwrap();
            assert!(
                (rate * secs - 300.0).abs() < 1.0,
                "jobs/s is rows over seconds: {report}"
            );
        }
        let out = output(&t, &["drain", "--rows", "0"]).await;
        assert_eq!(out.status.code(), Some(2));
    })
    .await
}

/// Runs `rowclaim-bench …` and returns its `--json` report, failing on a non-zero exit.
async fn bench_json(t: &TestDb, args: &[&str]) -> serde_json::Value {
    // --json goes before a trailing `-- COMMAND`.
    let cut = args.iter().position(|a| *a == "--").unwrap_or(args.len());
    let (flags, command) = args.split_at(cut);
    let out = output(t, &[flags, &["--json"], command].concat()).await;
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "bench {args:?} failed: {err}");
    serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("bench {args:?} printed no JSON ({e}): {err}"))
}

/// Whether `report` says `rows` rows were done at its rate in its seconds.
fn rate_adds_up(report: &serde_json::Value, rows: f64) -> bool {
    let rate = report["jobs_per_second"].as_f64().unwrap_or(0.0);
    let secs = report["seconds"].as_f64().unwrap_or(0.0);
    (rate * secs - rows).abs() < 0.5
}

/// `worker`: the library Worker drains every job once and reports the CPU it spent; completed
/// jobs can be deleted, with the metrics recorded; `spawn` measures the spawn alone.
async fn bench_worker(t: Arc<TestDb>) {
    let ran = std::time::Instant::now();
    let r = bench_json(&t, &["worker", "--jobs", "300", "--prefetch", "50"]).await;
    let whole = ran.elapsed().as_secs_f64();
    assert_eq!(r["scenario"], "worker");
    assert_eq!(r["jobs"], 300);
    assert!(rate_adds_up(&r, 300.0), "{r}");
    assert!(r["worker_cpu_us_per_job"].as_f64().unwrap() > 0.0, "{r}");
    assert!(r["peak_rss_mb"].as_f64().unwrap() > 1.0, "{r}");
    // The first job came after the worker's start and within the bench's own run (its
    // connecting counted, it may exceed the drain's seconds, which start after it).
    let first = r["seconds_to_first_handler"].as_f64().unwrap_or(-1.0);
    assert!(
        first > 0.0 && first < whole,
        "{r} (the bench took {whole:.2} s)"
    );
    assert_eq!(
        t.count("SELECT COUNT(*) FROM rowclaim_jobs WHERE queue = 'bench' AND status = 'completed' AND attempts = 1")
            .await,
        300
    );
    // --metrics: the run fails its own check unless the recorder counted every completion.
    let deleting = [
        "worker",
        "--jobs",
        "200",
        "--completed",
        "delete",
        "--metrics",
    ];
    let r = bench_json(&t, &deleting).await;
    assert_eq!(r["metrics"], true, "{r}");
    assert_eq!(
        t.count("SELECT COUNT(*) FROM rowclaim_jobs WHERE queue = 'bench'")
            .await,
        0,
        "completed jobs were deleted"
    );
    // `worker --table -- true` (through `rowclaim work`) needs the rowclaim binary: its test is
    // in crates/rowclaim-cli/tests/cli.rs (bench_worker_runs_rowclaim_work).
    let r = bench_json(&t, &["spawn", "--jobs", "30", "--", "true"]).await;
    assert!(rate_adds_up(&r, 30.0), "{r}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bench_worker_sqlite() {
    with_db(Backend::Sqlite, bench_worker).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bench_worker_postgres() {
    with_db(Backend::Postgres, bench_worker).await
}

/// `worker` keeping more completed jobs than the queue's stats count exactly (`COUNT_CAP`,
/// 10,000; above it SQLite's figure is a lower bound, the others' an estimate): its own check
/// counts every job, so a good run passes it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bench_worker_checks_more_jobs_than_the_stats_count() {
    with_db(Backend::Sqlite, |t| async move {
        let r = bench_json(&t, &["worker", "--jobs", "10500", "--prefetch", "500"]).await;
        assert!(rate_adds_up(&r, 10_500.0), "{r}");
        assert_eq!(
            t.count("SELECT COUNT(*) FROM rowclaim_jobs WHERE status = 'completed'")
                .await,
            10_500
        );
    })
    .await
}

/// `bench drain --concurrency`: several claim loops per worker still process every row once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bench_drain_concurrency_and_bad_input() {
    with_db(Backend::Sqlite, |t| async move {
        let args = [
            "drain",
            "--rows",
            "250",
            "--workers",
            "2",
            "--concurrency",
            "3",
            "--batch",
            "4",
            "--strategy",
            "optimistic",
        ];
        let r = bench_json(&t, &args).await;
        assert_eq!(r["scenario"], "drain");
        assert_eq!(r["strategy"], "optimistic");
        assert_eq!(r["concurrency"], 3);
        assert!(rate_adds_up(&r, 250.0), "{r}");
        assert_eq!(
            t.count("SELECT COUNT(*) FROM rowclaim_bench WHERE status = 'done'")
                .await,
            250
        );
        // A lease left on a row id by an earlier run (MariaDB keeps leases won on rows that were
        // finished meanwhile) must not block the same id in the table made anew.
        let lease_table = ["drain", "--rows", "60", "--workers", "2", "--batch", "5"];
        let lease_table = [&lease_table[..], &["--strategy", "lease-table"]].concat();
        bench_json(&t, &lease_table).await;
        t.exec(
            "INSERT INTO rowclaim_leases (source, row_id, token, lease_until) \
             VALUES ('main.rowclaim_bench', '7', 'left-over', 99999999999999)",
        )
        .await;
        let r = bench_json(&t, &lease_table).await;
        assert_eq!(r["strategy"], "lease-table");
        for (bad, flag) in [
            (&["drain", "--plain", "--queue"][..], "--queue"),
            (&["drain", "--concurrency", "0"][..], "--concurrency"),
            (&["drain", "--strategy", "fastest"][..], "--strategy"),
        ] {
            let out = output(&t, bad).await;
            let err = String::from_utf8_lossy(&out.stderr);
            assert_eq!(out.status.code(), Some(2), "{bad:?}: {err}");
            assert!(err.contains(flag), "{bad:?} should name {flag}: {err}");
        }
    })
    .await
}

/// `bench drain --plain`: the minimum-SQL client drains (and deletes) every row, once.
async fn bench_plain(t: Arc<TestDb>) {
    let r = bench_json(
        &t,
        &[
            "drain",
            "--plain",
            "--rows",
            "500",
            "--workers",
            "3",
            "--batch",
            "20",
        ],
    )
    .await;
    assert_eq!(r["scenario"], "drain");
    assert_eq!(r["target"], "plain client");
    assert_eq!(r["strategy"], "minimum SQL");
    assert_eq!(r["rows"], 500);
    assert_eq!(r["workers"], 3);
    assert!(rate_adds_up(&r, 500.0), "{r}");
    let backend = r["backend"].as_str().unwrap_or_default();
    let expected = match t.backend {
        Backend::Postgres => "PostgreSQL",
        Backend::MySql => "M",
        Backend::Sqlite => "SQLite",
    };
    assert!(backend.starts_with(expected), "{r}");
    assert_eq!(t.count("SELECT COUNT(*) FROM rowclaim_plain").await, 0);
}

/// `bench latency`: every job enqueued at the rate starts once; notify only on PostgreSQL.
async fn bench_latency(t: Arc<TestDb>) {
    let r = bench_json(
        &t,
        &[
            "latency",
            "--jobs",
            "40",
            "--rate",
            "200",
            "--concurrency",
            "4",
            "--poll",
            "100ms",
        ],
    )
    .await;
    assert_eq!(r["scenario"], "latency");
    assert_eq!(r["target"], "managed queue");
    assert_eq!(r["jobs"], 40);
    let runs = r["runs"].as_array().expect("runs");
    let modes: Vec<&str> = runs.iter().filter_map(|m| m["wakeup"].as_str()).collect();
    if t.backend == Backend::Postgres {
        assert_eq!(modes, ["notify", "poll"], "{r}");
        assert_eq!(r["strategy"], "skip-locked");
        assert_eq!(runs[1]["enqueue"], "plain INSERT (no NOTIFY)");
    } else {
        assert_eq!(modes, ["poll"], "{r}");
        assert_eq!(r["notes"][0], "notify: not available on this backend");
    }
    for m in runs {
        assert_eq!(m["started"], 40, "{m}");
        assert_eq!(m["completed"], 40, "{m}");
        assert!(m["enqueue_rate"].as_f64().is_some_and(|r| r > 0.0), "{m}");
        let (p50, p99, max) = (
            m["p50_ms"].as_f64().unwrap(),
            m["p99_ms"].as_f64().unwrap(),
            m["max_ms"].as_f64().unwrap(),
        );
        assert!(0.0 <= p50 && p50 <= p99 && p99 <= max, "{m}");
    }
    assert_eq!(
        t.count(
            "SELECT COUNT(*) FROM rowclaim_jobs WHERE queue = 'bench' AND status = 'completed'"
        )
        .await,
        40,
        "the last mode's jobs, all completed"
    );
}

macro_rules! bench_backend_cases {
    ($backend:expr) => {
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn bench_drain_plain_drains_everything() {
            with_db($backend, bench_plain).await
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn bench_latency_starts_every_job_once() {
            with_db($backend, bench_latency).await
        }
    };
}

mod bench_postgres {
    use super::*;
    bench_backend_cases!(Backend::Postgres);
}
mod bench_sqlite {
    use super::*;
    bench_backend_cases!(Backend::Sqlite);
}

/// `bench scale`: every size reported, 90% done and the claimed rows done; own table and queue.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bench_scale_reports_every_size() {
    with_db(Backend::Sqlite, |t| async move {
        let r = bench_json(
            &t,
            &[
                "scale",
                "--sizes",
                "1000,200",
                "--claims",
                "50",
                "--workers",
                "2",
            ],
        )
        .await;
        assert_eq!(r["scenario"], "scale");
        assert_eq!(r["target"], "own table");
        assert_eq!(r["strategy"], "token", "auto on SQLite");
        let sizes = r["sizes"].as_array().expect("sizes");
        let rows: Vec<u64> = sizes.iter().filter_map(|s| s["rows"].as_u64()).collect();
        assert_eq!(rows, [200, 1000], "smallest first: {r}");
        // 200 rows have 20 ready rows: 20 claims; 1000 rows have 100: the 50 asked for.
        let claims: Vec<u64> = sizes.iter().filter_map(|s| s["claims"].as_u64()).collect();
        assert_eq!(claims, [20, 50], "{r}");
        assert_eq!(sizes[0]["p50_ratio"], 1.0);
        for s in sizes {
            assert_eq!(s["rows_claimed"], s["claims"], "batch 1: {s}");
            assert_eq!(s["ready"].as_u64(), s["rows"].as_u64().map(|n| n / 10));
        }
        // The last size's table: 900 done before, 50 claimed and done since.
        assert_eq!(
            t.count("SELECT COUNT(*) FROM rowclaim_bench WHERE status = 'done'")
                .await,
            950
        );
        assert_eq!(
            t.count("SELECT MIN(id) FROM rowclaim_bench WHERE status = 'ready'")
                .await,
            951,
            "done rows first, the ready ones at the end"
        );

        let r = bench_json(
            &t,
            &[
                "scale", "--queue", "--sizes", "300", "--claims", "10", "--batch", "2",
            ],
        )
        .await;
        assert_eq!(r["target"], "managed queue");
        assert_eq!(r["sizes"][0]["claims"], 10);
        assert_eq!(r["sizes"][0]["rows_claimed"], 20);
        assert_eq!(
            t.count(
                "SELECT COUNT(*) FROM rowclaim_jobs WHERE queue = 'bench' AND status = 'completed'"
            )
            .await,
            270 + 20
        );

        for bad in [
            &["scale", "--sizes", "5"][..],
            &["scale", "--sizes", "100", "--batch", "11"][..],
            &["scale", "--sizes", ""][..],
        ] {
            let out = output(&t, bad).await;
            let err = String::from_utf8_lossy(&out.stderr);
            assert_eq!(out.status.code(), Some(2), "{bad:?}: {err}");
            assert!(err.contains("--sizes"), "{bad:?}: {err}");
        }
    })
    .await
}

/// `bench contention`: a cell per worker count × strategy, each a full drain, and a chart with a
/// line and a legend entry per strategy.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bench_contention_fills_every_cell_and_draws_them() {
    with_db(Backend::Sqlite, |t| async move {
        let dir = tempfile::tempdir().unwrap();
        let svg = dir.path().join("chart.svg");
        let svg_arg = svg.display().to_string();
        let r = bench_json(
            &t,
            &[
                "contention",
                "--workers-list",
                "3,1",
                "--rows",
                "120",
                "--batch",
                "10",
                "--svg",
                &svg_arg,
            ],
        )
        .await;
        assert_eq!(r["scenario"], "contention");
        assert_eq!(r["target"], "own table");
        assert!(r["backend"].as_str().unwrap().starts_with("SQLite"), "{r}");
        let strategies = ["token", "optimistic", "lease-table", "transaction"];
        assert_eq!(
            r["strategies"],
            serde_json::json!(strategies),
            "no skip-locked on SQLite"
        );
        assert!(
            r["notes"][0].as_str().unwrap().contains("skip-locked"),
            "{r}"
        );
        assert_eq!(r["workers_list"], serde_json::json!([1, 3]));
        let cells = r["cells"].as_array().unwrap();
        assert_eq!(cells.len(), 2 * strategies.len(), "{r}");
        for w in [1, 3] {
            for s in strategies {
                let cell = cells
                    .iter()
                    .find(|c| c["workers"] == w && c["strategy"] == s)
                    .unwrap_or_else(|| panic!("no cell for {s} × {w}: {r}"));
                assert!(rate_adds_up(cell, 120.0), "{cell}");
            }
        }
        let chart = std::fs::read_to_string(&svg).expect("the SVG was written");
        assert!(chart.starts_with("<svg") && chart.trim_end().ends_with("</svg>"));
        assert_eq!(
            chart.matches("<polyline").count(),
            strategies.len(),
            "{chart}"
        );
        for s in strategies {
            assert!(
                chart.contains(&format!(">{s}</text>")),
                "legend for {s}: {chart}"
            );
        }

        for (bad, flag) in [
            (
                &["contention", "--strategies", "skip-locked"][..],
                "skip-locked",
            ),
            (
                &["contention", "--strategies", "fastest"][..],
                "--strategies",
            ),
            (&["contention", "--workers-list", "0"][..], "--workers-list"),
            (&["contention", "--rows", "0"][..], "--rows"),
        ] {
            let out = output(&t, bad).await;
            let err = String::from_utf8_lossy(&out.stderr);
            assert_eq!(out.status.code(), Some(2), "{bad:?}: {err}");
            assert!(err.contains(flag), "{bad:?} should name {flag}: {err}");
        }
    })
    .await
}
