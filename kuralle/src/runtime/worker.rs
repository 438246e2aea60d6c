//! Workers: a durable work queue over the store. [`Runtime::submit`] records a runnable run
//! and returns at once; [`Runtime::serve`] claims runnable runs (the lease is granted by the
//! claim itself), drives them, and picks up orphans whose owner died (its lease expired),
//! resuming them from the journal. Any number of processes may serve one store.

use std::collections::HashMap;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tokio::task::{Id, JoinSet};
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use super::{Inner, RunRequest, Runtime, entry, instance::Claim};
use crate::event::RunOutput;
use crate::{
    error::RunError,
    store::{Lease, StoreError},
};

/// How a worker ([`Runtime::serve_with`]) claims and drives runs; start from [`Default`].
///
/// ```
/// use std::time::Duration;
/// use kuralle::WorkerOptions;
///
/// let options = WorkerOptions { max_concurrent_runs: 4, poll_interval: Duration::from_millis(200), ..Default::default() };
/// assert_eq!(options.shutdown_grace, Duration::from_secs(30));
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkerOptions {
    /// The most runs this worker drives at once. Default 16.
    pub max_concurrent_runs: usize,
    /// How often an idle worker looks for runnable runs. Wake-up hints (PostgreSQL
    /// `LISTEN/NOTIFY`, or a `submit` in this process) make it look sooner. Default 1 s.
    pub poll_interval: Duration,
    /// After `shutdown` completes, how long in-flight turns may take to finish. Those still
    /// running then are handed back: their interruptible calls are cancelled, calls that
    /// cannot be interrupted run to their end (the lease still held and renewed), every
    /// outcome is journaled, and only then is the lease released, so another worker resumes
    /// the run from the journal at once and never runs a call this one is still running.
    /// Default 30 s.
    pub shutdown_grace: Duration,
    /// A run whose turn failed with a retryable error (a model outage, a rate limit) is not
    /// claimed again, by any worker, for this long. Default 5 s. A turn that failed because the
    /// store was unavailable (a database blip) waits only one `poll_interval` (at most this
    /// long): the run is not what failed, and the store being back is all it waits for.
    pub retry_backoff: Duration,
}

impl Default for WorkerOptions {
    fn default() -> Self {
        Self {
            max_concurrent_runs: 16,
            poll_interval: Duration::from_secs(1),
            shutdown_grace: Duration::from_secs(30),
            retry_backoff: Duration::from_secs(5),
        }
    }
}

/// What one [`Runtime::serve`] call did.
///
/// ```
/// let report = kuralle::ServeReport::default();
/// assert_eq!(report.claimed, 0);
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct ServeReport {
    /// Runs claimed from the queue.
    pub claimed: u64,
    /// Turns that ended (finished, paused, max steps, interrupted, failed for good).
    pub completed: u64,
    /// Turns that failed with a retryable error; the run waits out the backoff and is claimed
    /// again.
    pub retried: u64,
    /// Turns that lost their lease to another owner (this worker stalled past the TTL).
    pub lost: u64,
    /// Turns stopped at shutdown and handed back.
    pub handed_back: u64,
}

impl Runtime {
    /// Records `request` as a runnable run (a new run, or a new turn of an existing one) and
    /// returns its id at once, without running it: a worker ([`serve`](Self::serve)) of any
    /// process sharing the store claims and drives it. Read the outcome with
    /// [`get_run`](Self::get_run) and [`journal`](Self::journal).
    ///
    /// ```
    /// use kuralle::{AgentDef, RunStatus, Runtime, testing::{ScriptedModel, Turn}};
    ///
    /// # tokio::runtime::Runtime::new().unwrap().block_on(async {
    /// let runtime = Runtime::builder()
    ///     .agent(AgentDef::new("support", "Be brief."))
    ///     .model(ScriptedModel::new([Turn::text("Queued and done.")]))
    ///     .build()
    ///     .unwrap();
    /// let run_id = runtime.submit("Hi").await.unwrap();
    /// assert_eq!(runtime.get_run(&run_id).await.unwrap().unwrap().status, RunStatus::Running);
    ///
    /// // A worker drives it; stop the worker once the run is done.
    /// let worker = runtime.clone();
    /// let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    /// let serving = tokio::spawn(async move { worker.serve(async { let _ = stopped.await; }).await });
    /// while runtime.get_run(&run_id).await.unwrap().unwrap().status == RunStatus::Running {
    ///     tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    /// }
    /// stop.send(()).unwrap();
    /// let report = serving.await.unwrap().unwrap();
    /// assert_eq!(report.completed, 1);
    /// assert_eq!(runtime.get_run(&run_id).await.unwrap().unwrap().status, RunStatus::Finished);
    /// # });
    /// ```
    ///
    /// # Errors
    /// [`RunError::Busy`] when another caller owns the run right now;
    /// [`RunError::TurnInProgress`] when the run's current turn (with other input) is
    /// unfinished; [`RunError::RunNotFound`] for a request without input naming no run;
    /// [`RunError::UnknownAgent`]; [`RunError::Config`] for a dollar cap on an unpriced model;
    /// [`RunError::Store`] when the store fails. A refused request records nothing.
    pub async fn submit(&self, request: impl Into<RunRequest>) -> Result<String, RunError> {
        let run_id = entry::submit(&self.inner, request.into()).await?;
        self.inner.wake.notify_one();
        Ok(run_id)
    }

    /// Serves the store's work queue with [`WorkerOptions::default`] until `shutdown`
    /// completes: see [`serve_with`](Self::serve_with).
    ///
    /// # Errors
    /// As [`serve_with`](Self::serve_with).
    pub async fn serve(&self, shutdown: impl Future<Output = ()>) -> Result<ServeReport, RunError> {
        self.serve_with(shutdown, WorkerOptions::default()).await
    }

    /// Serves the store's work queue until `shutdown` completes: claims runnable runs (those
    /// [`submit`](Self::submit)ted, made runnable by a decision
    /// ([`record_decision`](crate::record_decision)), handed back, or orphaned by a process
    /// that died: their lease expired), up to [`WorkerOptions::max_concurrent_runs`] at once,
    /// and drives each turn under the lease its claim was granted, resuming from the journal.
    ///
    /// After `shutdown`, no run is claimed; in-flight turns get
    /// [`WorkerOptions::shutdown_grace`] to finish, then are stopped and handed back.
    ///
    /// Runs this worker cannot drive (unknown agent, corrupt state) end failed like any turn;
    /// store outages are logged and retried.
    ///
    /// ```
    /// use kuralle::{AgentDef, Runtime, testing::{ScriptedModel, Turn}};
    ///
    /// # tokio::runtime::Runtime::new().unwrap().block_on(async {
    /// let runtime = Runtime::builder()
    ///     .agent(AgentDef::new("support", "Be brief."))
    ///     .model(ScriptedModel::new([Turn::text("unused")]))
    ///     .build()
    ///     .unwrap();
    /// // Nothing to do: returns as soon as the shutdown future completes.
    /// let report = runtime.serve(async {}).await.unwrap();
    /// assert_eq!(report.claimed, 0);
    /// # });
    /// ```
    ///
    /// # Errors
    /// [`RunError::Store`] when the store fails in a way retrying cannot fix (corrupt, or a
    /// connection refused: [`StoreError::Tls`](crate::StoreError::Tls),
    /// [`StoreError::AccessDenied`](crate::StoreError::AccessDenied)).
    pub async fn serve_with(
        &self,
        shutdown: impl Future<Output = ()>,
        options: WorkerOptions,
    ) -> Result<ServeReport, RunError> {
        let owner = self.inner.owner_id();
        let span = tracing::info_span!("worker", owner = %owner);
        Worker { inner: Arc::clone(&self.inner), owner, options, tasks: JoinSet::new(), in_flight: HashMap::new() }
            .serve(shutdown)
            .instrument(span)
            .await
    }
}

/// The longest pause between two claims while the store fails: the backoff doubles from
/// `poll_interval` up to this (or `poll_interval`, if longer), so an outage costs at most this
/// much after it ends. A claim is one cheap statement; trying it every 2 s is no load on a
/// server that is coming back.
const MAX_CLAIM_BACKOFF: Duration = Duration::from_secs(2);

struct Worker {
    inner: Arc<Inner>,
    owner: String,
    options: WorkerOptions,
    tasks: JoinSet<Result<RunOutput, RunError>>,
    /// The run of each turn task, and the token that hands it back.
    in_flight: HashMap<Id, InFlight>,
}

struct InFlight {
    run_id: String,
    hand_back: CancellationToken,
}

impl Worker {
    async fn serve(mut self, shutdown: impl Future<Output = ()>) -> Result<ServeReport, RunError> {
        let mut report = ServeReport::default();
        let mut store_backoff = self.options.poll_interval;
        tokio::pin!(shutdown);
        loop {
            let free = self.options.max_concurrent_runs.max(1).saturating_sub(self.tasks.len());
            if free > 0 {
                // No lease under the instance's id without the proof that this process holds it.
                let sent = tokio::time::Instant::now();
                let claimed = match self.inner.claim_instance().await {
                    Ok(claim) => self
                        .inner
                        .store
                        .claim_runnable(&self.owner, self.inner.lease_ttl, free)
                        .await
                        .map(|leases| (leases, claim))
                        .map_err(RunError::from),
                    Err(e) => Err(e),
                };
                match claimed {
                    Ok((leases, claim)) => {
                        store_backoff = self.options.poll_interval;
                        for lease in leases {
                            report.claimed += 1;
                            self.start(lease, sent, claim);
                        }
                    }
                    Err(e) if e.is_retryable() => {
                        tracing::warn!(error = %e, "claiming runnable runs failed; retrying");
                        tokio::select! {
                            () = &mut shutdown => break,
                            () = tokio::time::sleep(store_backoff) => {}
                        }
                        store_backoff = (store_backoff * 2).min(MAX_CLAIM_BACKOFF.max(self.options.poll_interval));
                        continue;
                    }
                    Err(e) => {
                        // Retrying cannot fix it (a corrupt store, or another live process
                        // holds this instance id): stop claiming, and let in-flight turns end
                        // (or hand them back) before reporting it.
                        tracing::error!(error = %e, "claiming runnable runs failed; the worker stops");
                        self.drain(&mut report).await;
                        return Err(e);
                    }
                }
            }
            let store = Arc::clone(&self.inner.store);
            let inner = Arc::clone(&self.inner);
            tokio::select! {
                () = &mut shutdown => break,
                Some(done) = self.tasks.join_next_with_id(), if !self.tasks.is_empty() => {
                    self.settle(done, &mut report).await;
                }
                // Nothing to wait for while full: a finishing turn frees a slot.
                () = store.wait_runnable(self.options.poll_interval), if free > 0 => {}
                () = inner.wake.notified(), if free > 0 => {}
            }
        }
        self.drain(&mut report).await;
        Ok(report)
    }

    /// Drives a claimed run's turn under `lease`, granted by a claim sent at `sent` under the
    /// instance `claim`.
    fn start(&mut self, lease: Lease, sent: tokio::time::Instant, claim: Claim) {
        tracing::debug!(run_id = %lease.run_id, token = lease.token, "claimed a runnable run");
        let inner = Arc::clone(&self.inner);
        let run_id = lease.run_id.clone();
        let request = RunRequest { run_id: Some(run_id.clone()), hand_back: true, ..RunRequest::default() };
        // Events go nowhere: a worker's output is the journal and the run record.
        let (events, _) = crate::event::EventSender::channel(1);
        let hand_back = CancellationToken::new();
        let token = hand_back.clone();
        let task = self.tasks.spawn(entry::run_leased(inner, request, events, token, None, Some((lease, sent, claim))));
        self.in_flight.insert(task.id(), InFlight { run_id, hand_back });
    }

    async fn settle(
        &mut self,
        done: Result<(Id, Result<RunOutput, RunError>), tokio::task::JoinError>,
        report: &mut ServeReport,
    ) {
        let (id, result) = match done {
            Ok((id, result)) => (id, result),
            Err(e) => {
                let id = e.id();
                let message = if e.is_panic() { "the turn panicked" } else { "the turn was cancelled" };
                (id, Err(RunError::Internal(message.to_owned())))
            }
        };
        let Some(InFlight { run_id, .. }) = self.in_flight.remove(&id) else { return };
        match result {
            Ok(out) => {
                tracing::debug!(run_id = %out.run_id, status = ?out.status, "turn ended");
                report.completed += 1;
            }
            Err(RunError::LeaseLost { .. }) => report.lost += 1,
            Err(RunError::HandedBack { .. }) => {
                tracing::info!(run_id, "handed the run back");
                report.handed_back += 1;
            }
            Err(e) if e.is_retryable() => {
                report.retried += 1;
                // A store outage is not the run's failure: once the store is back, the run
                // goes on after one poll instead of the whole backoff.
                let pause = match &e {
                    RunError::Store(_) => self.options.poll_interval.min(self.options.retry_backoff),
                    _ => self.options.retry_backoff,
                };
                tracing::warn!(run_id, error = %e, ?pause, "turn failed; the run is retried after a backoff");
                self.back_off(&run_id, pause).await;
            }
            Err(e) => {
                // The run ended failed (the turn marked it) or is left as it was; either way
                // give it a pause before anyone claims it again.
                report.completed += 1;
                tracing::warn!(run_id, error = %e, "turn failed");
                self.back_off(&run_id, self.options.retry_backoff).await;
            }
        }
    }

    /// Holds the (released) run for `pause`, so no worker claims it at once.
    async fn back_off(&self, run_id: &str, pause: Duration) {
        let owner = format!("{}/backoff", self.owner);
        match self.inner.store.acquire_lease(run_id, &owner, pause).await {
            Ok(_) | Err(StoreError::LeaseHeld { .. }) => {}
            Err(e) => tracing::debug!(run_id, error = %e, "could not hold the run for its backoff"),
        }
    }

    /// Lets in-flight turns finish within the grace period, then hands the rest back. A turn
    /// is never aborted: it is told to hand back and ends on its own, after its calls, with
    /// its outcomes journaled and its lease released, so nothing of it outlives the lease.
    async fn drain(&mut self, report: &mut ServeReport) {
        let grace = tokio::time::sleep(self.options.shutdown_grace);
        tokio::pin!(grace);
        loop {
            tokio::select! {
                done = self.tasks.join_next_with_id() => match done {
                    Some(done) => self.settle(done, report).await,
                    None => return,
                },
                () = &mut grace => break,
            }
        }
        for in_flight in self.in_flight.values() {
            in_flight.hand_back.cancel();
        }
        // Calls that cannot be interrupted keep their turn (and its lease) until they end.
        let mut waiting = tokio::time::interval(self.options.shutdown_grace.max(Duration::from_secs(1)));
        waiting.tick().await;
        loop {
            tokio::select! {
                done = self.tasks.join_next_with_id() => match done {
                    Some(done) => self.settle(done, report).await,
                    None => return,
                },
                _ = waiting.tick() => {
                    let runs: Vec<&str> = self.in_flight.values().map(|f| f.run_id.as_str()).collect();
                    tracing::warn!(
                        runs = ?runs,
                        "shutdown waits for calls that cannot be interrupted; their runs keep their leases until they end"
                    );
                }
            }
        }
    }
}
