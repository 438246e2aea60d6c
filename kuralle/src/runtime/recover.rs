//! `Runtime::recover`: a restarted instance takes its dead predecessor's runs back and resumes
//! them at once.

use futures::StreamExt;

use super::Runtime;
use crate::{error::RunError, event::RunOutput, store::RunStatus};

/// Default for [`Runtime::recover_with`]: at most 8 runs resumed at once.
///
/// ```
/// assert_eq!(kuralle::DEFAULT_RECOVER_CONCURRENCY, 8);
/// ```
pub const DEFAULT_RECOVER_CONCURRENCY: usize = 8;

/// What [`Runtime::recover`] did.
///
/// ```
/// let recovered = kuralle::Recovered::default();
/// assert!(recovered.taken_back.is_empty() && recovered.resumed.is_empty());
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Recovered {
    /// The runs whose leases the instance's previous process held when it died, taken back
    /// (their leases ended), in run id order.
    pub taken_back: Vec<String>,
    /// Each taken-back run that was unfinished (status [`Running`](RunStatus::Running)),
    /// resumed, and how its turn ended, in the order of `taken_back`. Runs that were paused,
    /// finished, or never created are taken back but not resumed.
    pub resumed: Vec<RecoveredRun>,
}

/// One run [`Runtime::recover`] resumed.
///
/// ```
/// let run = kuralle::RecoveredRun::new("run-1", Err(kuralle::RunError::RunNotFound("run-1".into())));
/// assert!(run.result.is_err());
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct RecoveredRun {
    /// Run id.
    pub run_id: String,
    /// How the resumed turn ended: its output, or why it could not go on (for example
    /// [`RunError::Busy`] when a worker of another process claimed the run first).
    pub result: Result<RunOutput, RunError>,
}

impl RecoveredRun {
    /// A run and how its resumed turn ended.
    pub fn new(run_id: impl Into<String>, result: Result<RunOutput, RunError>) -> Self {
        Self { run_id: run_id.into(), result }
    }
}

impl Runtime {
    /// Recovers this instance after a restart: claims the instance id (see
    /// [`RuntimeBuilder::instance_id`](crate::RuntimeBuilder::instance_id)), takes back every
    /// run whose lease the instance's previous process held when it died (with proof that it
    /// is gone, so without waiting for the leases to expire), and resumes the unfinished ones,
    /// [`DEFAULT_RECOVER_CONCURRENCY`] at a time; returns when their turns have ended.
    ///
    /// It resumes runs that were **held** by the previous process, that is, runs it was
    /// driving when it died. A run that is `Running` without a lease was given up on purpose
    /// (handed back to the work queue, or left after an error its caller was told of): it is
    /// runnable, and [`serve`](Self::serve) workers claim it, so `recover` leaves it alone.
    ///
    /// A run that cannot resume reports its error in [`Recovered::resumed`]; the others go on.
    /// A store that cannot prove the previous process is gone
    /// ([`RunStore::lock_instance`](crate::RunStore::lock_instance) returns `None`) has nothing
    /// to take back. Calling it again returns only what was taken back since (normally
    /// nothing); if another entry point claimed the id first, `recover` still gets the runs
    /// that claim took back.
    ///
    /// ```
    /// use std::time::Duration;
    /// use kuralle::{AgentDef, RunStatus, RunStore, Runtime, stores::MemoryStore, testing::{ScriptedModel, Turn}};
    ///
    /// # tokio::runtime::Runtime::new().unwrap().block_on(async {
    /// let store = MemoryStore::new();
    /// let hour = Duration::from_secs(3600);
    /// let builder = || {
    ///     Runtime::builder()
    ///         .agent(AgentDef::new("support", "Be brief."))
    ///         .model(ScriptedModel::new([Turn::text("Hello.")]))
    ///         .store(store.clone())
    ///         .lease_ttl(hour)
    /// };
    /// builder().build()?.run(kuralle::RunRequest::new("Hi").run_id("run-1")).await?;
    /// // Say a process of instance `app-1` was in the middle of run-1's turn when it was
    /// // killed: the run is `Running`, and its lease has an hour to go.
    /// let lease = store.acquire_lease("run-1", "app-1/0a7c", hour).await?;
    /// let mut record = store.get_run("run-1").await?.unwrap();
    /// record.status = RunStatus::Running;
    /// store.put_run(record, lease.token).await?;
    ///
    /// // Its replacement gets the run back at once, and finishes it from the journal.
    /// let runtime = builder().instance_id("app-1").build()?;
    /// let recovered = runtime.recover().await?;
    /// assert_eq!(recovered.taken_back, ["run-1"]);
    /// let output = recovered.resumed[0].result.as_ref().unwrap();
    /// assert_eq!((output.status, output.text.as_str()), (RunStatus::Finished, "Hello."));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// # }).unwrap();
    /// ```
    ///
    /// # Errors
    /// [`RunError::Config`] when the runtime has no instance id; [`RunError::InstanceInUse`]
    /// when another live process holds it; [`RunError::Store`] when the store fails while
    /// claiming it or taking runs back.
    pub async fn recover(&self) -> Result<Recovered, RunError> {
        self.recover_with(DEFAULT_RECOVER_CONCURRENCY).await
    }

    /// [`recover`](Self::recover), resuming at most `max_concurrent_runs` runs at once (at
    /// least 1).
    ///
    /// ```
    /// use kuralle::{AgentDef, Runtime, testing::ScriptedModel};
    ///
    /// # tokio::runtime::Runtime::new().unwrap().block_on(async {
    /// let runtime = Runtime::builder()
    ///     .agent(AgentDef::new("support", "Be brief."))
    ///     .model(ScriptedModel::new([]))
    ///     .instance_id("app-1")
    ///     .build()?;
    /// assert!(runtime.recover_with(2).await?.resumed.is_empty());
    /// # Ok::<(), kuralle::RunError>(())
    /// # }).unwrap();
    /// ```
    ///
    /// # Errors
    /// As [`recover`](Self::recover).
    pub async fn recover_with(&self, max_concurrent_runs: usize) -> Result<Recovered, RunError> {
        let Some(instance) = &self.inner.instance else {
            return Err(RunError::Config(
                "`recover` needs an instance id: set one with `RuntimeBuilder::instance_id`".into(),
            ));
        };
        instance.claim().await?;
        let taken_back = instance.take_taken();
        let mut unfinished = Vec::new();
        let mut unreadable = Vec::new();
        for run_id in &taken_back {
            match self.inner.store.get_run(run_id).await {
                Ok(Some(record)) if record.status == RunStatus::Running => unfinished.push(run_id.clone()),
                Ok(_) => {}
                Err(e) => unreadable.push(RecoveredRun::new(run_id.clone(), Err(e.into()))),
            }
        }
        let mut resumed: Vec<RecoveredRun> = futures::stream::iter(unfinished)
            .map(|run_id| async move {
                let result = self.resume(run_id.as_str()).await;
                RecoveredRun { run_id, result }
            })
            .buffered(max_concurrent_runs.max(1))
            .collect()
            .await;
        resumed.extend(unreadable);
        let order = |run_id: &str| taken_back.iter().position(|id| id == run_id);
        resumed.sort_by_key(|run| order(&run.run_id));
        Ok(Recovered { taken_back, resumed })
    }
}
