//! One owner per run: a turn takes the run's lease before it reads the journal, renews it in
//! the background, writes under its fencing token, and gives it back when the turn closes.

use std::{
    sync::{Arc, OnceLock},
    time::Duration,
};

use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::renewals::{Registration, Renewals};
use crate::dispatch::Stragglers;
use crate::{
    error::RunError,
    journal::Fence,
    store::{Lease, RunRecord, RunStore, StoreError, StoreFuture},
};

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

/// A unique owner id for one holder: `"<instance id>/<turn uuid>"` for a runtime with an
/// instance id, else `"<process uuid>/<turn uuid>"`, so an operator can tell which process
/// (or instance) holds a run and two turns in one process never share a lease.
pub(crate) fn owner_id(instance: Option<&str>) -> String {
    static PROCESS: OnceLock<String> = OnceLock::new();
    let process = instance.unwrap_or_else(|| PROCESS.get_or_init(|| uuid::Uuid::new_v4().to_string()));
    // Sized up front: `format!` grew the string four times, on every turn of every run.
    let mut owner = String::with_capacity(process.len() + 1 + uuid::fmt::Hyphenated::LENGTH);
    owner.push_str(process);
    owner.push('/');
    owner.push_str(uuid::Uuid::new_v4().hyphenated().encode_lower(&mut uuid::Uuid::encode_buffer()));
    owner
}

/// Takes the run's lease for `owner`; returns it with the moment the request that got it was
/// sent (its local deadline counts from there). Held by another owner: [`RunError::Busy`] at once, or,
/// with `wait`, after polling (with backoff, on Tokio's clock) until `wait` has passed.
pub(crate) async fn acquire(
    store: &dyn RunStore,
    owner: &str,
    run_id: &str,
    ttl: Duration,
    wait: Option<Duration>,
) -> Result<(Lease, Instant), RunError> {
    attempt(wait, || store.acquire_lease(run_id, owner, ttl)).await
}

/// [`acquire`], and the run read under the new lease in the same request
/// ([`RunStore::acquire_lease_and_get_run`]): how a turn starts.
pub(crate) async fn acquire_reading(
    store: &dyn RunStore,
    owner: &str,
    run_id: &str,
    ttl: Duration,
    wait: Option<Duration>,
) -> Result<((Lease, Option<RunRecord>), Instant), RunError> {
    attempt(wait, || store.acquire_lease_and_get_run(run_id, owner, ttl)).await
}

/// [`acquire_reading`] for a run that is probably new (an id this process just made, or a
/// caller's id with a turn's input): the run created from `new` under the new lease, in the
/// same request ([`RunStore::acquire_lease_and_create_run`]), or read when it is there. It
/// does not wait: nobody holds a lease on an id nobody knew, and for a caller's id that
/// another holds, the turn waits with [`acquire_reading`] (see `entry::take_lease`).
pub(crate) async fn acquire_creating(
    store: &dyn RunStore,
    owner: &str,
    new: RunRecord,
    ttl: Duration,
) -> Result<((Lease, Option<RunRecord>), Instant), RunError> {
    let sent = Instant::now();
    match store.acquire_lease_and_create_run(new, owner, ttl).await {
        Ok(granted) => Ok((granted, sent)),
        Err(StoreError::LeaseHeld { run_id, owner, expires_at_ms }) => {
            Err(RunError::Busy { run_id, owner, expires_at_ms })
        }
        Err(e) => Err(e.into()),
    }
}

/// Makes the request `take` until it is granted, as [`acquire`] describes.
async fn attempt<'a, T>(
    wait: Option<Duration>,
    take: impl Fn() -> StoreFuture<'a, T>,
) -> Result<(T, Instant), RunError> {
    let deadline = wait.map(|w| Instant::now() + w);
    let mut backoff = Duration::from_millis(10);
    loop {
        let sent = Instant::now();
        match take().await {
            Ok(granted) => return Ok((granted, sent)),
            Err(StoreError::LeaseHeld { run_id, owner, expires_at_ms }) => {
                let now = Instant::now();
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

/// A held lease, renewed by the runtime's [`Renewals`] every `ttl / 3` until released.
pub(crate) struct Held {
    /// Holds the lease itself (see [`Fence`]).
    fence: Arc<Fence>,
    /// The turn's calls that were cut off but have not ended: the lease outlives them.
    stragglers: Arc<Stragglers>,
    renewals: Arc<Renewals>,
    registration: Registration,
}

impl Held {
    /// Starts renewing `lease`, granted by a request sent at `granted`; a renewal that is
    /// fenced, or none succeeding before the local deadline, loses the fence (and fires `stop`).
    pub(crate) fn start(renewals: &Arc<Renewals>, lease: Lease, granted: Instant, stop: CancellationToken) -> Self {
        let fence = Fence::renewed(lease, stop, renewals.proven_for());
        let registration = renewals.register(Arc::clone(&fence), granted);
        let stragglers: Arc<Stragglers> = Arc::default();
        // The turn's close may give the lease up with the run's last write (one write less)
        // when no call of the turn still runs; renewing stops first, so that a renewal that
        // meets the released lease is not taken for a takeover.
        let (closing, closing_stragglers) = (Arc::clone(renewals), Arc::clone(&stragglers));
        fence.on_close(Box::new(move || {
            let idle = closing_stragglers.is_empty();
            if idle {
                closing.deregister(registration);
            }
            idle
        }));
        Self { fence, stragglers, renewals: Arc::clone(renewals), registration }
    }

    pub(crate) fn fence(&self) -> &Arc<Fence> {
        &self.fence
    }

    pub(crate) fn stragglers(&self) -> &Arc<Stragglers> {
        &self.stragglers
    }

    /// Gives the run up once nothing of the turn runs any more: a call that was cut off but
    /// blocks its thread keeps the lease (renewed, in the background) until it ends, so no
    /// other owner runs it again meanwhile; the turn's caller does not wait for it.
    pub(crate) async fn release(self) {
        match self.stragglers.take().await {
            None => self.release_now().await,
            Some(mut ending) => {
                tokio::spawn(async move {
                    ending.ended().await;
                    self.release_now().await;
                });
            }
        }
    }

    /// Stops renewing and gives the run up (again in the background, if the store is down); a
    /// lost lease is not released (it is not ours).
    async fn release_now(self) {
        // An outcome still in flight is written under this lease, renewed meanwhile: given up
        // first, it would be fenced and lost. Its failure is the turn's, reported already.
        self.fence.drained().await;
        self.renewals.deregister(self.registration);
        if self.fence.is_lost() || self.fence.is_released() {
            return;
        }
        self.renewals.release(self.fence.lease().clone()).await;
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        // A turn task that is aborted never reaches `release`: stop renewing at least, and let
        // its parked writes go (each holds the fence, which holds them).
        self.renewals.deregister(self.registration);
        self.fence.abandon_in_flight();
    }
}

#[cfg(test)]
mod tests {
    use super::owner_id;

    #[test]
    fn owner_ids_name_the_holder_and_never_repeat() {
        let (a, b) = (owner_id(Some("worker-7")), owner_id(Some("worker-7")));
        assert_ne!(a, b);
        let turn = a.strip_prefix("worker-7/").expect("the instance id comes first");
        let parsed = uuid::Uuid::parse_str(turn).expect("then a UUID");
        assert_eq!(parsed.get_version_num(), 4);
        assert_eq!(turn, parsed.hyphenated().to_string(), "hyphenated and lower case");
        assert_eq!(a.len(), a.capacity(), "sized once");

        let (c, d) = (owner_id(None), owner_id(None));
        let (process, _) = c.split_once('/').expect("process uuid / turn uuid");
        assert!(uuid::Uuid::parse_str(process).is_ok());
        assert_eq!(d.split_once('/').map(|(p, _)| p), Some(process), "one process uuid");
        assert_ne!(c, d);
    }
}
