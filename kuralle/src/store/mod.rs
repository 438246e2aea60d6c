//! The `RunStore` contract: where runs and their append-only journals live.
//!
//! One idea per file: [`runs`] (a run's row), [`steps`] (journal entries), [`leases`]
//! (ownership), [`instances`] (proof that a process is alive) and [`errors`]; the trait
//! itself is here. Implementations are in
//! [`crate::stores`]. Every store passes the same conformance suite
//! (`tests/store_conformance.rs`).

mod errors;
mod instances;
mod leases;
mod runs;
mod steps;

use std::time::Duration;

use futures::future::BoxFuture;

pub use errors::{StoreError, StoreErrorMessage};
pub use instances::InstanceLock;
pub(crate) use instances::{Registered, Registry, owner_prefix};
pub use leases::Lease;
pub(crate) use runs::new_run_id;
pub use runs::{RunFilter, RunRecord, RunStatus, RunSummary};
pub use steps::{FinishedStep, FinishedWithIntents, NewStep, StepKind, StepOutcome, StepRecord, StepStatus};

/// Shorthand for store futures.
///
/// ```
/// use kuralle::{RunStore, StoreFuture, stores::MemoryStore};
///
/// fn count_runs(store: &MemoryStore) -> StoreFuture<'_, usize> {
///     Box::pin(async move { Ok(store.list_runs(Default::default()).await?.len()) })
/// }
/// # tokio::runtime::Runtime::new().unwrap().block_on(async {
/// assert_eq!(count_runs(&MemoryStore::new()).await, Ok(0));
/// # });
/// ```
pub type StoreFuture<'a, T> = BoxFuture<'a, Result<T, StoreError>>;

/// Durable storage of runs and their journals.
///
/// Contract (checked by the conformance suite):
/// - [`append_steps`](Self::append_steps) assigns ordinals atomically: concurrent appenders
///   get unique, gap-free ordinals, and one call's steps are contiguous and in the given order.
///   A call is one durable commit.
/// - [`put_run`](Self::put_run) is a compare-and-swap on `version`: of writers that read the
///   same version exactly one wins.
/// - A step moves `Running → Finished | Failed` once.
/// - **Ownership.** A run has at most one owner, holding a [`Lease`]. Every write that belongs
///   to a run carries the lease's token as `fence` and is checked in the same transaction as
///   the write: it is accepted iff the run's lease exists, is not released, and its token
///   equals `fence` (expiry alone does not reject: only a newer grant or a release does).
///   Otherwise it fails with [`StoreError::Fenced`] and changes nothing. The fence check
///   comes before every other check. Lease expiry is computed from the store's own clock.
///   Reads and [`delete_run`](Self::delete_run) take no fence.
///
/// A run's life in a store, as the runtime drives it:
///
/// ```
/// use kuralle::{RunStore, stores::MemoryStore};
/// # tokio::runtime::Runtime::new().unwrap().block_on(async {
/// use kuralle::{StepOutcome, StoreError};
///
/// let store = MemoryStore::new();
/// let lease = store.acquire_lease("run-1", "worker-a", std::time::Duration::from_secs(30)).await?;
/// store.create_run(kuralle::RunRecord::new("run-1", "support"), lease.token).await?;
/// // Intent before execute: the step is journaled `Running` first...
/// let ordinals = store.append_steps("run-1", lease.token, vec![kuralle::NewStep::new("charge:o-1", kuralle::StepKind::Tool, "charge")]).await?;
/// // ...then finalized once with its outcome.
/// store.finish_step("run-1", lease.token, ordinals[0], StepOutcome::Finished(kuralle::JsonText::from(serde_json::json!("charged"))), 10).await?;
/// let again = store.finish_step("run-1", lease.token, ordinals[0], StepOutcome::Finished(kuralle::JsonText::from(serde_json::json!("twice"))), 11).await;
/// assert!(matches!(again, Err(StoreError::StepNotRunning { .. })));
/// // The run's row is replaced by compare-and-swap on its version.
/// let mut record = store.get_run("run-1").await?.expect("created");
/// record.status = kuralle::RunStatus::Finished;
/// assert_eq!(store.put_run(record, lease.token).await?, 1);
/// # Ok::<(), kuralle::StoreError>(())
/// # }).unwrap();
/// ```
pub trait RunStore: Send + Sync + 'static {
    /// Creates a run (its `version` is stored as given, normally 0), under lease `fence`.
    ///
    /// ```
    /// use kuralle::{RunStore, stores::MemoryStore};
    /// # tokio::runtime::Runtime::new().unwrap().block_on(async {
    /// let store = MemoryStore::new();
    /// let lease = store.acquire_lease("run-1", "worker-a", std::time::Duration::from_secs(30)).await?;
    /// store.create_run(kuralle::RunRecord::new("run-1", "support"), lease.token).await?;
    /// assert!(store.create_run(kuralle::RunRecord::new("run-1", "support"), lease.token).await.is_err()); // ids are unique
    /// # Ok::<(), kuralle::StoreError>(())
    /// # }).unwrap();
    /// ```
    fn create_run(&self, run: RunRecord, fence: u64) -> StoreFuture<'_, ()>;

    /// The run, if it exists.
    ///
    /// ```
    /// use kuralle::{RunStore, stores::MemoryStore};
    /// # tokio::runtime::Runtime::new().unwrap().block_on(async {
    /// let store = MemoryStore::new();
    /// let lease = store.acquire_lease("run-1", "worker-a", std::time::Duration::from_secs(30)).await?;
    /// store.create_run(kuralle::RunRecord::new("run-1", "support"), lease.token).await?;
    /// assert_eq!(store.get_run("run-1").await?.map(|r| r.agent_id), Some("support".into()));
    /// assert_eq!(store.get_run("run-2").await?, None);
    /// # Ok::<(), kuralle::StoreError>(())
    /// # }).unwrap();
    /// ```
    fn get_run<'a>(&'a self, run_id: &'a str) -> StoreFuture<'a, Option<RunRecord>>;

    /// Replaces the run's row if its stored version is `run.version`; returns the new version
    /// (`run.version + 1`). Under lease `fence`.
    ///
    /// ```
    /// use kuralle::{RunStore, stores::MemoryStore};
    /// # tokio::runtime::Runtime::new().unwrap().block_on(async {
    /// let store = MemoryStore::new();
    /// let lease = store.acquire_lease("run-1", "worker-a", std::time::Duration::from_secs(30)).await?;
    /// store.create_run(kuralle::RunRecord::new("run-1", "support"), lease.token).await?;
    /// let read = store.get_run("run-1").await?.expect("created");
    /// assert_eq!(store.put_run(read.clone(), lease.token).await?, 1);
    /// // A second writer that read the same version loses.
    /// assert!(matches!(store.put_run(read, lease.token).await, Err(kuralle::StoreError::VersionConflict { .. })));
    /// # Ok::<(), kuralle::StoreError>(())
    /// # }).unwrap();
    /// ```
    fn put_run(&self, run: RunRecord, fence: u64) -> StoreFuture<'_, u64>;

    /// [`put_run`](Self::put_run) for the last write of a turn, which may also give up the
    /// lease of token `fence` in the same write (as [`release_lease`](Self::release_lease)
    /// would, after the run is written): returns the new version and whether the lease was
    /// given up. The run is written (or refused) exactly as by `put_run`; when it is refused,
    /// the lease is kept.
    ///
    /// The default writes the run only (`false`): the caller then releases the lease itself.
    /// A store overrides it when the two writes cost less as one (PostgreSQL: one statement
    /// and one commit instead of two).
    ///
    /// ```
    /// use kuralle::{RunStore, stores::MemoryStore};
    /// # tokio::runtime::Runtime::new().unwrap().block_on(async {
    /// let store = MemoryStore::new();
    /// let lease = store.acquire_lease("run-1", "worker-a", std::time::Duration::from_secs(30)).await?;
    /// store.create_run(kuralle::RunRecord::new("run-1", "support"), lease.token).await?;
    /// let read = store.get_run("run-1").await?.expect("created");
    /// let (version, released) = store.put_run_and_release(read, lease.token).await?;
    /// assert_eq!(version, 1);
    /// if !released {
    ///     store.release_lease(&lease).await?;
    /// }
    /// assert_eq!(store.current_lease("run-1").await?, None);
    /// # Ok::<(), kuralle::StoreError>(())
    /// # }).unwrap();
    /// ```
    fn put_run_and_release(&self, run: RunRecord, fence: u64) -> StoreFuture<'_, (u64, bool)> {
        Box::pin(async move { Ok((self.put_run(run, fence).await?, false)) })
    }

    /// [`put_run_and_release`](Self::put_run_and_release) after appending `last`, already
    /// finished, under the same lease: the write that closes a turn, which journals the turn's
    /// last model response with the row that says the turn ended. Returns what
    /// `put_run_and_release` returns.
    ///
    /// A store that can should do both in one transaction: one commit where there were two,
    /// and a refused run (a version conflict, a fenced token) leaves the journal as it was.
    /// The provided implementation is two writes,
    /// [`append_finished_with_intents`](Self::append_finished_with_intents) with no intents and
    /// then `put_run_and_release`. Its run can be refused after `last` was journaled, and
    /// `last` sent again is then [`StoreError::DuplicateKey`]; the runtime, which retries a
    /// refused close, takes that as journaled and retries with the run alone. Either way a
    /// crash before the end loses at most `last`, which a resumed run asks its model for again.
    ///
    /// ```
    /// use kuralle::{FinishedStep, JsonText, NewStep, RunStatus, RunStore, StepKind, StepOutcome, stores::MemoryStore};
    /// # tokio::runtime::Runtime::new().unwrap().block_on(async {
    /// let store = MemoryStore::new();
    /// let lease = store.acquire_lease("run-1", "worker-a", std::time::Duration::from_secs(30)).await?;
    /// store.create_run(kuralle::RunRecord::new("run-1", "support"), lease.token).await?;
    /// let mut done = store.get_run("run-1").await?.expect("created");
    /// done.status = RunStatus::Finished;
    /// let last = FinishedStep {
    ///     step: NewStep::new("model:0", StepKind::Model, "model"),
    ///     outcome: StepOutcome::Finished(JsonText::from(serde_json::json!({"text": "hi"}))),
    ///     finished_at_ms: 5,
    /// };
    /// let (version, released) = store.put_run_and_release_after(last, done, lease.token).await?;
    /// assert_eq!(version, 1);
    /// if !released {
    ///     store.release_lease(&lease).await?;
    /// }
    /// assert_eq!(store.steps("run-1").await?.len(), 1);
    /// # Ok::<(), kuralle::StoreError>(())
    /// # }).unwrap();
    /// ```
    fn put_run_and_release_after(
        &self,
        last: FinishedStep,
        run: RunRecord,
        fence: u64,
    ) -> StoreFuture<'_, (u64, bool)> {
        Box::pin(async move {
            self.append_finished_with_intents(&run.run_id, fence, last.into()).await?;
            self.put_run_and_release(run, fence).await
        })
    }

    /// Runs matching `filter`, most recently updated first.
    ///
    /// ```
    /// use kuralle::{RunStore, stores::MemoryStore};
    /// # tokio::runtime::Runtime::new().unwrap().block_on(async {
    /// let store = MemoryStore::new();
    /// let lease = store.acquire_lease("run-1", "worker-a", std::time::Duration::from_secs(30)).await?;
    /// let lease2 = store.acquire_lease("run-2", "worker-a", std::time::Duration::from_secs(30)).await?;
    /// store.create_run(kuralle::RunRecord::new("run-1", "support"), lease.token).await?;
    /// store.create_run(kuralle::RunRecord::new("run-2", "support"), lease2.token).await?;
    /// let one = store.list_runs(kuralle::RunFilter { limit: Some(1), ..Default::default() }).await?;
    /// assert_eq!(one.len(), 1);
    /// # Ok::<(), kuralle::StoreError>(())
    /// # }).unwrap();
    /// ```
    fn list_runs(&self, filter: RunFilter) -> StoreFuture<'_, Vec<RunSummary>>;

    /// Deletes a run and its journal; `false` if it did not exist. Administrative: takes no
    /// fence, and keeps the run's lease token so a reused id never reuses a token.
    ///
    /// ```
    /// use kuralle::{RunStore, stores::MemoryStore};
    /// # tokio::runtime::Runtime::new().unwrap().block_on(async {
    /// let store = MemoryStore::new();
    /// let lease = store.acquire_lease("run-1", "worker-a", std::time::Duration::from_secs(30)).await?;
    /// store.create_run(kuralle::RunRecord::new("run-1", "support"), lease.token).await?;
    /// assert!(store.delete_run("run-1").await?);
    /// assert!(!store.delete_run("run-1").await?);
    /// # Ok::<(), kuralle::StoreError>(())
    /// # }).unwrap();
    /// ```
    fn delete_run<'a>(&'a self, run_id: &'a str) -> StoreFuture<'a, bool>;

    /// Appends `Running` intents at the next ordinals, atomically, in one durable commit;
    /// returns their ordinals. Under lease `fence`.
    ///
    /// ```
    /// use kuralle::{RunStore, stores::MemoryStore};
    /// # tokio::runtime::Runtime::new().unwrap().block_on(async {
    /// let store = MemoryStore::new();
    /// let lease = store.acquire_lease("run-1", "worker-a", std::time::Duration::from_secs(30)).await?;
    /// store.create_run(kuralle::RunRecord::new("run-1", "support"), lease.token).await?;
    /// assert_eq!(store.append_steps("run-1", lease.token, vec![kuralle::NewStep::new("a", kuralle::StepKind::Tool, "charge"), kuralle::NewStep::new("b", kuralle::StepKind::Tool, "charge")]).await?, vec![0, 1]);
    /// assert_eq!(store.append_steps("run-1", lease.token, vec![kuralle::NewStep::new("c", kuralle::StepKind::Tool, "charge")]).await?, vec![2]);
    /// # Ok::<(), kuralle::StoreError>(())
    /// # }).unwrap();
    /// ```
    fn append_steps<'a>(&'a self, run_id: &'a str, fence: u64, steps: Vec<NewStep>) -> StoreFuture<'a, Vec<u64>>;

    /// Finalizes a `Running` step, under lease `fence`.
    ///
    /// ```
    /// use kuralle::{RunStore, stores::MemoryStore};
    /// # tokio::runtime::Runtime::new().unwrap().block_on(async {
    /// let store = MemoryStore::new();
    /// let lease = store.acquire_lease("run-1", "worker-a", std::time::Duration::from_secs(30)).await?;
    /// store.create_run(kuralle::RunRecord::new("run-1", "support"), lease.token).await?;
    /// store.append_steps("run-1", lease.token, vec![kuralle::NewStep::new("a", kuralle::StepKind::Tool, "charge")]).await?;
    /// store.finish_step("run-1", lease.token, 0, kuralle::StepOutcome::Finished(kuralle::JsonText::from(serde_json::json!(42))), 3).await?;
    /// assert_eq!(store.steps("run-1").await?[0].result.as_ref().expect("finished"), &serde_json::json!(42));
    /// # Ok::<(), kuralle::StoreError>(())
    /// # }).unwrap();
    /// ```
    fn finish_step<'a>(
        &'a self,
        run_id: &'a str,
        fence: u64,
        ordinal: u64,
        outcome: StepOutcome,
        finished_at_ms: i64,
    ) -> StoreFuture<'a, ()>;

    /// Appends `write.finished` already finished with `write.outcome`, then the `Running`
    /// intents `write.intents`, atomically, under lease `fence`; returns their ordinals (`finished`'s
    /// first). The runtime journals a model response together with the intents of the calls it
    /// asks for, so a one-call turn is two durable commits (this, then the call's outcome).
    ///
    /// The provided implementation is [`append_steps`](Self::append_steps) then
    /// [`finish_step`](Self::finish_step): correct (a crash between them leaves the response
    /// `Running`, which the runtime asks for again) but two commits; a store that can do both
    /// in one transaction should.
    fn append_finished_with_intents<'a>(
        &'a self,
        run_id: &'a str,
        fence: u64,
        write: FinishedWithIntents,
    ) -> StoreFuture<'a, Vec<u64>> {
        Box::pin(async move {
            let FinishedWithIntents { finished, outcome, finished_at_ms, intents } = write;
            let mut steps = Vec::with_capacity(intents.len() + 1);
            steps.push(finished);
            steps.extend(intents);
            let ordinals = self.append_steps(run_id, fence, steps).await?;
            let first = *ordinals
                .first()
                .ok_or_else(|| StoreError::Corrupt("the store assigned no ordinal to an appended step".into()))?;
            self.finish_step(run_id, fence, first, outcome, finished_at_ms).await?;
            Ok(ordinals)
        })
    }

    /// Cancels the run if it is [`Running`](RunStatus::Running) or
    /// [`Paused`](RunStatus::Paused): in one transaction its status becomes
    /// [`Cancelled`](RunStatus::Cancelled) (its version is bumped) and its lease, if any, is
    /// released. Returns the status the run had before (`None`: no such run); a run in any
    /// other status is left as it was. Administrative: takes no fence.
    ///
    /// Releasing the lease is how an owner in another process learns of it, without a read
    /// per step: its next write (the next step's intent or outcome) or its next lease renewal
    /// (every third of the TTL) is [`StoreError::Fenced`], so it stops, cancels its
    /// interruptible calls and writes nothing more.
    ///
    /// ```
    /// use kuralle::{RunStatus, RunStore, StoreError, stores::MemoryStore};
    /// # tokio::runtime::Runtime::new().unwrap().block_on(async {
    /// let store = MemoryStore::new();
    /// let lease = store.acquire_lease("run-1", "worker-a", std::time::Duration::from_secs(30)).await?;
    /// store.create_run(kuralle::RunRecord::new("run-1", "support"), lease.token).await?;
    /// assert_eq!(store.cancel_run("run-1").await?, Some(RunStatus::Running));
    /// assert_eq!(store.get_run("run-1").await?.map(|r| r.status), Some(RunStatus::Cancelled));
    /// // The owner's next write is fenced.
    /// let late = store.append_steps("run-1", lease.token, vec![kuralle::NewStep::new("a", kuralle::StepKind::Tool, "charge")]).await;
    /// assert!(matches!(late, Err(StoreError::Fenced { .. })));
    /// assert_eq!(store.cancel_run("run-1").await?, Some(RunStatus::Cancelled), "already ended: unchanged");
    /// assert_eq!(store.cancel_run("run-2").await?, None);
    /// # Ok::<(), StoreError>(())
    /// # }).unwrap();
    /// ```
    fn cancel_run<'a>(&'a self, run_id: &'a str) -> StoreFuture<'a, Option<RunStatus>>;

    /// The run's journal in ordinal order (empty for an unknown run).
    ///
    /// ```
    /// use kuralle::{RunStore, stores::MemoryStore};
    /// # tokio::runtime::Runtime::new().unwrap().block_on(async {
    /// let store = MemoryStore::new();
    /// let lease = store.acquire_lease("run-1", "worker-a", std::time::Duration::from_secs(30)).await?;
    /// store.create_run(kuralle::RunRecord::new("run-1", "support"), lease.token).await?;
    /// store.append_steps("run-1", lease.token, vec![kuralle::NewStep::new("a", kuralle::StepKind::Tool, "charge"), kuralle::NewStep::new("b", kuralle::StepKind::Tool, "charge")]).await?;
    /// let keys: Vec<_> = store.steps("run-1").await?.into_iter().map(|s| s.key).collect();
    /// assert_eq!(keys, ["a", "b"]);
    /// assert!(store.steps("unknown").await?.is_empty());
    /// # Ok::<(), kuralle::StoreError>(())
    /// # }).unwrap();
    /// ```
    fn steps<'a>(&'a self, run_id: &'a str) -> StoreFuture<'a, Vec<StepRecord>>;

    /// Takes ownership of `run_id` (which need not exist yet) for `ttl` by the store's clock.
    ///
    /// Succeeds iff the run has no lease, or its lease is released or expired; the new token
    /// is the previous one plus 1 (1 if none). Of concurrent acquirers exactly one wins; the
    /// others get [`StoreError::LeaseHeld`].
    fn acquire_lease<'a>(&'a self, run_id: &'a str, owner: &'a str, ttl: Duration) -> StoreFuture<'a, Lease>;

    /// [`acquire_lease`](Self::acquire_lease), then the run as [`get_run`](Self::get_run)
    /// reads it, under the new lease: how a turn starts. When the read fails, the lease is
    /// released again and the read's error returned.
    ///
    /// The default makes the two calls. A store overrides it when one round trip costs less
    /// (SQLite: one job on the writer thread, whose connection already holds the pages, instead
    /// of a write and then a read on a blocking thread).
    ///
    /// ```
    /// use std::time::Duration;
    /// use kuralle::{RunStore, stores::MemoryStore};
    /// # tokio::runtime::Runtime::new().unwrap().block_on(async {
    /// let store = MemoryStore::new();
    /// let (lease, run) = store.acquire_lease_and_get_run("run-1", "worker-a", Duration::from_secs(30)).await?;
    /// assert!(run.is_none());
    /// store.create_run(kuralle::RunRecord::new("run-1", "support"), lease.token).await?;
    /// store.release_lease(&lease).await?;
    /// let (_, run) = store.acquire_lease_and_get_run("run-1", "worker-a", Duration::from_secs(30)).await?;
    /// assert_eq!(run.map(|r| r.agent_id).as_deref(), Some("support"));
    /// # Ok::<(), kuralle::StoreError>(())
    /// # }).unwrap();
    /// ```
    fn acquire_lease_and_get_run<'a>(
        &'a self,
        run_id: &'a str,
        owner: &'a str,
        ttl: Duration,
    ) -> StoreFuture<'a, (Lease, Option<RunRecord>)> {
        Box::pin(async move {
            let lease = self.acquire_lease(run_id, owner, ttl).await?;
            let read = self.get_run(run_id).await;
            read_under(self, lease, read).await
        })
    }

    /// [`acquire_lease_and_get_run`](Self::acquire_lease_and_get_run) for `new`'s run id,
    /// creating `new` under the new lease when no such run exists: how a run whose id the
    /// runtime made starts, and a turn with input of a run its caller names, one write where the
    /// lease and then the row were two. Returns the lease and the run that was there (`None`:
    /// `new` was created), unchanged. Every later turn of a caller's run takes the "there" path,
    /// so it should cost no more than `acquire_lease_and_get_run`. When the create or the read
    /// fails, the lease is released again and the error returned.
    ///
    /// The default makes the two calls. A store overrides it when one costs less (SQLite: one
    /// job, one commit).
    ///
    /// ```
    /// use std::time::Duration;
    /// use kuralle::{RunRecord, RunStore, stores::MemoryStore};
    /// # tokio::runtime::Runtime::new().unwrap().block_on(async {
    /// let store = MemoryStore::new();
    /// let ttl = Duration::from_secs(30);
    /// let (lease, there) = store.acquire_lease_and_create_run(RunRecord::new("run-1", "support"), "worker-a", ttl).await?;
    /// assert!(there.is_none(), "created");
    /// assert_eq!(store.get_run("run-1").await?.map(|r| r.agent_id).as_deref(), Some("support"));
    /// store.release_lease(&lease).await?;
    /// let (_, there) = store.acquire_lease_and_create_run(RunRecord::new("run-1", "sales"), "worker-a", ttl).await?;
    /// assert_eq!(there.map(|r| r.agent_id).as_deref(), Some("support"), "the run that was there, unchanged");
    /// # Ok::<(), kuralle::StoreError>(())
    /// # }).unwrap();
    /// ```
    fn acquire_lease_and_create_run<'a>(
        &'a self,
        new: RunRecord,
        owner: &'a str,
        ttl: Duration,
    ) -> StoreFuture<'a, (Lease, Option<RunRecord>)> {
        Box::pin(async move {
            let (lease, there) = self.acquire_lease_and_get_run(&new.run_id, owner, ttl).await?;
            if there.is_some() {
                return Ok((lease, there));
            }
            let created = self.create_run(new, lease.token).await;
            read_under(self, lease, created.map(|()| None)).await
        })
    }

    /// Extends `lease` to the store's now + `ttl`; returns it with the new expiry. Succeeds iff
    /// its token is still the run's current one and not released (an expired lease nobody took
    /// over may be renewed); else [`StoreError::Fenced`]. Only the lease's run id and token
    /// count: the runtime renews the lease as it was granted, so its `expires_at_ms` is the
    /// grant's.
    fn renew_lease<'a>(&'a self, lease: &'a Lease, ttl: Duration) -> StoreFuture<'a, Lease>;

    /// Renews many leases in one request: as [`renew_lease`](Self::renew_lease) on each, with
    /// each lease's own outcome at its index (a lease taken over is
    /// [`StoreError::Fenced`] there, and the others are renewed all the same). The outer error
    /// is for the request as a whole (the store is unreachable): no lease of it is proven
    /// renewed. A runtime renews the leases it holds with this, so a process with thousands of
    /// runs in flight makes a few renewal requests per period instead of one per run.
    ///
    /// The default renews them one by one; the SQLite store renews them in one transaction,
    /// PostgreSQL in one statement.
    ///
    /// ```
    /// use std::time::Duration;
    /// use kuralle::{RunStore, StoreError, stores::MemoryStore};
    /// # tokio::runtime::Runtime::new().unwrap().block_on(async {
    /// let store = MemoryStore::new();
    /// let ttl = Duration::from_secs(30);
    /// let a = store.acquire_lease("run-a", "worker", ttl).await?;
    /// let b = store.acquire_lease("run-b", "worker", ttl).await?;
    /// store.release_lease(&b).await?;
    /// let renewed = store.renew_leases(&[a.clone(), b], ttl).await?;
    /// assert_eq!(renewed[0].as_ref().map(|l| l.token), Ok(a.token));
    /// assert!(matches!(renewed[1], Err(StoreError::Fenced { .. })));
    /// # Ok::<(), StoreError>(())
    /// # }).unwrap();
    /// ```
    fn renew_leases<'a>(
        &'a self,
        leases: &'a [Lease],
        ttl: Duration,
    ) -> StoreFuture<'a, Vec<Result<Lease, StoreError>>> {
        Box::pin(async move {
            let mut renewed = Vec::with_capacity(leases.len());
            for lease in leases {
                match self.renew_lease(lease, ttl).await {
                    Err(e) if e.is_retryable() => return Err(e),
                    result => renewed.push(result),
                }
            }
            Ok(renewed)
        })
    }

    /// Gives the run up at once: others may acquire it, with a higher token. Fails with
    /// [`StoreError::Fenced`] if `lease` is no longer current (callers usually ignore that).
    fn release_lease<'a>(&'a self, lease: &'a Lease) -> StoreFuture<'a, ()>;

    /// The run's current lease, if one is held (not released, not expired). Read-only: for
    /// operators and tests.
    fn current_lease<'a>(&'a self, run_id: &'a str) -> StoreFuture<'a, Option<Lease>>;

    /// The work queue: claims up to `limit` **runnable** runs (status
    /// [`Running`](RunStatus::Running) and no live lease: submitted and not yet started,
    /// handed back, or orphaned by a process that died) for `ttl`, granting each a lease whose
    /// owner is `"<owner>/<run id>"`; oldest first. Used by
    /// [`Runtime::serve`](crate::Runtime::serve).
    ///
    /// The default lists running runs and tries [`acquire_lease`](Self::acquire_lease) on each
    /// that has no live lease (correct for any store, since acquiring is atomic); stores may
    /// override it with one statement (PostgreSQL uses `FOR UPDATE SKIP LOCKED`).
    fn claim_runnable<'a>(&'a self, owner: &'a str, ttl: Duration, limit: usize) -> StoreFuture<'a, Vec<Lease>> {
        Box::pin(async move {
            let mut claimed = Vec::new();
            if limit == 0 {
                return Ok(claimed);
            }
            let filter = RunFilter { status: Some(RunStatus::Running), limit: None };
            // Most recently updated first: walk it backwards for oldest first.
            for run in self.list_runs(filter).await?.iter().rev() {
                if self.current_lease(&run.run_id).await?.is_some() {
                    continue;
                }
                let lease = match self.acquire_lease(&run.run_id, &format!("{owner}/{}", run.run_id), ttl).await {
                    Ok(lease) => lease,
                    Err(StoreError::LeaseHeld { .. }) => continue,
                    Err(e) => return Err(e),
                };
                // The list is a snapshot: the run's last turn may have closed it (and released
                // its lease) since, and a closed run must not be claimed again.
                let still_runnable = self.get_run(&run.run_id).await?.is_some_and(|r| r.status == RunStatus::Running);
                if still_runnable {
                    claimed.push(lease);
                } else {
                    self.release_lease(&lease).await?;
                }
                if claimed.len() == limit {
                    break;
                }
            }
            Ok(claimed)
        })
    }

    /// Proves that this process is the only live one with `instance_id` (see
    /// [`RuntimeBuilder::instance_id`](crate::RuntimeBuilder::instance_id)): the returned
    /// [`InstanceLock`] holds the proof until dropped, and lets this process
    /// [`take back`](InstanceLock::take_back) the leases its dead predecessor held.
    ///
    /// The proof must come from something that disappears when the holder dies (an OS file
    /// lock, a database session lock), never from a timeout or a heartbeat that might only be
    /// late. Stores that can give no such proof return `Ok(None)`, which is the default: a
    /// runtime then takes nothing back and its runs wait for their leases to expire, as
    /// without an instance id. `SqliteStore` (an OS file lock beside the database file),
    /// `PostgresStore` (a session advisory lock) and `MemoryStore` (an in-process registry)
    /// all prove it.
    ///
    /// ```
    /// use kuralle::{RunStore, StoreError, stores::MemoryStore};
    /// # tokio::runtime::Runtime::new().unwrap().block_on(async {
    /// let store = MemoryStore::new();
    /// let lock = store.lock_instance("app-1").await?.expect("held");
    /// let again = store.lock_instance("app-1").await.unwrap_err();
    /// assert!(matches!(again, StoreError::InstanceInUse { ref instance_id, .. } if instance_id == "app-1"));
    /// # drop(lock);
    /// # Ok::<(), StoreError>(())
    /// # }).unwrap();
    /// ```
    ///
    /// # Errors
    /// [`StoreError::InstanceInUse`] when another live holder (another process, or another
    /// runtime of this one) has the id; [`StoreError::Unavailable`] when the proof cannot be
    /// sought right now.
    fn lock_instance<'a>(&'a self, instance_id: &'a str) -> StoreFuture<'a, Option<Box<dyn InstanceLock>>> {
        let _ = instance_id;
        Box::pin(async { Ok(None) })
    }

    /// Whether a [`finish_step`](Self::finish_step) this store returns goes on to its end
    /// without its future being polled again once it was polled once: the first poll sends
    /// the write, and its answer waits to be read. `SqliteStore`'s do (the first poll queues
    /// the job for its writer thread).
    ///
    /// The runtime sends a call's outcome as the call ends and goes on to ask the model,
    /// waiting for the outcome's commit only before the run's next write. For a store that
    /// says `true` it reads the answer then, and nothing is woken when the write commits; for
    /// any other it drives the write as a task of its own. The default, `false`, is safe for
    /// every store.
    ///
    /// ```
    /// use kuralle::{RunStore, stores::{MemoryStore, SqliteStore}};
    /// assert!(SqliteStore::in_memory()?.finishes_without_polling());
    /// assert!(!MemoryStore::new().finishes_without_polling());
    /// # Ok::<(), kuralle::StoreError>(())
    /// ```
    fn finishes_without_polling(&self) -> bool {
        false
    }

    /// Hints idle workers (of any process) that a run became runnable. Only a hint: workers
    /// also poll. The default does nothing (workers of this store poll).
    fn notify_runnable(&self) -> StoreFuture<'_, ()> {
        Box::pin(async { Ok(()) })
    }

    /// Waits for a [`notify_runnable`](Self::notify_runnable) hint from any process, or
    /// `poll`, whichever comes first. The default sleeps `poll`.
    fn wait_runnable(&self, poll: Duration) -> BoxFuture<'_, ()> {
        Box::pin(tokio::time::sleep(poll))
    }
}

/// The end of [`RunStore::acquire_lease_and_get_run`]: the lease with the run `read` under
/// it, or, when the read failed, the lease given back and the read's error.
pub(crate) async fn read_under<S: RunStore + ?Sized>(
    store: &S,
    lease: Lease,
    read: Result<Option<RunRecord>, StoreError>,
) -> Result<(Lease, Option<RunRecord>), StoreError> {
    match read {
        Ok(run) => Ok((lease, run)),
        Err(e) => {
            // The caller gets no lease to give back: an unreadable run is not left busy.
            let _ = store.release_lease(&lease).await;
            Err(e)
        }
    }
}
