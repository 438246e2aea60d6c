//! Trying a journal write again while the lease is proven held: what the journal does when an
//! outage (a lost connection, a full disk) answers a write whose data is in hand.

use std::time::Duration;

use tokio::time::Instant;

use super::Fence;
use crate::store::StoreError;

/// The pause before a write is tried again; it doubles up to [`MAX_PAUSE`].
const FIRST_PAUSE: Duration = Duration::from_millis(20);
const MAX_PAUSE: Duration = Duration::from_secs(1);

/// The backoff of one write's attempts, bounded by the fence's patience (as long as one
/// renewal proves the lease held; the renewals lose the fence sooner if the lease lapses).
pub(super) struct Retrying {
    pause: Duration,
    /// Set at the first failure.
    until: Option<Instant>,
    /// A single attempt at data an earlier write left in doubt: it may find the data
    /// journaled, and a failure is final.
    after_doubt: bool,
}

impl Retrying {
    pub(super) fn new() -> Self {
        Self { pause: FIRST_PAUSE, until: None, after_doubt: false }
    }

    /// One attempt, for data another write already tried to journal and failed in doubt (an
    /// outage answered it): the attempt may find it journaled. Not tried again: the caller's
    /// lease may no longer be renewed (a turn's close stops renewing first).
    pub(super) fn once_after_doubt() -> Self {
        Self { after_doubt: true, ..Self::new() }
    }

    /// Whether an attempt failed already: an earlier attempt may have committed with its
    /// answer lost.
    pub(super) fn retried(&self) -> bool {
        self.after_doubt || self.until.is_some()
    }

    /// Waits before the next attempt after `error` (the first failure is logged, as `what`);
    /// `false` once the patience is spent.
    pub(super) async fn again(&mut self, fence: &Fence, what: &str, error: &StoreError) -> bool {
        if self.after_doubt {
            return false;
        }
        let now = Instant::now();
        let until = *self.until.get_or_insert_with(|| {
            tracing::warn!(run_id = %fence.run_id(), %error, "{what} failed; retrying while the lease is held");
            now + fence.patience()
        });
        if now >= until {
            return false;
        }
        tokio::time::sleep(self.pause.min(until - now)).await;
        self.pause = (self.pause * 2).min(MAX_PAUSE);
        true
    }
}
