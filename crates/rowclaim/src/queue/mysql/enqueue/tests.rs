use super::*;

/// The statements a plan makes of `jobs`: for each, whether it is a run and whether its
/// ids are known; "ask" where it asks the server's numbering.
fn plan(jobs: &[NewJob], autoinc: Option<Autoinc>, ids: bool) -> Vec<String> {
    plan_on(jobs, autoinc, Terms { ids, runs: true })
}

fn plan_on(jobs: &[NewJob], autoinc: Option<Autoinc>, terms: Terms) -> Vec<String> {
    let mut plan = Plan {
        walk: Walk::new(pieces(jobs.iter().map(NewJob::parts), RUN_ROWS, BULK_BYTES)),
        autoinc,
        terms,
    };
    let mut made = Vec::new();
    while let Some(ready) = plan.step().expect("step") {
        made.push(match ready {
            Ready::Ask => return vec!["ask".into()],
            Ready::Keyed(_) => "keyed".into(),
            Ready::Insert(i) => format!(
                "{} {} known={}",
                if i.stmt.sql.contains("JSON_TABLE") {
                    "run"
                } else {
                    "rows"
                },
                i.n,
                i.known
            ),
        });
    }
    made
}

fn alike(n: usize) -> Vec<NewJob> {
    (0..n)
        .map(|i| NewJob::new(serde_json::json!({"i": i})))
        .collect()
}

#[test]
fn runs_go_where_their_ids_are_known_or_not_wanted() {
    let jobs = alike(40);
    let (one_one, two) = (
        Autoinc {
            step: 1,
            consecutive: true,
        },
        Autoinc {
            step: 2,
            consecutive: false,
        },
    );
    assert_eq!(plan(&jobs, None, true), ["ask"]);
    assert_eq!(plan(&jobs, Some(one_one), true), ["run 40 known=true"]);
    // Lock mode 2: a run's rows may have others' ids between them.
    assert_eq!(plan(&jobs, Some(two), true), ["rows 40 known=true"]);
    assert_eq!(plan(&jobs, None, false), ["run 40 known=false"]);
    assert_eq!(plan(&jobs, Some(two), false), ["run 40 known=false"]);
    // MySQL 8: no runs.
    let mysql = Terms {
        ids: false,
        runs: false,
    };
    assert_eq!(
        plan_on(&jobs, Some(one_one), mysql),
        ["rows 40 known=false"]
    );
    // One job needs no numbering, and is no run.
    assert_eq!(plan(&alike(1), None, true), ["rows 1 known=true"]);
}

#[test]
fn rows_between_runs_keep_to_a_statement_s_rows() {
    let mut jobs = alike(20);
    jobs.extend((0..1_200).map(|i| NewJob::new(serde_json::json!(i)).priority(1 + i % 2)));
    jobs.extend(alike(16));
    jobs.push(NewJob::new(serde_json::json!(1)).unique_key("k"));
    jobs.extend(alike(15));
    let numbering = Some(Autoinc {
        step: 1,
        consecutive: true,
    });
    assert_eq!(
        plan(&jobs, numbering, true),
        [
            "run 20 known=true",
            "rows 500 known=true",
            "rows 500 known=true",
            "rows 200 known=true",
            "run 16 known=true",
            "keyed",
            "rows 15 known=true",
        ]
    );
}

#[test]
fn depth_counts_arrays_and_objects_outside_strings() {
    assert!(nests_within("1", 0));
    assert!(!nests_within("[]", 0));
    assert!(nests_within(r#"{"a": [1, {"b": []}]}"#, 4));
    assert!(!nests_within(r#"{"a": [1, {"b": []}]}"#, 3));
    assert!(nests_within(r#"["[[[", "\"{{", "\\"]"#, 1));
    assert!(!nests_within(r#"["\\", [[]]]"#, 2));
}
