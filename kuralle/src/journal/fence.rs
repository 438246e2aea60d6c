//! The journal's write guard: the fencing token of the lease a turn holds. Every write of the
//! run carries it; a store that rejects it as stale makes the turn stop at once.

use std::{
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    time::Duration,
};

use tokio_util::sync::CancellationToken;

use crate::{
    error::RunError,
    store::{Lease, StoreError},
};

/// The fencing token a turn writes under, and whether the turn lost it.
#[derive(Debug)]
pub(crate) struct Fence {
    run_id: String,
    token: u64,
    lost: AtomicBool,
    /// Fired on loss: the turn's interrupt, so dispatch stops and interruptible calls cancel.
    stop: CancellationToken,
    /// How long a write that failed with a store outage may be tried again: as long as a
    /// renewed lease can stay proven held without a renewal (zero for a lease nobody renews).
    patience: Duration,
}

impl Fence {
    /// The fence of a lease held only for a moment (nobody renews it): a failed write is not
    /// tried again.
    pub(crate) fn new(lease: &Lease, stop: CancellationToken) -> Arc<Self> {
        Self::renewed(lease, stop, Duration::ZERO)
    }

    /// The fence of a renewed lease: a failed write of an outcome in hand may be tried again
    /// for `patience` (the renewals lose the fence sooner if the lease lapses).
    pub(crate) fn renewed(lease: &Lease, stop: CancellationToken, patience: Duration) -> Arc<Self> {
        let (run_id, token, lost) = (lease.run_id.clone(), lease.token, AtomicBool::new(false));
        Arc::new(Self { run_id, token, lost, stop, patience })
    }

    /// How long a failed write of an outcome in hand may be tried again.
    pub(crate) fn patience(&self) -> Duration {
        self.patience
    }

    pub(crate) fn run_id(&self) -> &str {
        &self.run_id
    }

    pub(crate) fn token(&self) -> u64 {
        self.token
    }

    pub(crate) fn is_lost(&self) -> bool {
        self.lost.load(Ordering::SeqCst)
    }

    /// Another owner took over (or the lease was released): stop at once.
    pub(crate) fn lose(&self) {
        if !self.lost.swap(true, Ordering::SeqCst) {
            tracing::warn!(run_id = %self.run_id, token = self.token, "lost the run's lease; stopping this turn");
        }
        self.stop.cancel();
    }

    /// Notes a fenced store error; passes every result through.
    pub(crate) fn watch<T>(&self, result: Result<T, StoreError>) -> Result<T, StoreError> {
        if let Err(StoreError::Fenced { .. }) = &result {
            self.lose();
        }
        result
    }

    /// The turn's result, as [`RunError::LeaseLost`] when the lease was lost.
    pub(crate) fn settle<T>(&self, result: Result<T, RunError>) -> Result<T, RunError> {
        let fenced = matches!(&result, Err(RunError::Store(StoreError::Fenced { .. })));
        if fenced || self.is_lost() {
            self.lose();
            return Err(RunError::LeaseLost { run_id: self.run_id.clone(), token: self.token });
        }
        result
    }
}
