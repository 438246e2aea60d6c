//! A runtime's instance id ([`RuntimeBuilder::instance_id`](super::RuntimeBuilder::instance_id)):
//! the proof that this process is its one live holder, claimed before the first lease is
//! taken under it, and what happens when that proof is lost.
//!
//! Every entry point that takes a lease ([`claim`](Instance::claim)s first, so no lease is
//! ever taken under `"<id>/"` without the proof held. The first claim also takes back the
//! leases a dead predecessor held (their run ids are kept for
//! [`Runtime::recover`](super::Runtime::recover)). When the proof is lost (a PostgreSQL lock
//! session died), every turn this runtime holds is stopped at once, and the runtime tries to
//! claim the id again in the background; meanwhile entry points claim it themselves.

use std::sync::{
    Arc, Mutex, PoisonError, Weak,
    atomic::{AtomicBool, AtomicU64, Ordering},
};
use std::time::Duration;

use futures::future::BoxFuture;

use super::renewals::Renewals;
use crate::{
    error::RunError,
    store::{InstanceLock, RunStore, StoreError},
};

/// How long claiming a lost instance id back treats a refusal as its own old session still
/// ending, and tries again.
const RECLAIM_GRACE: Duration = Duration::from_secs(3);

/// The longest pause between two attempts to claim a lost instance id back.
const MAX_RECLAIM_BACKOFF: Duration = Duration::from_secs(10);

/// Checks an instance id: not empty, at most 128 bytes, no `/` (it ends the owner prefix, so
/// `a` would take back the runs of `a/b`) and no control characters.
pub(super) fn check_id(id: &str) -> Result<(), RunError> {
    let bad = |why: &str| Err(RunError::Config(format!("instance id `{}`: {why}", id.escape_debug())));
    if id.is_empty() {
        return bad("must not be empty");
    }
    if id.len() > 128 {
        return bad("must be at most 128 bytes");
    }
    if id.contains('/') {
        return bad("must not contain `/` (it separates the instance id from the turn in a lease's owner)");
    }
    if id.chars().any(char::is_control) {
        return bad("must not contain control characters");
    }
    Ok(())
}

/// This runtime's instance: its id and the proof that this process holds it.
pub(crate) struct Instance {
    id: String,
    store: Arc<dyn RunStore>,
    renewals: Arc<Renewals>,
    /// The proof, once claimed (`None` before, or for a store that cannot prove it).
    lock: tokio::sync::Mutex<Option<Box<dyn InstanceLock>>>,
    /// Whether the id is claimed and the proof not lost: the fast path of [`claim`](Self::claim).
    held: AtomicBool,
    /// Bumped each time the proof is lost, so that a lease taken under an earlier claim can
    /// tell.
    generation: AtomicU64,
    /// Runs taken back from a predecessor and not yet handed to `recover`.
    taken: Mutex<Vec<String>>,
}

/// The claim a lease was taken under; [`Instance::holds`] says whether it still stands. A
/// runtime without an instance id has the empty claim, which always holds.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Claim(Option<u64>);

impl Instance {
    pub(super) fn new(id: String, store: Arc<dyn RunStore>, renewals: Arc<Renewals>) -> Arc<Self> {
        Arc::new(Self {
            id,
            store,
            renewals,
            lock: tokio::sync::Mutex::new(None),
            held: AtomicBool::new(false),
            generation: AtomicU64::new(0),
            taken: Mutex::new(Vec::new()),
        })
    }

    pub(crate) fn id(&self) -> &str {
        &self.id
    }

    /// Claims the id if this process does not hold it yet (or lost it): takes the store's
    /// proof and takes back every lease a predecessor held under the id.
    pub(crate) async fn claim(self: &Arc<Self>) -> Result<Claim, RunError> {
        // The generation is read before `held`: a loss sets `held` first and bumps the
        // generation second, so a claim that saw `held` either has the generation the loss
        // bumps (and `holds` fails after it) or a later one.
        let generation = self.generation.load(Ordering::SeqCst);
        if self.held.load(Ordering::SeqCst) {
            return Ok(Claim(Some(generation)));
        }
        let mut slot = self.lock.lock().await;
        let generation = self.generation.load(Ordering::SeqCst);
        if self.held.load(Ordering::SeqCst) {
            return Ok(Claim(Some(generation)));
        }
        // A lost proof: let it go (a PostgreSQL lock's session closes) before seeking another.
        let lost_before = slot.take().is_some();
        let grace = tokio::time::Instant::now() + RECLAIM_GRACE;
        let lock = loop {
            match self.store.lock_instance(&self.id).await {
                Ok(lock) => break lock,
                // The session that held our lost proof may still be ending on the server (a
                // terminated backend tells its client before it lets its locks go).
                Err(StoreError::InstanceInUse { .. }) if lost_before && tokio::time::Instant::now() < grace => {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                Err(StoreError::InstanceInUse { instance_id, holder }) => {
                    return Err(RunError::InstanceInUse { instance_id, holder });
                }
                Err(e) => return Err(e.into()),
            }
        };
        let lost = match &lock {
            Some(lock) => {
                let taken = lock.take_back().await?;
                if !taken.is_empty() {
                    tracing::info!(
                        instance_id = %self.id,
                        runs = taken.len(),
                        "took back the runs a previous process of this instance held"
                    );
                }
                self.taken.lock().unwrap_or_else(PoisonError::into_inner).extend(taken);
                Some(lock.lost())
            }
            None => {
                tracing::warn!(
                    instance_id = %self.id,
                    "the store cannot prove that an earlier process of this instance is gone: its runs are not \
                     taken back, and wait for their leases to expire"
                );
                None
            }
        };
        *slot = lock;
        self.held.store(true, Ordering::SeqCst);
        if let Some(lost) = lost {
            tokio::spawn(watch(lost, Arc::downgrade(self)));
        }
        Ok(Claim(Some(generation)))
    }

    /// Whether `claim` still stands (the proof was not lost since).
    pub(crate) fn holds(&self, claim: Claim) -> bool {
        claim.0.is_none_or(|generation| self.generation.load(Ordering::SeqCst) == generation)
    }

    /// The runs taken back from a predecessor since the last call.
    pub(crate) fn take_taken(&self) -> Vec<String> {
        std::mem::take(&mut *self.taken.lock().unwrap_or_else(PoisonError::into_inner))
    }

    /// The proof is gone: stop every turn (another process may now take their runs back).
    fn lose(&self) {
        self.held.store(false, Ordering::SeqCst);
        self.generation.fetch_add(1, Ordering::SeqCst);
        // After the bump: a lease registered before it is lost here; one registered after it
        // sees the new generation and loses itself (see `entry`).
        self.renewals.lose_all();
    }
}

/// Waits for the proof to be lost; then stops every turn and claims the id back, with backoff,
/// for as long as the runtime lives.
fn watch(lost: BoxFuture<'static, ()>, instance: Weak<Instance>) -> BoxFuture<'static, ()> {
    Box::pin(async move {
        lost.await;
        let Some(this) = instance.upgrade() else { return };
        tracing::error!(
            instance_id = %this.id,
            "lost the proof that this process holds its instance id; stopping every turn it runs and claiming the id back"
        );
        this.lose();
        drop(this);
        let mut backoff = Duration::from_millis(100);
        loop {
            tokio::time::sleep(backoff).await;
            let Some(this) = instance.upgrade() else { return };
            match this.claim().await {
                Ok(_) => {
                    tracing::info!(instance_id = %this.id, "claimed the instance id back");
                    return;
                }
                Err(e) => tracing::warn!(instance_id = %this.id, error = %e, "claiming the instance id back failed"),
            }
            backoff = (backoff * 2).min(MAX_RECLAIM_BACKOFF);
        }
    })
}

impl Claim {
    /// The claim of a runtime without an instance id.
    pub(crate) fn none() -> Self {
        Self(None)
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use tokio_util::sync::CancellationToken;

    use super::*;
    use crate::journal::Fence;
    use crate::stores::MemoryStore;

    #[test]
    fn instance_ids_that_would_break_the_owner_prefix_are_refused() {
        assert!(check_id("app-1").is_ok());
        assert!(check_id("worker.eu-west-1:7").is_ok());
        for bad in ["", "a/b", "tab\there", &"x".repeat(129)] {
            assert!(matches!(check_id(bad), Err(RunError::Config(_))), "{bad:?}");
        }
    }

    #[tokio::test(start_paused = true)]
    async fn losing_the_proof_loses_every_held_lease_and_claims_bump_the_generation() {
        let store: Arc<dyn RunStore> = Arc::new(MemoryStore::new());
        let renewals = Renewals::new(Arc::clone(&store), Duration::from_secs(3));
        let instance = Instance::new("app-1".into(), Arc::clone(&store), Arc::clone(&renewals));
        let claim = instance.claim().await.unwrap();
        assert!(instance.holds(claim));
        let lease = store.acquire_lease("r", "app-1/t", Duration::from_secs(3)).await.unwrap();
        let stop = CancellationToken::new();
        let fence = Fence::new(&lease, stop.clone());
        let _registration = renewals.register(Arc::clone(&fence), tokio::time::Instant::now());

        instance.lose();
        assert!(fence.is_lost() && stop.is_cancelled(), "the turn is told to stop");
        assert!(!instance.holds(claim), "a claim from before the loss no longer stands");
        // Claimed again: the lost proof is let go first, then sought anew.
        let again = instance.claim().await.unwrap();
        assert!(instance.holds(again) && !instance.holds(claim));
        assert_eq!(instance.take_taken(), ["r"], "the lease left by the lost claim is taken back");
    }
}
