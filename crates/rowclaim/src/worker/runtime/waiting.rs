//! The rows a worker claimed and has not started yet, in the order they start: the order they
//! were claimed in, but for lines ([`Line`]). A line's rows start in the line's order, at most
//! its width at once, each once a place in the line is free; once one of them ends unfinished
//! (a retry, a release, a lost lease) the rest go back unstarted, since a job that goes back
//! keeps its place in its line and none behind it may run first.
//!
//! Generic over what comes with a row (the runtime's `Arc<Held>`), so that its tests need no
//! claim.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::Arc;

use crate::claim::{ClaimedRow, Line};
use crate::id::RowId;

/// A waiting row and what comes with it.
pub(super) type Entry<T> = (T, ClaimedRow);

/// A waiting row with its place.
type Placed<T> = (u64, Entry<T>);

/// The rows waiting to start. `place`s count rows in the order they arrived.
pub(super) struct Waiting<T> {
    /// Rows of no line, in the order they arrived.
    free: VecDeque<Placed<T>>,
    /// Lines with rows waiting or running, by name.
    lines: HashMap<Arc<str>, Queue<T>>,
    /// The lines whose next row may start now, by that row's place.
    ready: BTreeMap<u64, Arc<str>>,
    /// Places handed out so far.
    arrived: u64,
    /// Rows waiting, in lines or not.
    len: usize,
}

/// One line's rows, waiting in its order, and how many of its rows run.
struct Queue<T> {
    rows: VecDeque<Placed<T>>,
    running: u32,
    width: u32,
    /// Its entry in `ready`, if there is one.
    ready_at: Option<u64>,
}

impl<T> Default for Waiting<T> {
    fn default() -> Self {
        Waiting {
            free: VecDeque::new(),
            lines: HashMap::new(),
            ready: BTreeMap::new(),
            arrived: 0,
            len: 0,
        }
    }
}

impl<T: Clone> Waiting<T> {
    /// Takes in one claim's rows, in its order, and its lines. A line's rows that did not come
    /// (a row a claim could not read back) are skipped; a row in no line waits on its own. The
    /// rows of a line of a name the worker holds join it, behind its rows (the line takes the
    /// later claim's width).
    pub(super) fn push(&mut self, with: &T, rows: Vec<ClaimedRow>, lines: Vec<Line>) {
        let mut in_line: HashMap<RowId, (usize, usize)> = HashMap::new();
        for (l, line) in lines.iter().enumerate() {
            for (i, id) in line.rows.iter().enumerate() {
                in_line.insert(id.clone(), (l, i));
            }
        }
        let mut slots: Vec<Vec<Option<Placed<T>>>> =
            lines.iter().map(|l| vec![None; l.rows.len()]).collect();
        for row in rows {
            let place = self.arrived;
            self.arrived += 1;
            self.len += 1;
            let entry = (place, (with.clone(), row));
            match in_line.get(&entry.1 .1.id) {
                Some(&(l, i)) => slots[l][i] = Some(entry),
                None => self.free.push_back(entry),
            }
        }
        for (line, slots) in lines.into_iter().zip(slots) {
            let q = self.lines.entry(line.name.clone()).or_insert(Queue {
                rows: VecDeque::new(),
                running: 0,
                width: line.width,
                ready_at: None,
            });
            q.width = line.width.max(1);
            // The line's rows take its places in its own order: its first starts where the
            // first of them arrived.
            let rows: Vec<Placed<T>> = slots.into_iter().flatten().collect();
            let mut places: Vec<u64> = rows.iter().map(|(place, _)| *place).collect();
            places.sort_unstable();
            q.rows
                .extend(places.into_iter().zip(rows.into_iter().map(|(_, e)| e)));
            self.refresh(&line.name);
        }
    }

    /// The next row to start, and its line's name if it is in one (the line counts it as
    /// running until [`Waiting::ended`] is told).
    pub(super) fn next(&mut self) -> Option<(Entry<T>, Option<Arc<str>>)> {
        let free_at = self.free.front().map(|(place, _)| *place);
        let line_at = self.ready.first_key_value().map(|(place, _)| *place);
        let from_line = match (free_at, line_at) {
            (_, None) => false,
            (None, Some(_)) => true,
            (Some(f), Some(l)) => l < f,
        };
        if !from_line {
            let (_, entry) = self.free.pop_front()?;
            self.len -= 1;
            return Some((entry, None));
        }
        let (_, name) = self.ready.pop_first()?;
        let q = self.lines.get_mut(&name)?;
        q.ready_at = None;
        let (_, entry) = q.rows.pop_front()?;
        q.running += 1;
        self.len -= 1;
        self.refresh(&name);
        Some((entry, Some(name)))
    }

    /// A row of line `name` ended (or was not started after all): the line's next may start,
    /// unless it ended unfinished (`for_good` false), when the rest of the line is returned, to
    /// go back unstarted.
    pub(super) fn ended(&mut self, name: &Arc<str>, for_good: bool) -> Vec<Entry<T>> {
        let Some(q) = self.lines.get_mut(name) else {
            return Vec::new();
        };
        q.running = q.running.saturating_sub(1);
        let back: Vec<Entry<T>> = if for_good {
            Vec::new()
        } else {
            q.rows.drain(..).map(|(_, entry)| entry).collect()
        };
        self.len -= back.len();
        self.refresh(name);
        back
    }

    /// Takes out the rows `which` picks, in lines or not; the rest keep their order. A line
    /// goes whole where its first row is picked (a line's rows are of one queue). Also the
    /// names of the lines it emptied so.
    pub(super) fn take_where(
        &mut self,
        which: impl Fn(&ClaimedRow) -> bool,
    ) -> (Vec<Entry<T>>, Vec<Arc<str>>) {
        let (back, keep): (VecDeque<_>, VecDeque<_>) =
            self.free.drain(..).partition(|(_, (_, row))| which(row));
        self.free = keep;
        let mut back: Vec<Placed<T>> = back.into_iter().collect();
        let names: Vec<Arc<str>> = self
            .lines
            .iter()
            .filter(|(_, q)| q.rows.front().is_some_and(|(_, (_, row))| which(row)))
            .map(|(name, _)| name.clone())
            .collect();
        for name in &names {
            if let Some(q) = self.lines.get_mut(name) {
                back.extend(q.rows.drain(..));
            }
            self.refresh(name);
        }
        back.sort_by_key(|(place, _)| *place);
        self.len -= back.len();
        (back.into_iter().map(|(_, entry)| entry).collect(), names)
    }

    /// Every waiting row, in the order they arrived; none waits afterwards (lines with rows
    /// running stay, to be told when those end).
    pub(super) fn take_all(&mut self) -> Vec<Entry<T>> {
        self.take_where(|_| true).0
    }

    /// How many rows wait.
    pub(super) fn len(&self) -> usize {
        self.len
    }

    pub(super) fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Puts line `name` in `ready` where its next row may start, and forgets it once nothing of
    /// it waits or runs (a worker that runs for a year meets many keys).
    fn refresh(&mut self, name: &Arc<str>) {
        let Some(q) = self.lines.get_mut(name) else {
            return;
        };
        if let Some(at) = q.ready_at.take() {
            self.ready.remove(&at);
        }
        match q.rows.front() {
            Some((place, _)) if q.running < q.width => {
                self.ready.insert(*place, name.clone());
                q.ready_at = Some(*place);
            }
            Some(_) => {}
            None if q.running == 0 => {
                self.lines.remove(name);
            }
            None => {}
        }
    }
}

#[cfg(test)]
mod tests;
