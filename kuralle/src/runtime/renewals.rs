//! Renewing the leases a runtime holds, from one task.
//!
//! A turn registers its lease when it takes it and deregisters it when it gives it back; one
//! task per runtime renews each lease every third of its TTL. It used to be a task per turn:
//! spawned into the worker's LIFO slot beside the turn, displaced to the run queue when the turn
//! woke its caller, and aborted at the turn's end, it woke the other worker about once per run
//! and made every turn a fifth dearer (6.0–6.7 µs instead of 5.0 in the `runtime` bench). The
//! shared task wakes once per renewal period while leases are held, and sleeps on a `Notify`
//! otherwise; a registration wakes it only when it is due before the task's next wake-up.

use std::{
    collections::HashMap,
    sync::{Arc, Mutex, PoisonError, Weak},
    time::Duration,
};

use tokio::{sync::Notify, task::JoinHandle, time::Instant};

use crate::journal::Fence;
use crate::store::{Lease, RunStore, StoreError};

/// The leases of one runtime, and the task that renews them.
pub(crate) struct Renewals {
    store: Arc<dyn RunStore>,
    ttl: Duration,
    state: Mutex<State>,
    /// Wakes the task: a lease is due before its next wake-up.
    wake: Arc<Notify>,
}

#[derive(Default)]
struct State {
    next_id: u64,
    held: HashMap<u64, Entry>,
    /// The renewing task, once started (it ends with the Tokio runtime it was spawned on; the
    /// next registration starts another).
    task: Option<JoinHandle<()>>,
    /// When the task wakes next; `None` while it waits for a registration.
    wakes_at: Option<Instant>,
}

/// One registered lease: the latest renewal of it, its turn's fence, and when it is due.
struct Entry {
    lease: Lease,
    fence: Arc<Fence>,
    due: Instant,
}

/// A registration; deregister it with [`Renewals::deregister`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Registration(u64);

impl Renewals {
    pub(crate) fn new(store: Arc<dyn RunStore>, ttl: Duration) -> Arc<Self> {
        Arc::new(Self { store, ttl, state: Mutex::default(), wake: Arc::new(Notify::new()) })
    }

    /// The store the leases are renewed in (the runtime's).
    pub(crate) fn store(&self) -> &Arc<dyn RunStore> {
        &self.store
    }

    /// How often a lease is renewed: a third of its TTL, so two renewals can fail before it
    /// lapses.
    fn period(&self) -> Duration {
        (self.ttl / 3).max(Duration::from_millis(1))
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        // Nothing under the lock can panic halfway through an update.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Renews `lease` until deregistered; a renewal that is fenced loses `fence`.
    pub(crate) fn register(self: &Arc<Self>, lease: Lease, fence: Arc<Fence>) -> Registration {
        let due = Instant::now() + self.period();
        let mut state = self.state();
        let id = state.next_id;
        state.next_id += 1;
        state.held.insert(id, Entry { lease, fence, due });
        if state.task.as_ref().is_none_or(JoinHandle::is_finished) {
            state.task = Some(tokio::spawn(keep(Arc::downgrade(self), Arc::clone(&self.wake))));
            state.wakes_at = None;
        }
        if state.wakes_at.is_none_or(|at| due < at) {
            // A permit is kept if the task is not waiting yet: no registration is missed.
            self.wake.notify_one();
        }
        Registration(id)
    }

    /// Stops renewing a registered lease.
    pub(crate) fn deregister(&self, registration: Registration) {
        self.state().held.remove(&registration.0);
    }

    /// Loses every registered lease's fence (their turns stop at once) and stops renewing
    /// them: the runtime can no longer prove it is alive (its instance lock is gone), so
    /// another process may take these runs back.
    pub(crate) fn lose_all(&self) {
        let held = std::mem::take(&mut self.state().held);
        for entry in held.into_values() {
            entry.fence.lose();
        }
    }

    /// The leases due for renewal at `now`.
    fn due(&self, now: Instant) -> Vec<(u64, Lease, Arc<Fence>)> {
        let state = self.state();
        state
            .held
            .iter()
            .filter(|(_, held)| held.due <= now)
            .map(|(&id, held)| (id, held.lease.clone(), Arc::clone(&held.fence)))
            .collect()
    }

    /// Notes renewals' results; returns when the task must wake next (and records it).
    fn settle(&self, renewed: Vec<(u64, Arc<Fence>, Result<Lease, StoreError>)>) -> Option<Instant> {
        let next_due = Instant::now() + self.period();
        let mut state = self.state();
        for (id, fence, result) in renewed {
            match result {
                Ok(lease) => {
                    if let Some(held) = state.held.get_mut(&id) {
                        held.lease = lease;
                        held.due = next_due;
                    }
                }
                Err(StoreError::Fenced { .. }) => {
                    fence.lose();
                    state.held.remove(&id);
                }
                // A store outage: try again next period; if it outlasts the lease, the store
                // fences us.
                Err(e) => {
                    tracing::warn!(run_id = %fence.run_id(), error = %e, "renewing the lease failed");
                    if let Some(held) = state.held.get_mut(&id) {
                        held.due = next_due;
                    }
                }
            }
        }
        state.wakes_at = state.held.values().map(|held| held.due).min();
        state.wakes_at
    }
}

impl Drop for Renewals {
    fn drop(&mut self) {
        if let Some(task) = self.state().task.take() {
            task.abort();
        }
    }
}

/// The renewing task: renews what is due, then sleeps until the next lease is due or a
/// registration wakes it. It holds the runtime's leases only weakly, so it ends with them.
async fn keep(renewals: Weak<Renewals>, wake: Arc<Notify>) {
    loop {
        let Some(this) = renewals.upgrade() else { return };
        let due = this.due(Instant::now());
        let renewed = futures::future::join_all(due.into_iter().map(|(id, lease, fence)| {
            let store = Arc::clone(&this.store);
            let ttl = this.ttl;
            async move {
                let result = store.renew_lease(&lease, ttl).await;
                (id, fence, result)
            }
        }))
        .await;
        let next = this.settle(renewed);
        drop(this);
        match next {
            Some(at) => {
                tokio::select! {
                    () = tokio::time::sleep_until(at) => {}
                    () = wake.notified() => {}
                }
            }
            None => wake.notified().await,
        }
    }
}

#[cfg(test)]
mod tests {
    use tokio_util::sync::CancellationToken;

    use super::*;
    use crate::stores::MemoryStore;

    const TTL: Duration = Duration::from_secs(3);

    async fn take(store: &Arc<dyn RunStore>, run_id: &str) -> (Lease, Arc<Fence>, CancellationToken) {
        let lease = store.acquire_lease(run_id, "holder", TTL).await.unwrap();
        let stop = CancellationToken::new();
        let fence = Fence::new(&lease, stop.clone());
        (lease, fence, stop)
    }

    async fn held_by_someone(store: &Arc<dyn RunStore>, run_id: &str) -> bool {
        matches!(store.acquire_lease(run_id, "thief", TTL).await, Err(StoreError::LeaseHeld { .. }))
    }

    #[tokio::test(start_paused = true)]
    async fn held_leases_are_renewed_until_deregistered() {
        let store: Arc<dyn RunStore> = Arc::new(MemoryStore::new());
        let renewals = Renewals::new(Arc::clone(&store), TTL);
        let (a, fence_a, _) = take(&store, "a").await;
        let registered_a = renewals.register(a, fence_a);
        tokio::time::sleep(Duration::from_secs(2)).await;
        let (b, fence_b, _) = take(&store, "b").await;
        let _registered_b = renewals.register(b, fence_b);
        // Three TTLs later both are still held: each was renewed every second.
        tokio::time::sleep(3 * TTL).await;
        assert!(held_by_someone(&store, "a").await);
        assert!(held_by_someone(&store, "b").await);
        // Deregistered, `a` lapses within a TTL; `b` is still renewed.
        renewals.deregister(registered_a);
        tokio::time::sleep(TTL + Duration::from_millis(10)).await;
        assert!(!held_by_someone(&store, "a").await, "the thief takes the lapsed lease");
        assert!(held_by_someone(&store, "b").await);
    }

    #[tokio::test(start_paused = true)]
    async fn a_fenced_renewal_loses_the_fence() {
        let store: Arc<dyn RunStore> = Arc::new(MemoryStore::new());
        let renewals = Renewals::new(Arc::clone(&store), TTL);
        let (lease, fence, stop) = take(&store, "a").await;
        let _registered = renewals.register(lease.clone(), Arc::clone(&fence));
        // Another owner takes the run over.
        store.release_lease(&lease).await.unwrap();
        store.acquire_lease("a", "thief", TTL).await.unwrap();
        tokio::time::sleep(TTL).await;
        assert!(fence.is_lost());
        assert!(stop.is_cancelled(), "the turn is told to stop");
    }

    #[tokio::test(start_paused = true)]
    async fn dropping_the_renewals_stops_their_task() {
        let store: Arc<dyn RunStore> = Arc::new(MemoryStore::new());
        let renewals = Renewals::new(Arc::clone(&store), TTL);
        let (lease, fence, _) = take(&store, "a").await;
        renewals.register(lease, fence);
        let task = renewals.state().task.as_ref().map(JoinHandle::abort_handle).unwrap();
        drop(renewals);
        tokio::task::yield_now().await;
        assert!(task.is_finished(), "dropping the runtime's renewals stops their task");
    }
}
