//! [`ProvidedStore`]: a store that implements only `RunStore`'s required methods, over a
//! `MemoryStore`, so that every provided method runs the trait's own implementation (but
//! `lock_instance`, whose provided answer is that the store cannot prove instances: it is
//! passed on, so the suite's instance case runs). Every
//! store in the tree overrides the merged writes (`acquire_lease_and_create_run`,
//! `put_run_and_release`, `put_run_and_release_after`, …), so without it nothing would run the
//! implementations a third-party store inherits: the conformance suite runs against it, and
//! the runtime's tests use it for a store whose close keeps the lease.
//!
//! ```
//! use kuralle::RunStore;
//! use kuralle_tests::provided::ProvidedStore;
//! # tokio::runtime::Runtime::new().unwrap().block_on(async {
//! let store = ProvidedStore::new();
//! let lease = store.acquire_lease("r", "me", std::time::Duration::from_secs(30)).await.unwrap();
//! store.create_run(kuralle::RunRecord::new("r", "support"), lease.token).await.unwrap();
//! let run = store.get_run("r").await.unwrap().unwrap();
//! // The provided `put_run_and_release` writes the run and leaves the release to the caller.
//! assert_eq!(store.put_run_and_release(run, lease.token).await.unwrap(), (1, false));
//! # });
//! ```

use std::time::Duration;

use kuralle::stores::MemoryStore;
use kuralle::{
    InstanceLock, Lease, NewStep, RunFilter, RunRecord, RunStatus, RunStore, RunSummary, StepOutcome, StepRecord,
    StoreFuture,
};

/// A `MemoryStore` seen through `RunStore`'s required methods (and `lock_instance`) only.
#[derive(Clone, Default)]
pub struct ProvidedStore {
    inner: MemoryStore,
}

impl ProvidedStore {
    /// An empty store.
    pub fn new() -> Self {
        Self::default()
    }
}

impl RunStore for ProvidedStore {
    fn create_run(&self, run: RunRecord, fence: u64) -> StoreFuture<'_, ()> {
        self.inner.create_run(run, fence)
    }
    fn get_run<'a>(&'a self, run_id: &'a str) -> StoreFuture<'a, Option<RunRecord>> {
        self.inner.get_run(run_id)
    }
    fn put_run(&self, run: RunRecord, fence: u64) -> StoreFuture<'_, u64> {
        self.inner.put_run(run, fence)
    }
    fn list_runs(&self, filter: RunFilter) -> StoreFuture<'_, Vec<RunSummary>> {
        self.inner.list_runs(filter)
    }
    fn delete_run<'a>(&'a self, run_id: &'a str) -> StoreFuture<'a, bool> {
        self.inner.delete_run(run_id)
    }
    fn append_steps<'a>(&'a self, run_id: &'a str, fence: u64, steps: Vec<NewStep>) -> StoreFuture<'a, Vec<u64>> {
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
        self.inner.finish_step(run_id, fence, ordinal, outcome, finished_at_ms)
    }
    fn cancel_run<'a>(&'a self, run_id: &'a str) -> StoreFuture<'a, Option<RunStatus>> {
        self.inner.cancel_run(run_id)
    }
    fn steps<'a>(&'a self, run_id: &'a str) -> StoreFuture<'a, Vec<StepRecord>> {
        self.inner.steps(run_id)
    }
    fn acquire_lease<'a>(&'a self, run_id: &'a str, owner: &'a str, ttl: Duration) -> StoreFuture<'a, Lease> {
        self.inner.acquire_lease(run_id, owner, ttl)
    }
    fn renew_lease<'a>(&'a self, lease: &'a Lease, ttl: Duration) -> StoreFuture<'a, Lease> {
        self.inner.renew_lease(lease, ttl)
    }
    fn release_lease<'a>(&'a self, lease: &'a Lease) -> StoreFuture<'a, ()> {
        self.inner.release_lease(lease)
    }
    fn current_lease<'a>(&'a self, run_id: &'a str) -> StoreFuture<'a, Option<Lease>> {
        self.inner.current_lease(run_id)
    }
    fn lock_instance<'a>(&'a self, instance_id: &'a str) -> StoreFuture<'a, Option<Box<dyn InstanceLock>>> {
        self.inner.lock_instance(instance_id)
    }
}
