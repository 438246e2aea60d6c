//! Renewing the leases a runtime holds, from one task, and knowing when one can no longer be
//! proven held.
//!
//! A turn registers its lease when it takes it and deregisters it when it gives it back; one
//! task per runtime renews each lease every third of its TTL. It used to be a task per turn:
//! spawned into the worker's LIFO slot beside the turn, displaced to the run queue when the turn
//! woke its caller, and aborted at the turn's end, it woke the other worker about once per run
//! and made every turn a fifth dearer (6.0–6.7 µs instead of 5.0 in the `runtime` bench). The
//! shared task wakes once per renewal period while leases are held, and sleeps on a `Notify`
//! otherwise; a registration wakes it only when it is due before the task's next wake-up.
//!
//! Leases due within a short window of each other ([`Renewals::coalesce`], a tenth of the
//! renewal period) are renewed together, in batches of at most [`MAX_BATCH`] leases, each batch
//! one request ([`RunStore::renew_leases`]: one statement on PostgreSQL, one write of the
//! group commit on SQLite): a process with 10,000 runs in flight and the default 30 s TTL makes
//! about ten renewal requests per 10 s period instead of a thousand a second. Each lease keeps
//! its own outcome: one taken over is fenced, the others in its batch are renewed all the same.
//! Each batch has a deadline: one that hangs (a store connection stuck in a half-open socket)
//! delays only the leases in it, never the other batches, and once it is given up on its
//! leases are tried again each in a request of its own (so one lease whose renewal hangs
//! cannot hold its batch-mates up twice; after a success a lease is batched again). The
//! request given up on is not cancelled: on a slow store (SQLite commits queued behind
//! commits) it is often the first to come back, and its answer still counts.
//!
//! A lease is held only as long as a renewal proves it: its **local deadline** is the moment
//! the last successful renewal covering it was sent plus the TTL, less a safety margin; a
//! batch that fails moves no lease's deadline. The store counts the TTL from when it received
//! that renewal, later, so no other process can take the run over before the local deadline.
//! The next renewal is due a period after that same moment, never after the answer: a store
//! that answers slowly must not push each renewal back by its latency until one lands past
//! the deadline. When the deadline passes without a newer success (the store is unreachable from
//! here, perhaps not from elsewhere) the lease is treated as lost: the turn stops dispatching
//! and its interruptible calls are cancelled, before anyone else may run them.
//!
//! Releasing a lease goes through here too: a release that fails while the store is down is
//! tried again in the background, so a short outage delays the run's next owner by about the
//! outage, not by the whole TTL.

use std::{
    collections::HashMap,
    sync::{Arc, Mutex, PoisonError, Weak},
    time::Duration,
};

use tokio::{sync::Notify, task::JoinHandle, time::Instant};

use crate::journal::Fence;
use crate::store::{Lease, RunStore, StoreError};

/// The first pause before a failed release is tried again; it doubles up to [`MAX_RELEASE_PAUSE`].
const FIRST_RELEASE_PAUSE: Duration = Duration::from_millis(50);
const MAX_RELEASE_PAUSE: Duration = Duration::from_secs(1);

/// The most leases one renewal request carries: a PostgreSQL statement with two arrays of this
/// length, or one SQLite write, stays well under a millisecond of the store's time.
pub(crate) const MAX_BATCH: usize = 1000;

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
    /// Releases that failed, to try again.
    releases: Vec<Release>,
    /// The renewing task, once started (it ends with the Tokio runtime it was spawned on; the
    /// next registration starts another).
    task: Option<JoinHandle<()>>,
    /// When the task wakes next; `None` while it waits for a registration.
    wakes_at: Option<Instant>,
}

/// One registered lease: its turn's fence (which holds the lease), when it is due, and until
/// when it is proven held.
struct Entry {
    fence: Arc<Fence>,
    due: Instant,
    /// The local deadline: past it, the lease is lost.
    deadline: Instant,
    /// A renewal of it is in flight.
    renewing: bool,
    /// Its last renewal failed: the next goes in a request of its own, so that a request that
    /// hangs for one lease (a stuck connection, a lock) does not hold up leases batched with
    /// it a second time.
    alone: bool,
}

/// A release to try again at `due`, until `gives_up` (after which the lease has expired anyway).
struct Release {
    lease: Lease,
    due: Instant,
    pause: Duration,
    gives_up: Instant,
}

/// Leases renewed in one request: their registrations and their turns' fences (which hold the
/// leases).
type Batch = Vec<(u64, Arc<Fence>)>;

/// A registration; deregister it with [`Renewals::deregister`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Registration(u64);

/// What the task does on one wake-up, decided under the lock and done outside it.
#[derive(Default)]
struct Work {
    /// Renewals to send, at most [`MAX_BATCH`] a request.
    renew: Vec<Batch>,
    release: Vec<Release>,
    lapsed: Vec<Arc<Fence>>,
}

impl Renewals {
    pub(crate) fn new(store: Arc<dyn RunStore>, ttl: Duration) -> Arc<Self> {
        Arc::new(Self { store, ttl, state: Mutex::default(), wake: Arc::new(Notify::new()) })
    }

    /// How often a lease is renewed: a third of its TTL, so two renewals can fail before it
    /// lapses.
    fn period(&self) -> Duration {
        (self.ttl / 3).max(Duration::from_millis(1))
    }

    /// How long after a failed renewal the next one is tried: soon, so a short outage costs
    /// little of the TTL, but not in a tight loop.
    fn retry_pause(&self) -> Duration {
        (self.period() / 4).max(Duration::from_millis(1))
    }

    /// How early a lease may be renewed, to go in the same request as another that is due: a
    /// tenth of the period, so renewals of many leases go out together at most ten times a
    /// period. Renewing early costs nothing but the renewal: the deadline moves from the
    /// moment the request is sent.
    fn coalesce(&self) -> Duration {
        self.period() / 10
    }

    /// How much earlier than the store could expire it a lease counts as lost here: the time a
    /// cancellation takes to reach the calls (their grace is 50 ms), with room for clocks that
    /// run at slightly different rates.
    fn margin(&self) -> Duration {
        self.ttl / 10
    }

    /// How long one successful renewal proves a lease held: the TTL less the margin.
    pub(crate) fn proven_for(&self) -> Duration {
        self.ttl.saturating_sub(self.margin())
    }

    /// The local deadline of a lease whose renewal (or grant) was sent at `sent`.
    fn deadline_from(&self, sent: Instant) -> Instant {
        sent + self.proven_for()
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        // Nothing under the lock can panic halfway through an update.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Renews `lease` until deregistered. A renewal that is fenced loses `fence`, and so does
    /// the local deadline passing, counted from `granted` (when the request that granted the
    /// lease was sent). The first renewal is due a period after that moment too, not after the
    /// grant's answer came back: on a slow store (a grant waiting behind a commit) counting from
    /// the answer left the first renewal no time to return before the deadline, and leases the
    /// store still held were given up.
    pub(crate) fn register(self: &Arc<Self>, fence: Arc<Fence>, granted: Instant) -> Registration {
        let due = granted + self.period();
        let deadline = self.deadline_from(granted);
        let mut state = self.state();
        let id = state.next_id;
        state.next_id += 1;
        state.held.insert(id, Entry { fence, due, deadline, renewing: false, alone: false });
        self.ensure_task(&mut state);
        self.wake_for(&mut state, due.min(deadline));
        Registration(id)
    }

    /// Stops renewing a registered lease.
    pub(crate) fn deregister(&self, registration: Registration) {
        self.state().held.remove(&registration.0);
    }

    /// Gives `lease` back. If the store cannot be reached, the release is tried again in the
    /// background until it succeeds or the lease would have expired anyway.
    pub(crate) async fn release(self: &Arc<Self>, lease: Lease) {
        let store = Arc::clone(&self.store);
        match store.release_lease(&lease).await {
            Ok(()) => {}
            Err(e) if e.is_retryable() => {
                tracing::debug!(run_id = %lease.run_id, error = %e, "releasing the lease failed; trying again");
                let now = Instant::now();
                let due = now + FIRST_RELEASE_PAUSE;
                let mut state = self.state();
                state.releases.push(Release { lease, due, pause: FIRST_RELEASE_PAUSE, gives_up: now + self.ttl });
                self.ensure_task(&mut state);
                self.wake_for(&mut state, due);
            }
            // Fenced: someone else holds it already. Anything else: expiry gives it up.
            Err(e) => tracing::debug!(run_id = %lease.run_id, error = %e, "releasing the lease failed"),
        }
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

    /// Loses the fences of the leases held on `run_id` (the run was cancelled here, so its
    /// turn stops now instead of at its next write or renewal) and stops renewing them.
    pub(crate) fn lose_run(&self, run_id: &str) {
        let mut lost = Vec::new();
        self.state().held.retain(|_, entry| {
            if entry.fence.run_id() == run_id {
                lost.push(Arc::clone(&entry.fence));
                return false;
            }
            true
        });
        for fence in lost {
            fence.lose();
        }
    }

    fn ensure_task(self: &Arc<Self>, state: &mut State) {
        if state.task.as_ref().is_none_or(JoinHandle::is_finished) {
            state.task = Some(tokio::spawn(keep(Arc::downgrade(self), Arc::clone(&self.wake))));
            state.wakes_at = None;
        }
    }

    /// Wakes the task if `at` comes before its next wake-up.
    fn wake_for(&self, state: &mut State, at: Instant) {
        if state.wakes_at.is_none_or(|wakes| at < wakes) {
            // A permit is kept if the task is not waiting yet: no registration is missed.
            self.wake.notify_one();
        }
    }

    /// Takes what is due at `now`: renewals to send (marked in flight), releases to retry,
    /// and the fences of leases whose local deadline passed (removed: they are lost).
    fn take_work(&self, now: Instant) -> Work {
        let mut state = self.state();
        let mut work = Work::default();
        let mut renew = Vec::new();
        let soon = now + self.coalesce();
        state.held.retain(|&id, held| {
            if held.deadline <= now {
                work.lapsed.push(Arc::clone(&held.fence));
                return false;
            }
            if held.due <= soon && !held.renewing {
                held.renewing = true;
                let renewal = (id, Arc::clone(&held.fence));
                if held.alone {
                    work.renew.push(vec![renewal]);
                } else {
                    renew.push(renewal);
                }
            }
            true
        });
        while renew.len() > MAX_BATCH {
            let rest = renew.split_off(MAX_BATCH);
            work.renew.push(std::mem::replace(&mut renew, rest));
        }
        if !renew.is_empty() {
            work.renew.push(renew);
        }
        let (due, waiting): (Vec<Release>, Vec<Release>) =
            std::mem::take(&mut state.releases).into_iter().partition(|r| r.due <= now);
        state.releases = waiting;
        // Past `gives_up` the lease has expired: nothing is left to release. One that fails
        // again is queued anew by `released`.
        work.release = due.into_iter().filter(|r| r.gives_up > now).collect();
        state.wakes_at = None;
        work
    }

    /// When the task must wake next (recorded), or `None` when nothing is held or queued.
    fn next_wake(&self) -> Option<Instant> {
        let mut state = self.state();
        let leases = state.held.values().map(|h| if h.renewing { h.deadline } else { h.due.min(h.deadline) });
        let releases = state.releases.iter().map(|r| r.due);
        state.wakes_at = leases.chain(releases).min();
        state.wakes_at
    }

    /// Notes a batch's result, sent at `sent`: each lease renewed moves its deadline to
    /// `sent` plus the TTL less the margin; a fenced one loses its fence; the others (or all,
    /// when the request as a whole failed) are tried again soon.
    fn renewed(&self, batch: Batch, sent: Instant, result: Result<Vec<Result<Lease, StoreError>>, StoreError>) {
        let results: Vec<Result<Lease, StoreError>> = match result {
            Ok(results) if results.len() == batch.len() => results,
            Ok(results) => {
                // Which answer is whose cannot be told: none of them proves a lease held.
                tracing::warn!(
                    leases = batch.len(),
                    answers = results.len(),
                    "the store's renewals do not match the leases"
                );
                let message = "the store answered a different number of renewals";
                vec![Err(StoreError::Unavailable(message.into())); batch.len()]
            }
            Err(e) => {
                // A store outage, or a request that took too long. If no renewal succeeds
                // before a lease's local deadline, it is lost then.
                tracing::warn!(leases = batch.len(), error = %e, "renewing leases failed");
                vec![Err(e); batch.len()]
            }
        };
        let now = Instant::now();
        let mut state = self.state();
        let mut next: Option<Instant> = None;
        for ((id, fence), result) in batch.into_iter().zip(results) {
            let at = match result {
                // The renewed lease differs only in its expiry, which the local deadline
                // replaces; the next renewal sends the lease as granted (a store renews by token).
                Ok(_) => {
                    let Some(held) = state.held.get_mut(&id) else { continue };
                    held.renewing = false;
                    held.alone = false;
                    // The cadence counts from the request, as the deadline does: a slow
                    // answer must not push every later renewal back by its own latency.
                    held.due = sent + self.period();
                    held.deadline = self.deadline_from(sent);
                    held.due
                }
                Err(StoreError::Fenced { .. }) => {
                    // A lease no longer registered was given up by its turn (its closing write
                    // may have released it while this renewal was in flight): not a loss.
                    if state.held.remove(&id).is_some() {
                        fence.lose();
                    }
                    continue;
                }
                Err(e) => {
                    let Some(held) = state.held.get_mut(&id) else { continue };
                    if !matches!(e, StoreError::Unavailable(_)) {
                        tracing::warn!(run_id = %fence.run_id(), error = %e, "renewing the lease failed");
                    }
                    held.renewing = false;
                    held.alone = true;
                    held.due = now + self.retry_pause();
                    held.due.min(held.deadline)
                }
            };
            next = Some(next.map_or(at, |n| n.min(at)));
        }
        if let Some(next) = next {
            self.wake_for(&mut state, next);
        }
    }

    /// Notes the answer to a request that was given up on as too slow (its leases were sent
    /// again since): a lease it renewed is proven held from `sent` unless a later request
    /// proved it longer; a fenced one loses its fence. Nothing else changes: the retry in
    /// flight settles the rest.
    fn renewed_late(&self, batch: Batch, sent: Instant, results: Vec<Result<Lease, StoreError>>) {
        if results.len() != batch.len() {
            return;
        }
        let deadline = self.deadline_from(sent);
        let mut state = self.state();
        for ((id, fence), result) in batch.into_iter().zip(results) {
            match result {
                Ok(_) => {
                    let Some(held) = state.held.get_mut(&id) else { continue };
                    if deadline > held.deadline {
                        held.deadline = deadline;
                    }
                }
                Err(StoreError::Fenced { .. }) => {
                    if state.held.remove(&id).is_some() {
                        fence.lose();
                    }
                }
                Err(_) => {}
            }
        }
    }

    /// Notes a retried release's result.
    fn released(&self, retried: Release, result: Result<(), StoreError>) {
        let Release { lease, pause, gives_up, .. } = retried;
        match result {
            Ok(()) => tracing::debug!(run_id = %lease.run_id, "released the lease after a retry"),
            Err(e) if e.is_retryable() => {
                let pause = (pause * 2).min(MAX_RELEASE_PAUSE);
                let due = Instant::now() + pause;
                let mut state = self.state();
                state.releases.push(Release { lease, due, pause, gives_up });
                self.wake_for(&mut state, due);
            }
            Err(e) => tracing::debug!(run_id = %lease.run_id, error = %e, "releasing the lease failed"),
        }
    }
}

impl Drop for Renewals {
    fn drop(&mut self) {
        if let Some(task) = self.state().task.take() {
            task.abort();
        }
    }
}

/// The renewing task: sends what is due, each batch of renewals and each retried release a
/// task of its own, loses the leases whose deadline passed, then sleeps until the next thing
/// is due or a registration wakes it. It holds the runtime's leases only weakly, so it ends with them.
async fn keep(renewals: Weak<Renewals>, wake: Arc<Notify>) {
    loop {
        let Some(this) = renewals.upgrade() else { return };
        let now = Instant::now();
        let work = this.take_work(now);
        for fence in work.lapsed {
            tracing::warn!(
                run_id = %fence.run_id(),
                "no renewal of the lease succeeded within its TTL (less a safety margin); it can no longer be proven held"
            );
            fence.lose();
        }
        for batch in work.renew {
            let (weak, store, ttl, limit) = (Weak::clone(&renewals), Arc::clone(&this.store), this.ttl, this.period());
            tokio::spawn(async move {
                let leases: Vec<Lease> = batch.iter().map(|(_, fence)| fence.lease().clone()).collect();
                let mut request = tokio::spawn(async move { store.renew_leases(&leases, ttl).await });
                let answer = match tokio::time::timeout(limit, &mut request).await {
                    Ok(joined) => joined,
                    Err(_) => {
                        // Too slow: its leases are tried again, each alone, without waiting
                        // for it. It goes on, though: on a slow store (commits queued behind
                        // commits) it is often the one that comes back in time, and its
                        // answer still proves the leases from when it was sent.
                        if let Some(this) = weak.upgrade() {
                            let late =
                                StoreError::Unavailable(format!("the renewal took longer than {limit:?}").into());
                            this.renewed(batch.clone(), now, Err(late));
                        }
                        if let (Ok(Ok(results)), Some(this)) = (request.await, weak.upgrade()) {
                            this.renewed_late(batch, now, results);
                        }
                        return;
                    }
                };
                let result =
                    answer.unwrap_or_else(|e| Err(StoreError::Unavailable(format!("the renewal failed: {e}").into())));
                if let Some(this) = weak.upgrade() {
                    this.renewed(batch, now, result);
                }
            });
        }
        for retried in work.release {
            let (weak, store, limit) = (Weak::clone(&renewals), Arc::clone(&this.store), this.period());
            tokio::spawn(async move {
                let result = within(limit, "release", store.release_lease(&retried.lease)).await;
                if let Some(this) = weak.upgrade() {
                    this.released(retried, result);
                }
            });
        }
        let next = this.next_wake();
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
/// A store request cut off after `limit`, as an outage: one that hangs must not hold up the
/// lease it is for.
async fn within<T>(
    limit: Duration,
    what: &str,
    request: impl std::future::Future<Output = Result<T, StoreError>>,
) -> Result<T, StoreError> {
    match tokio::time::timeout(limit, request).await {
        Ok(result) => result,
        Err(_) => Err(StoreError::Unavailable(format!("the {what} took longer than {limit:?}").into())),
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
        let (_, fence_a, _) = take(&store, "a").await;
        let registered_a = renewals.register(fence_a, Instant::now());
        tokio::time::sleep(Duration::from_secs(2)).await;
        let (_, fence_b, _) = take(&store, "b").await;
        let _registered_b = renewals.register(fence_b, Instant::now());
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
        let _registered = renewals.register(Arc::clone(&fence), Instant::now());
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
        let (_, fence, _) = take(&store, "a").await;
        renewals.register(fence, Instant::now());
        let task = renewals.state().task.as_ref().map(JoinHandle::abort_handle).unwrap();
        drop(renewals);
        tokio::task::yield_now().await;
        assert!(task.is_finished(), "dropping the runtime's renewals stops their task");
    }
}
