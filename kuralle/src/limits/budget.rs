//! A turn's [`Budget`]: the run's limits and the clock its deadline is read from.

use std::time::Duration;

use super::{Exceeded, RunLimits, Spent};

/// The run's limits as one turn checks them. The deadline counts from the run's creation
/// (stored in its record, so a crash does not reset it): the wall time that had passed when
/// the turn opened, plus the turn's own time on tokio's clock (which tests can pause).
#[derive(Debug, Clone)]
pub(crate) struct Budget {
    /// Boxed: checked a few times a step, and held by every turn in flight.
    limits: Box<RunLimits>,
    before_turn: Duration,
    opened: tokio::time::Instant,
}

impl Budget {
    /// No limits (a call outside any run).
    #[cfg(feature = "mcp")]
    pub(crate) fn none() -> Self {
        Self::new(Box::new(RunLimits::new()), 0)
    }

    /// `limits` for a run created at `created_at_ms` (milliseconds since the Unix epoch).
    pub(crate) fn new(limits: Box<RunLimits>, created_at_ms: i64) -> Self {
        let before_turn = u64::try_from(crate::clock::now_ms().saturating_sub(created_at_ms)).unwrap_or(0);
        Self { limits, before_turn: Duration::from_millis(before_turn), opened: tokio::time::Instant::now() }
    }

    /// Time since the run was created.
    pub(crate) fn elapsed(&self) -> Duration {
        self.before_turn + self.opened.elapsed()
    }

    /// The cap the next model request would pass, if any.
    pub(crate) fn before_request(&self, spent: &Spent) -> Option<Exceeded> {
        if self.limits.is_unlimited() {
            return None;
        }
        spent.before_request(&self.limits, self.elapsed())
    }

    /// The cap a batch running `fresh` calls would pass, if any.
    pub(crate) fn before_batch(&self, spent: &Spent, fresh: u64) -> Option<Exceeded> {
        if self.limits.is_unlimited() {
            return None;
        }
        spent.before_batch(&self.limits, fresh, self.elapsed())
    }
}
