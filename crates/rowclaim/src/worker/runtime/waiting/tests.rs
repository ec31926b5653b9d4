use super::*;

fn row(id: i64) -> ClaimedRow {
    ClaimedRow {
        id: RowId::Int(id),
        data: serde_json::json!({ "id": id }),
    }
}

fn rows(ids: &[i64]) -> Vec<ClaimedRow> {
    ids.iter().map(|&id| row(id)).collect()
}

fn line(name: &str, width: u32, ids: &[i64]) -> Line {
    Line {
        name: name.into(),
        width,
        rows: ids.iter().map(|&id| RowId::Int(id)).collect(),
    }
}

/// Starts rows until none may start: their ids and lines.
fn start_all(w: &mut Waiting<()>) -> Vec<(i64, Option<Arc<str>>)> {
    let mut started = Vec::new();
    while let Some((((), r), line)) = w.next() {
        let RowId::Int(id) = r.id else {
            unreachable!("the tests' ids are numbers")
        };
        started.push((id, line));
    }
    started
}

fn ids(started: &[(i64, Option<Arc<str>>)]) -> Vec<i64> {
    started.iter().map(|(id, _)| *id).collect()
}

#[test]
fn a_line_runs_one_after_another_in_its_order_while_the_others_pass() {
    let mut w = Waiting::default();
    // Claimed in the claim's order (priority first); the line's order is 3, 5, 6.
    w.push(&(), rows(&[5, 1, 3, 2, 6]), vec![line("k", 1, &[3, 5, 6])]);
    assert_eq!(w.len(), 5);
    let started = start_all(&mut w);
    // Its first row starts at the place the line's first arrival had; the others wait.
    assert_eq!(ids(&started), [3, 1, 2]);
    assert_eq!(w.len(), 2);
    let k: Arc<str> = "k".into();
    assert_eq!(started[0].1.as_deref(), Some("k"));
    assert!(w.ended(&k, true).is_empty());
    assert_eq!(ids(&start_all(&mut w)), [5]);
    assert!(w.ended(&k, true).is_empty());
    assert_eq!(ids(&start_all(&mut w)), [6]);
    assert!(w.is_empty());
    assert!(w.ended(&k, true).is_empty());
    assert!(
        w.lines.is_empty() && w.ready.is_empty(),
        "a line ended is forgotten"
    );
}

#[test]
fn a_line_of_width_two_runs_two_at_once() {
    let mut w = Waiting::default();
    w.push(&(), rows(&[1, 2, 3, 4]), vec![line("k", 2, &[1, 2, 3, 4])]);
    assert_eq!(ids(&start_all(&mut w)), [1, 2]);
    let k: Arc<str> = "k".into();
    assert!(w.ended(&k, true).is_empty());
    assert_eq!(ids(&start_all(&mut w)), [3]);
    assert!(w.ended(&k, true).is_empty());
    assert_eq!(ids(&start_all(&mut w)), [4]);
}

#[test]
fn a_row_that_ends_unfinished_sends_the_rest_of_its_line_back_and_no_other() {
    let mut w = Waiting::default();
    w.push(
        &(),
        rows(&[1, 2, 3, 10, 11, 20]),
        vec![line("a", 1, &[1, 2, 3]), line("b", 1, &[10, 11])],
    );
    assert_eq!(ids(&start_all(&mut w)), [1, 10, 20]);
    let a: Arc<str> = "a".into();
    let back: Vec<i64> = w
        .ended(&a, false)
        .into_iter()
        .map(|((), r)| match r.id {
            RowId::Int(id) => id,
            RowId::Text(_) => 0,
        })
        .collect();
    assert_eq!(back, [2, 3]);
    assert!(start_all(&mut w).is_empty(), "b still runs its first");
    assert_eq!(w.len(), 1);
    assert!(!w.lines.contains_key(&a), "a line sent back is forgotten");
    assert!(w.ended(&"b".into(), true).is_empty());
    assert_eq!(ids(&start_all(&mut w)), [11]);
}

#[test]
fn a_paused_line_goes_back_whole_and_rows_that_did_not_come_are_skipped() {
    let mut w = Waiting::default();
    // Row 4 of the line could not be read back: it never came.
    w.push(&(), rows(&[1, 2, 3]), vec![line("k", 1, &[2, 3, 4])]);
    assert_eq!(w.len(), 3);
    let (back, _) = w.take_where(|r| r.id == RowId::Int(2));
    let back: Vec<RowId> = back.into_iter().map(|((), r)| r.id).collect();
    assert_eq!(back, [RowId::Int(2), RowId::Int(3)]);
    assert_eq!(ids(&start_all(&mut w)), [1]);
    assert!(w.is_empty() && w.lines.is_empty());
}

#[test]
fn take_all_empties_the_lines_and_keeps_the_order_of_arrival() {
    let mut w = Waiting::default();
    w.push(&(), rows(&[7, 1, 2, 3]), vec![line("k", 1, &[1, 2, 3])]);
    assert_eq!(ids(&start_all(&mut w)), [7, 1]);
    let all: Vec<RowId> = w.take_all().into_iter().map(|((), r)| r.id).collect();
    assert_eq!(all, [RowId::Int(2), RowId::Int(3)]);
    assert!(w.is_empty());
    // The line's running row still ends into it, and it is forgotten then.
    assert!(w.ended(&"k".into(), true).is_empty());
    assert!(w.lines.is_empty());
}

#[test]
fn a_row_that_ends_unfinished_beside_another_keeps_the_line_until_that_one_ends() {
    let mut w = Waiting::default();
    w.push(&(), rows(&[1, 2, 3, 4]), vec![line("k", 2, &[1, 2, 3, 4])]);
    assert_eq!(ids(&start_all(&mut w)), [1, 2]);
    let k: Arc<str> = "k".into();
    let back: Vec<RowId> = w.ended(&k, false).into_iter().map(|((), r)| r.id).collect();
    assert_eq!(back, [RowId::Int(3), RowId::Int(4)]);
    assert!(w.is_empty());
    // Row 2 still runs: the line is kept for it, and a later claim's row of it waits its turn.
    assert!(w.lines.contains_key(&k));
    w.push(&(), rows(&[3]), vec![line("k", 2, &[3])]);
    assert_eq!(ids(&start_all(&mut w)), [3], "one place was free");
    w.push(&(), rows(&[4]), vec![line("k", 2, &[4])]);
    assert!(start_all(&mut w).is_empty(), "2 and 3 run");
    assert!(w.ended(&k, true).is_empty());
    assert_eq!(ids(&start_all(&mut w)), [4]);
    assert!(w.ended(&k, true).is_empty());
    assert!(w.ended(&k, true).is_empty());
    assert!(w.lines.is_empty() && w.ready.is_empty());
}

#[test]
fn a_later_claim_of_a_line_runs_after_what_the_line_holds() {
    let mut w = Waiting::default();
    w.push(&(), rows(&[1, 2]), vec![line("k", 1, &[1, 2])]);
    assert_eq!(ids(&start_all(&mut w)), [1]);
    w.push(&(), rows(&[9, 3, 4]), vec![line("k", 1, &[3, 4])]);
    assert_eq!(
        ids(&start_all(&mut w)),
        [9],
        "the line's next waits for its first"
    );
    let k: Arc<str> = "k".into();
    for next in [2, 3, 4] {
        assert!(w.ended(&k, true).is_empty());
        assert_eq!(ids(&start_all(&mut w)), [next]);
    }
    assert!(w.ended(&k, true).is_empty());
    assert!(w.is_empty() && w.lines.is_empty());
}

/// A later claim's rows of a line (its next run) go back with the rest of the line once a row
/// ahead of them went back unfinished (`a_later_claim_of_a_line_runs_after_what_the_line_holds` is the
/// same line finishing).
#[test]
fn a_later_claims_rows_of_a_line_go_back_with_it() {
    let mut w = Waiting::default();
    let k: Arc<str> = "q/7".into();
    w.push(&(), rows(&[1, 2]), vec![line("q/7", 1, &[1, 2])]);
    assert_eq!(ids(&start_all(&mut w)), [1]);
    w.push(&(), rows(&[3, 4]), vec![line("q/7", 1, &[3, 4])]);
    let back: Vec<RowId> = w.ended(&k, false).into_iter().map(|(_, r)| r.id).collect();
    assert_eq!(back, [RowId::Int(2), RowId::Int(3), RowId::Int(4)]);
    assert!(w.is_empty());
}

#[test]
fn the_lines_a_pause_empties_are_named() {
    let mut w = Waiting::default();
    w.push(
        &(),
        rows(&[1, 2, 3, 4]),
        vec![line("a", 1, &[1, 2]), line("b", 1, &[3, 4])],
    );
    assert_eq!(ids(&start_all(&mut w)), [1, 3]);
    let (back, emptied) = w.take_where(|r| r.id == RowId::Int(2));
    assert_eq!(back.len(), 1);
    assert_eq!(emptied, [Arc::<str>::from("a")]);
}
