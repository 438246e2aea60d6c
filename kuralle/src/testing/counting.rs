//! [`CountingStore`]: a pass-through [`RunStore`] that counts what the runtime writes to it
//! (step records, write calls, lease renewals and renewal requests), for benches, capacity
//! planning and tests that assert how many writes something costs.
//!
//! Every method is passed on, provided ones included, so the inner store's own
//! implementations (one-statement claims, one-transaction writes, batched renewals) still run.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use futures::future::BoxFuture;

use crate::store::{
    FinishedStep, FinishedWithIntents, InstanceLock, Lease, NewStep, RunFilter, RunRecord, RunStatus, RunStore,
    RunSummary, StepOutcome, StepRecord, StoreError, StoreFuture,
};

/// Counts of what went through a [`CountingStore`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct WriteCounts {
    /// Step records written: intents, responses journaled finished, outcomes.
    pub steps: u64,
    /// Write calls of any kind (run rows, steps, leases), renewals included.
    pub writes: u64,
    /// Leases renewed (each lease of a batch counts).
    pub renewals: u64,
    /// Renewal requests (`renew_lease` calls, and `renew_leases` calls however many leases
    /// each carries).
    pub renewal_requests: u64,
}

/// A pass-through store that counts writes; clones share the counts.
///
/// ```
/// use std::sync::Arc;
/// use kuralle::{RunStore, stores::MemoryStore, testing::CountingStore};
/// # tokio::runtime::Runtime::new().unwrap().block_on(async {
/// let counting = CountingStore::new(Arc::new(MemoryStore::new()));
/// let lease = counting.acquire_lease("r1", "me", std::time::Duration::from_secs(30)).await.unwrap();
/// counting.renew_leases(&[lease], std::time::Duration::from_secs(30)).await.unwrap();
/// let counts = counting.counts();
/// assert_eq!((counts.writes, counts.renewals, counts.renewal_requests), (2, 1, 1));
/// # });
/// ```
#[derive(Clone)]
pub struct CountingStore {
    inner: Arc<dyn RunStore>,
    steps: Arc<AtomicU64>,
    writes: Arc<AtomicU64>,
    renewals: Arc<AtomicU64>,
    renewal_requests: Arc<AtomicU64>,
}

impl CountingStore {
    /// Wraps `inner`, counting from zero.
    pub fn new(inner: Arc<dyn RunStore>) -> Self {
        Self {
            inner,
            steps: Arc::default(),
            writes: Arc::default(),
            renewals: Arc::default(),
            renewal_requests: Arc::default(),
        }
    }

    /// The counts so far.
    pub fn counts(&self) -> WriteCounts {
        WriteCounts {
            steps: self.steps.load(Ordering::Relaxed),
            writes: self.writes.load(Ordering::Relaxed),
            renewals: self.renewals.load(Ordering::Relaxed),
            renewal_requests: self.renewal_requests.load(Ordering::Relaxed),
        }
    }

    fn count(&self, steps: usize) {
        self.steps.fetch_add(steps as u64, Ordering::Relaxed);
        self.writes.fetch_add(1, Ordering::Relaxed);
    }
}

impl RunStore for CountingStore {
    fn create_run(&self, run: RunRecord, fence: u64) -> StoreFuture<'_, ()> {
        self.count(0);
        self.inner.create_run(run, fence)
    }

    fn get_run<'a>(&'a self, run_id: &'a str) -> StoreFuture<'a, Option<RunRecord>> {
        self.inner.get_run(run_id)
    }

    fn put_run(&self, run: RunRecord, fence: u64) -> StoreFuture<'_, u64> {
        self.count(0);
        self.inner.put_run(run, fence)
    }

    fn put_run_and_release(&self, run: RunRecord, fence: u64) -> StoreFuture<'_, (u64, bool)> {
        self.count(0);
        self.inner.put_run_and_release(run, fence)
    }

    fn put_run_and_release_after(
        &self,
        last: FinishedStep,
        run: RunRecord,
        fence: u64,
    ) -> StoreFuture<'_, (u64, bool)> {
        self.count(1);
        self.inner.put_run_and_release_after(last, run, fence)
    }

    fn list_runs(&self, filter: RunFilter) -> StoreFuture<'_, Vec<RunSummary>> {
        self.inner.list_runs(filter)
    }

    fn delete_run<'a>(&'a self, run_id: &'a str) -> StoreFuture<'a, bool> {
        self.count(0);
        self.inner.delete_run(run_id)
    }

    fn append_steps<'a>(&'a self, run_id: &'a str, fence: u64, steps: Vec<NewStep>) -> StoreFuture<'a, Vec<u64>> {
        self.count(steps.len());
        self.inner.append_steps(run_id, fence, steps)
    }

    fn finish_step<'a>(
        &'a self,
        run_id: &'a str,
        fence: u64,
        ordinal: u64,
        outcome: StepOutcome,
        finished_at_ms: i64,
    ) -> StoreFuture<'a, ()> {
        self.count(1);
        self.inner.finish_step(run_id, fence, ordinal, outcome, finished_at_ms)
    }

    fn append_finished_with_intents<'a>(
        &'a self,
        run_id: &'a str,
        fence: u64,
        write: FinishedWithIntents,
    ) -> StoreFuture<'a, Vec<u64>> {
        self.count(1 + write.intents.len());
        self.inner.append_finished_with_intents(run_id, fence, write)
    }

    fn cancel_run<'a>(&'a self, run_id: &'a str) -> StoreFuture<'a, Option<RunStatus>> {
        self.count(0);
        self.inner.cancel_run(run_id)
    }

    fn steps<'a>(&'a self, run_id: &'a str) -> StoreFuture<'a, Vec<StepRecord>> {
        self.inner.steps(run_id)
    }

    fn acquire_lease<'a>(&'a self, run_id: &'a str, owner: &'a str, ttl: Duration) -> StoreFuture<'a, Lease> {
        self.count(0);
        self.inner.acquire_lease(run_id, owner, ttl)
    }

    fn acquire_lease_and_get_run<'a>(
        &'a self,
        run_id: &'a str,
        owner: &'a str,
        ttl: Duration,
    ) -> StoreFuture<'a, (Lease, Option<RunRecord>)> {
        self.count(0);
        self.inner.acquire_lease_and_get_run(run_id, owner, ttl)
    }

    fn acquire_lease_and_create_run<'a>(
        &'a self,
        new: RunRecord,
        owner: &'a str,
        ttl: Duration,
    ) -> StoreFuture<'a, (Lease, Option<RunRecord>)> {
        self.count(0);
        self.inner.acquire_lease_and_create_run(new, owner, ttl)
    }

    fn renew_lease<'a>(&'a self, lease: &'a Lease, ttl: Duration) -> StoreFuture<'a, Lease> {
        self.count(0);
        self.renewals.fetch_add(1, Ordering::Relaxed);
        self.renewal_requests.fetch_add(1, Ordering::Relaxed);
        self.inner.renew_lease(lease, ttl)
    }

    fn renew_leases<'a>(
        &'a self,
        leases: &'a [Lease],
        ttl: Duration,
    ) -> StoreFuture<'a, Vec<Result<Lease, StoreError>>> {
        self.count(0);
        self.renewals.fetch_add(leases.len() as u64, Ordering::Relaxed);
        self.renewal_requests.fetch_add(1, Ordering::Relaxed);
        self.inner.renew_leases(leases, ttl)
    }

    fn release_lease<'a>(&'a self, lease: &'a Lease) -> StoreFuture<'a, ()> {
        self.count(0);
        self.inner.release_lease(lease)
    }

    fn current_lease<'a>(&'a self, run_id: &'a str) -> StoreFuture<'a, Option<Lease>> {
        self.inner.current_lease(run_id)
    }

    fn claim_runnable<'a>(&'a self, owner: &'a str, ttl: Duration, limit: usize) -> StoreFuture<'a, Vec<Lease>> {
        self.count(0);
        self.inner.claim_runnable(owner, ttl, limit)
    }

    fn lock_instance<'a>(&'a self, instance_id: &'a str) -> StoreFuture<'a, Option<Box<dyn InstanceLock>>> {
        self.inner.lock_instance(instance_id)
    }

    fn finishes_without_polling(&self) -> bool {
        self.inner.finishes_without_polling()
    }

    fn notify_runnable(&self) -> StoreFuture<'_, ()> {
        self.inner.notify_runnable()
    }

    fn wait_runnable(&self, poll: Duration) -> BoxFuture<'_, ()> {
        self.inner.wait_runnable(poll)
    }
}
