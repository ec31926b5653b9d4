//! Which lines broke while claims were under way. A worker claims the next rows of a line it
//! runs while that line's rows run (`Claimer::claim_behind`); should a row of the line go back
//! unfinished meanwhile (a retry keeps its place in line), the rows such a claim brings were
//! claimed behind a row that no longer runs, and must go back unstarted too. Claims are
//! numbered as they start, and each break remembers the number of the last claim started
//! before it: a claim of that number or lower started before the break.

use std::collections::HashMap;
use std::sync::Arc;

#[derive(Debug, Default)]
pub(super) struct Breaks {
    /// Claims started so far: the number of the last one.
    started: u64,
    /// Lines that broke, with the number of the last claim started before each broke.
    broken: HashMap<Arc<str>, u64>,
}

impl Breaks {
    /// A claim starts: its number.
    pub(super) fn claim_starts(&mut self) -> u64 {
        self.started += 1;
        self.started
    }

    /// A row of line `name` went back unfinished (and the rest of the line with it).
    pub(super) fn broke(&mut self, name: &Arc<str>) {
        self.broken.insert(name.clone(), self.started);
    }

    /// Whether line `name` broke after claim `claim` started.
    pub(super) fn broke_since(&self, name: &str, claim: u64) -> bool {
        self.broken.get(name).is_some_and(|&at| at >= claim)
    }

    /// Forgets the breaks no claim under way started before: `oldest`, the lowest number of
    /// the claims under way (`None`: none is), so that a worker that runs for a year keeps no
    /// more than the breaks of its last claims.
    pub(super) fn forget_before(&mut self, oldest: Option<u64>) {
        match oldest {
            None => self.broken.clear(),
            Some(oldest) => self.broken.retain(|_, at| *at >= oldest),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_claim_under_way_when_its_line_broke_sees_the_break_and_a_later_one_does_not() {
        let mut b = Breaks::default();
        let line: Arc<str> = "mail/7".into();
        let before = b.claim_starts();
        b.broke(&line);
        let after = b.claim_starts();
        assert!(b.broke_since(&line, before));
        assert!(!b.broke_since(&line, after), "started after the break");
        assert!(!b.broke_since("mail/8", before), "another line");
        // Broke again while the later claim was under way.
        b.broke(&line);
        assert!(b.broke_since(&line, after));
    }

    #[test]
    fn breaks_are_kept_only_for_claims_under_way() {
        let mut b = Breaks::default();
        let (one, two): (Arc<str>, Arc<str>) = ("q/1".into(), "q/2".into());
        let first = b.claim_starts();
        b.broke(&one);
        let second = b.claim_starts();
        b.broke(&two);
        // The first claim answered; the second is still under way.
        b.forget_before(Some(second));
        assert!(
            !b.broke_since(&one, first),
            "no claim under way started before it"
        );
        assert!(b.broke_since(&two, second));
        b.forget_before(None);
        assert!(!b.broke_since(&two, second));
        assert!(b.broken.is_empty());
    }
}
