//! One owner per run: a turn takes the run's lease before it reads the journal, renews it in
//! the background, writes under its fencing token, and gives it back when the turn closes.

use std::{
    sync::{
        Arc, OnceLock,
        atomic::{AtomicBool, Ordering},
    },
    time::Duration,
};

use tokio_util::sync::CancellationToken;

use super::renewals::{Registration, Renewals};
use crate::{Lease, RunError, RunStore, StoreError};

/// Default [`RuntimeBuilder::lease_ttl`](crate::RuntimeBuilder::lease_ttl): 30 s.
///
/// A holder renews every third of it, so a process that dies (or stops) gives its runs up to
/// another process at most this long after its last renewal.
///
/// ```
/// assert_eq!(kuralle::DEFAULT_LEASE_TTL, std::time::Duration::from_secs(30));
/// ```
pub const DEFAULT_LEASE_TTL: Duration = Duration::from_secs(30);

/// The longest pause between two attempts of [`RunRequest::wait_for_lease`](crate::RunRequest::wait_for_lease).
const MAX_BACKOFF: Duration = Duration::from_millis(500);

/// A unique owner id for one holder: `"<process uuid>/<turn uuid>"`, so an operator can tell
/// which process holds a run and two turns in one process never share a lease.
pub(crate) fn owner_id() -> String {
    static PROCESS: OnceLock<String> = OnceLock::new();
    let process = PROCESS.get_or_init(|| uuid::Uuid::new_v4().to_string());
    format!("{process}/{}", uuid::Uuid::new_v4())
}

/// Takes the run's lease. Held by another owner: [`RunError::Busy`] at once, or, with
/// `wait`, after polling (with backoff, on Tokio's clock) until `wait` has passed.
pub(crate) async fn acquire(
    store: &dyn RunStore,
    run_id: &str,
    ttl: Duration,
    wait: Option<Duration>,
) -> Result<Lease, RunError> {
    let owner = owner_id();
    let deadline = wait.map(|w| tokio::time::Instant::now() + w);
    let mut backoff = Duration::from_millis(10);
    loop {
        match store.acquire_lease(run_id, &owner, ttl).await {
            Ok(lease) => return Ok(lease),
            Err(StoreError::LeaseHeld { run_id, owner, expires_at_ms }) => {
                let now = tokio::time::Instant::now();
                match deadline {
                    Some(deadline) if now < deadline => {
                        // Poll again at the latest just after the holder's lease would expire
                        // (a crashed holder's run is taken over promptly), else back off.
                        let until_expiry = u64::try_from(expires_at_ms.saturating_sub(crate::clock::now_ms()))
                            .map_or(Duration::ZERO, Duration::from_millis);
                        let pause = backoff.min(until_expiry + Duration::from_millis(2)).min(deadline - now);
                        tokio::time::sleep(pause).await;
                        backoff = (backoff * 2).min(MAX_BACKOFF);
                    }
                    _ => return Err(RunError::Busy { run_id, owner, expires_at_ms }),
                }
            }
            Err(e) => return Err(e.into()),
        }
    }
}

/// The fencing token a turn writes under, and whether the turn lost it.
#[derive(Debug)]
pub(crate) struct Fence {
    run_id: String,
    token: u64,
    lost: AtomicBool,
    /// Fired on loss: the turn's interrupt, so dispatch stops and interruptible calls cancel.
    stop: CancellationToken,
}

impl Fence {
    pub(crate) fn new(lease: &Lease, stop: CancellationToken) -> Arc<Self> {
        Arc::new(Self { run_id: lease.run_id.clone(), token: lease.token, lost: AtomicBool::new(false), stop })
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

/// A held lease, renewed by the runtime's [`Renewals`] every `ttl / 3` until released.
pub(crate) struct Held {
    lease: Lease,
    fence: Arc<Fence>,
    renewals: Arc<Renewals>,
    registration: Registration,
}

impl Held {
    /// Starts renewing `lease`; a renewal that is fenced loses the fence (and fires `stop`).
    pub(crate) fn start(renewals: &Arc<Renewals>, lease: Lease, stop: CancellationToken) -> Self {
        let fence = Fence::new(&lease, stop);
        let registration = renewals.register(lease.clone(), Arc::clone(&fence));
        Self { lease, fence, renewals: Arc::clone(renewals), registration }
    }

    pub(crate) fn fence(&self) -> &Arc<Fence> {
        &self.fence
    }

    /// Stops renewing and gives the run up; a lost lease is not released (it is not ours).
    pub(crate) async fn release(self) {
        self.renewals.deregister(self.registration);
        if self.fence.is_lost() {
            return;
        }
        if let Err(e) = self.renewals.store().release_lease(&self.lease).await {
            // Expiry gives it up anyway; nothing else to do.
            tracing::debug!(run_id = %self.lease.run_id, error = %e, "releasing the lease failed");
        }
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        // A turn task that is aborted never reaches `release`: stop renewing at least.
        self.renewals.deregister(self.registration);
    }
}
