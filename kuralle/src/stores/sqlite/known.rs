//! What the writer knows of the runs it writes, kept between its transactions: the lease token
//! a write of this connection found holding, and the run's key in the file and next ordinal.
//!
//! Every journal write checks its run's fence, and every append reads the journal's last
//! ordinal: two B-tree descents by the run's text id, which at 1,000 runs in flight were about
//! a seventh of the writer thread's instructions. Between two of its own writes of a run, only
//! two things can change either: the writer itself (taking, releasing or taking back a lease,
//! cancelling or deleting a run), which forgets what it knew of that run; and another
//! connection's commit (a second process, the operator's CLI), which SQLite's `PRAGMA
//! data_version` reveals. The writer reads it after `BEGIN IMMEDIATE`, holding the write lock,
//! so no commit can come between that read and the batch's writes; a changed value, or any
//! transaction or savepoint rolled back, forgets everything. So it pays in one process that
//! writes the file alone; with several writing one file, each batch that follows another's
//! commit reads as before.
//!
//! In debug builds, and so in every test, each read it saves is made anyway and must agree
//! (`leases::known_to_hold`, `steps::next_ordinal`).

use std::cell::{Cell, RefCell};
use std::collections::HashMap;

/// Run ids to what is known of them. foldhash, not the standard SipHash-1-3: the writer hashes
/// a run id for every write it makes (SipHash was 3.16M of the writer thread's 228M
/// instructions at 1,000 runs in flight, foldhash is 0.83M), and it is still seeded per map
/// from process randomness, as the journal's and `MemoryStore`'s maps are (`keymap`).
type Runs = HashMap<Box<str>, Run, foldhash::fast::RandomState>;

/// Runs remembered at most; past it the writer forgets them all and learns again. An entry is
/// its run id and about 50 bytes more; it lives from the run's first write to its release or
/// cancellation, or, for a run whose lease lapsed unreleased, until everything is forgotten.
const MAX_RUNS: usize = 1 << 16;

/// What the writer knows; see the module's documentation.
#[derive(Default)]
pub(super) struct Known {
    runs: RefCell<Runs>,
    /// `PRAGMA data_version` at the last transaction's start: `None` when unread.
    data_version: Cell<Option<i64>>,
}

/// What the writer knows of one run.
#[derive(Clone, Copy)]
struct Run {
    /// The token of the run's lease, which a write in a committed or current transaction of
    /// this connection found unreleased.
    token: i64,
    /// The run's key in the file and its journal's next ordinal, when a write under `token`
    /// learned them.
    next: Option<(i64, i64)>,
}

impl Known {
    /// A transaction began and `PRAGMA data_version` is `version` (`None`: it could not be
    /// read): everything known is forgotten if another connection committed since the last.
    pub(super) fn begin(&self, version: Option<i64>) {
        if version.is_none() || version != self.data_version.get() {
            self.forget_all();
        }
        self.data_version.set(version);
    }

    /// Whether the lease of `run_id` is known to be unreleased with `token`.
    pub(super) fn holds(&self, run_id: &str, token: i64) -> bool {
        self.runs.borrow().get(run_id).is_some_and(|run| run.token == token)
    }

    /// The key of `run_id` and its journal's next ordinal, if known under lease `token`.
    pub(super) fn next_ordinal(&self, run_id: &str, token: i64) -> Option<(i64, i64)> {
        self.runs.borrow().get(run_id).filter(|run| run.token == token).and_then(|run| run.next)
    }

    /// The key of `run_id` in the file, if known under any lease: it changes only when the run
    /// is deleted, which forgets it.
    pub(super) fn run_key(&self, run_id: &str) -> Option<i64> {
        self.runs.borrow().get(run_id).and_then(|run| run.next).map(|(run_key, _)| run_key)
    }

    /// A write of this transaction found the lease of `run_id` unreleased with `token`.
    pub(super) fn fence_held(&self, run_id: &str, token: i64) {
        let mut runs = self.runs.borrow_mut();
        match runs.get_mut(run_id) {
            Some(run) if run.token == token => {}
            Some(run) => *run = Run { token, next: None },
            None => insert(&mut runs, run_id, Run { token, next: None }),
        }
    }

    /// A write under lease `token` left the journal of `run_id`, keyed `run_key`, with `next`
    /// as its next ordinal.
    pub(super) fn appended(&self, run_id: &str, token: i64, run_key: i64, next: i64) {
        let mut runs = self.runs.borrow_mut();
        let run = Run { token, next: Some((run_key, next)) };
        match runs.get_mut(run_id) {
            Some(known) => *known = run,
            None => insert(&mut runs, run_id, run),
        }
    }

    /// This connection changed `run_id`'s lease or journal other than by a journal write.
    pub(super) fn forget(&self, run_id: &str) {
        self.runs.borrow_mut().remove(run_id);
    }

    /// A transaction or savepoint was rolled back, many leases changed at once, or another
    /// connection committed ([`begin`](Self::begin)).
    pub(super) fn forget_all(&self) {
        let mut runs = self.runs.borrow_mut();
        runs.clear();
        // Room for a run in flight each, but not a past peak's.
        runs.shrink_to(MAX_RUNS / 16);
    }

    #[cfg(test)]
    pub(super) fn len(&self) -> usize {
        self.runs.borrow().len()
    }
}

fn insert(runs: &mut Runs, run_id: &str, run: Run) {
    if runs.len() >= MAX_RUNS {
        runs.clear();
    }
    runs.insert(run_id.into(), run);
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A token is known under itself only, an ordinal under its token only, and both until
    /// forgotten or until `data_version` changes or cannot be read.
    #[test]
    fn a_token_is_known_until_forgotten_or_another_connection_commits() {
        let known = Known::default();
        known.begin(Some(1));
        known.fence_held("a", 3);
        assert!(known.holds("a", 3));
        assert!(!known.holds("a", 2), "another token is not known to hold");
        assert_eq!(known.next_ordinal("a", 3), None, "the fence alone tells no ordinal");
        known.appended("a", 3, 9, 5);
        assert_eq!(known.next_ordinal("a", 3), Some((9, 5)));
        assert_eq!(known.next_ordinal("a", 4), None);
        assert_eq!(known.run_key("a"), Some(9));
        known.fence_held("a", 3);
        assert_eq!(known.next_ordinal("a", 3), Some((9, 5)), "the same token keeps the ordinal");
        known.fence_held("a", 4);
        assert_eq!(known.next_ordinal("a", 4), None, "a new token forgets it");

        known.begin(Some(1));
        assert!(known.holds("a", 4), "no other connection committed");
        known.begin(Some(2));
        assert!(!known.holds("a", 4), "another connection committed");
        known.fence_held("a", 4);
        known.begin(None);
        assert!(!known.holds("a", 4), "an unread version forgets too");

        known.appended("b", 1, 2, 0);
        known.forget("b");
        assert!(!known.holds("b", 1));
        assert_eq!(known.run_key("b"), None, "a deleted run's key is forgotten with it");
    }

    /// The map never holds more than `MAX_RUNS` runs: the one past it starts it afresh.
    #[test]
    fn past_its_bound_it_forgets_and_learns_again() {
        let known = Known::default();
        for i in 0..MAX_RUNS {
            known.fence_held(&format!("run-{i}"), 1);
        }
        assert_eq!(known.len(), MAX_RUNS);
        known.fence_held("one more", 1);
        assert_eq!(known.len(), 1);
        assert!(known.holds("one more", 1));
    }
}
