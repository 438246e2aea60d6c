//! A run's one fenced writer: every write of a run — its row and its steps — goes through a
//! [`RunWriter`], which carries the turn's fencing token and notes a fenced write on the
//! [`Fence`] (the turn then stops at once). Every write but an outcome's waits for the turn's
//! outcomes in flight (`in_flight`), and fails if one was lost: a later write builds on them.
//! Marking a run that ended in failure only waits.

use crate::{
    journal::Fence,
    store::{FinishedStep, FinishedWithIntents, NewStep, RunRecord, RunStore, StepOutcome, StoreError},
};

/// The writes of one run under one fence. Borrowed and free to build: the journal builds one
/// per step write, the run loop one per turn.
#[derive(Clone, Copy)]
pub(crate) struct RunWriter<'a> {
    store: &'a dyn RunStore,
    fence: &'a Fence,
}

impl<'a> RunWriter<'a> {
    pub(crate) fn new(store: &'a dyn RunStore, fence: &'a Fence) -> Self {
        Self { store, fence }
    }

    /// The run's id (the fence's).
    pub(crate) fn run_id(&self) -> &'a str {
        self.fence.run_id()
    }

    /// Reads the run's row (reads take no fence).
    pub(crate) async fn get_run(&self) -> Result<Option<RunRecord>, StoreError> {
        self.store.get_run(self.run_id()).await
    }

    /// Creates the run's row.
    pub(crate) async fn create_run(&self, record: RunRecord) -> Result<(), StoreError> {
        self.fence.written().await?;
        self.fence.watch(self.store.create_run(record, self.fence.token()).await)
    }

    /// Replaces the run's row by compare-and-swap on its version; returns the new version.
    pub(crate) async fn put_run(&self, record: RunRecord) -> Result<u64, StoreError> {
        self.fence.written().await?;
        self.fence.watch(self.store.put_run(record, self.fence.token()).await)
    }

    /// Replaces the run's row once the outcomes in flight are answered, whatever became of
    /// them: for marking a run that ended in failure, which builds on none of them.
    pub(crate) async fn put_run_ending(&self, record: RunRecord) -> Result<u64, StoreError> {
        self.fence.drained().await;
        self.fence.watch(self.store.put_run(record, self.fence.token()).await)
    }

    /// Whether an outcome of the turn failed to commit, so that every write fails with it:
    /// an outage a write meets is then not one of its own, to try again or to take as in doubt.
    pub(crate) fn outcome_lost(&self) -> bool {
        self.fence.outcome_lost()
    }

    /// The run's last write of a turn: [`put_run`](Self::put_run), giving the lease up in the
    /// same write when the fence's holder allows it and the store can, after `last` (the
    /// turn's model response still to journal, if any), in the same write where the store can
    /// ([`RunStore::put_run_and_release_after`]).
    ///
    /// Not an `async fn`, whose future keeps the row and the step twice (see
    /// `runtime/turn.rs`, `turn`): it is the largest part of a run's close, which every run
    /// makes, and its box is kept within glibc's per-thread cache (requests up to 1,032
    /// bytes), whose misses take the arena's lock.
    #[allow(clippy::manual_async_fn)] // on purpose: see above
    pub(crate) fn put_run_closing(
        self,
        record: RunRecord,
        last: Option<FinishedStep>,
    ) -> impl Future<Output = Result<u64, StoreError>> + Send + 'a {
        async move {
            // Before the lease's renewals may stop (below): an outcome in flight may take a while.
            self.fence.written().await?;
            if !self.fence.may_release_at_close() {
                // Boxed: only a turn whose cut-off calls still run takes this path.
                return Box::pin(async move {
                    if let Some(last) = last {
                        self.append_finished_with_intents(last.into()).await?;
                    }
                    self.put_run(record).await
                })
                .await;
            }
            let token = self.fence.token();
            let written = match last {
                Some(last) => self.store.put_run_and_release_after(last, record, token).await,
                None => self.store.put_run_and_release(record, token).await,
            };
            let (version, released) = self.fence.watch(written)?;
            if released {
                self.fence.mark_released();
            }
            Ok(version)
        }
    }

    /// After a closing write that landed though an outage answered it: notes the lease given
    /// up when the store no longer holds it under this turn's token (the write released it).
    pub(crate) async fn note_release(&self) -> Result<(), StoreError> {
        let current = self.store.current_lease(self.run_id()).await?;
        if current.is_none_or(|lease| lease.token != self.fence.token()) {
            self.fence.mark_released();
        }
        Ok(())
    }

    /// Appends `Running` intents; returns their ordinals.
    ///
    /// Not an `async fn`, whose future keeps its argument twice (see `runtime/turn.rs`, `turn`).
    #[allow(clippy::manual_async_fn)] // on purpose: see above
    pub(crate) fn append_steps(
        &self,
        steps: Vec<NewStep>,
    ) -> impl Future<Output = Result<Vec<u64>, StoreError>> + Send + '_ {
        async move {
            self.fence.written().await?;
            self.fence.watch(self.store.append_steps(self.run_id(), self.fence.token(), steps).await)
        }
    }

    /// Appends a finished step and the intents after it, in one commit.
    ///
    /// Not an `async fn`, as [`append_steps`](Self::append_steps): every run of a wave of
    /// answers holds this future while its response and intents commit.
    #[allow(clippy::manual_async_fn)] // on purpose: see above
    pub(crate) fn append_finished_with_intents(
        &self,
        write: FinishedWithIntents,
    ) -> impl Future<Output = Result<Vec<u64>, StoreError>> + Send + '_ {
        async move {
            self.fence.written().await?;
            let run_id = self.run_id();
            self.fence.watch(self.store.append_finished_with_intents(run_id, self.fence.token(), write).await)
        }
    }

    /// Finalizes the `Running` step at `ordinal`. Does not wait for the outcomes in flight: it
    /// writes one of them, and two steps' outcomes do not depend on each other.
    pub(crate) async fn finish_step(&self, ordinal: u64, outcome: StepOutcome, at_ms: i64) -> Result<(), StoreError> {
        self.fence.watch(self.store.finish_step(self.run_id(), self.fence.token(), ordinal, outcome, at_ms).await)
    }
}
