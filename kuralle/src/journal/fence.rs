//! The journal's write guard: the fencing token of the lease a turn holds. Every write of the
//! run carries it; a store that rejects it as stale makes the turn stop at once.

use std::{
    sync::{
        Arc, Mutex, OnceLock, PoisonError,
        atomic::{AtomicBool, Ordering},
    },
    time::Duration,
};

use tokio_util::sync::CancellationToken;

use super::in_flight::InFlight;
use crate::{
    error::RunError,
    store::{Lease, StoreError},
};

/// Asked at a turn's close whether its lease may be given up with the run's last write (and,
/// if so, stops renewing it): set by the lease's holder (`runtime::lease::Held`).
pub(crate) type CloseHook = Box<dyn FnOnce() -> bool + Send>;

/// The fencing token a turn writes under, and whether the turn lost it.
pub(crate) struct Fence {
    /// The lease as it was granted (renewals extend it in the store, not here). The turn's
    /// holder gives it back and the renewals renew it from here: one copy of its ids for the
    /// turn, where the holder and the renewals each kept the lease and the fence its run id.
    lease: Lease,
    lost: AtomicBool,
    /// Taken (and asked) by the first closing write; `None` after, or for a lease nobody holds
    /// for long.
    on_close: Mutex<Option<CloseHook>>,
    /// What the hook answered: the closing write may give the lease up.
    release_at_close: AtomicBool,
    /// The closing write gave the lease up: nothing is left to release.
    released: AtomicBool,
    /// Fired on loss: the turn's interrupt, so dispatch stops and interruptible calls cancel.
    stop: CancellationToken,
    /// How long a write that failed with a store outage may be tried again: as long as a
    /// renewed lease can stay proven held without a renewal (zero for a lease nobody renews).
    patience: Duration,
    /// Outcomes sent and not yet answered: the run's next write waits for them. Made by the
    /// first write that goes on in flight: a turn on a store that answers at once (or that
    /// runs no call) never makes one, and every run in flight holds its fence.
    in_flight: OnceLock<Box<InFlight>>,
}

impl std::fmt::Debug for Fence {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Fence")
            .field("run_id", &self.lease.run_id)
            .field("token", &self.lease.token)
            .field("lost", &self.lost)
            .field("released", &self.released)
            .finish_non_exhaustive()
    }
}

impl Fence {
    /// The fence of a lease held only for a moment (nobody renews it): a failed write is not
    /// tried again.
    pub(crate) fn new(lease: &Lease, stop: CancellationToken) -> Arc<Self> {
        Self::renewed(lease.clone(), stop, Duration::ZERO)
    }

    /// The fence of a renewed lease: a failed write of an outcome in hand may be tried again
    /// for `patience` (the renewals lose the fence sooner if the lease lapses).
    pub(crate) fn renewed(lease: Lease, stop: CancellationToken, patience: Duration) -> Arc<Self> {
        let lost = AtomicBool::new(false);
        let (on_close, release_at_close, released) = (Mutex::new(None), AtomicBool::new(false), AtomicBool::new(false));
        let in_flight = OnceLock::new();
        Arc::new(Self { lease, lost, on_close, release_at_close, released, stop, patience, in_flight })
    }

    /// Sets what a closing write asks before giving the lease up with the run's last write.
    pub(crate) fn on_close(&self, hook: CloseHook) {
        *self.on_close.lock().unwrap_or_else(PoisonError::into_inner) = Some(hook);
    }

    /// Whether the turn's closing write may give the lease up: asks the hook once (which then
    /// stops renewing the lease), and answers the same to a retried closing write.
    pub(crate) fn may_release_at_close(&self) -> bool {
        let hook = self.on_close.lock().unwrap_or_else(PoisonError::into_inner).take();
        if let Some(hook) = hook
            && hook()
        {
            self.release_at_close.store(true, Ordering::SeqCst);
        }
        self.release_at_close.load(Ordering::SeqCst)
    }

    /// Notes that the closing write gave the lease up.
    pub(crate) fn mark_released(&self) {
        self.released.store(true, Ordering::SeqCst);
    }

    /// Whether the closing write gave the lease up (so the holder has nothing to release).
    pub(crate) fn is_released(&self) -> bool {
        self.released.load(Ordering::SeqCst)
    }

    /// How long a failed write of an outcome in hand may be tried again.
    pub(crate) fn patience(&self) -> Duration {
        self.patience
    }

    pub(crate) fn run_id(&self) -> &str {
        &self.lease.run_id
    }

    pub(crate) fn token(&self) -> u64 {
        self.lease.token
    }

    /// The lease as it was granted (its expiry is the grant's).
    pub(crate) fn lease(&self) -> &Lease {
        &self.lease
    }

    pub(crate) fn is_lost(&self) -> bool {
        self.lost.load(Ordering::SeqCst)
    }

    /// Another owner took over (or the lease was released): stop at once.
    pub(crate) fn lose(&self) {
        if !self.lost.swap(true, Ordering::SeqCst) {
            tracing::warn!(run_id = %self.lease.run_id, token = self.lease.token, "lost the run's lease; stopping this turn");
        }
        self.stop.cancel();
    }

    /// The turn's outcomes in flight (see [`in_flight`](super::in_flight)), made if none were.
    pub(crate) fn in_flight(&self) -> &InFlight {
        self.in_flight.get_or_init(Box::default)
    }

    /// Waits for the turn's outcomes in flight, as every write of the run does before it is
    /// sent; the first that failed is the error of this and every later write.
    pub(crate) async fn written(&self) -> Result<(), StoreError> {
        match self.in_flight.get() {
            Some(in_flight) if !in_flight.is_idle() => {
                // Boxed: every write of the run awaits this, and the wait's state would
                // otherwise widen each of their futures (and so the run's task) for a wait
                // most writes never make.
                Box::pin(in_flight.settled()).await
            }
            _ => Ok(()),
        }
    }

    /// Waits for the turn's outcomes in flight whatever became of them: for what the turn does
    /// either way (giving the lease up, marking the run failed).
    pub(crate) async fn drained(&self) {
        if let Some(in_flight) = self.in_flight.get() {
            // Boxed, as in `written`.
            Box::pin(in_flight.drained()).await;
        }
    }

    /// Whether an outcome of the turn failed to commit: every later write fails with it, so an
    /// outage a write meets is that failure, not one of its own to try again.
    pub(crate) fn outcome_lost(&self) -> bool {
        self.in_flight.get().is_some_and(|in_flight| in_flight.failed())
    }

    /// Lets the turn's parked writes go unread: for a turn dropped before its end.
    pub(crate) fn abandon_in_flight(&self) {
        if let Some(in_flight) = self.in_flight.get() {
            in_flight.abandon();
        }
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
            return Err(RunError::LeaseLost { run_id: self.lease.run_id.clone(), token: self.lease.token });
        }
        result
    }
}
