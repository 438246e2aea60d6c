//! Runs: a run's row, its status, and what listing returns.

use serde::{Deserialize, Serialize};

use crate::json::JsonText;

/// A new run's id, when the caller gives none: a UUID v7, hyphenated.
///
/// Its leading bits are the time of its making, so runs made one after another have ids in
/// order, and every index keyed by run id (the store's runs, leases and journal) takes a new
/// run at its right edge, beside the other recent runs, instead of at a random page. With
/// random (v4) ids, a store holding many finished runs spread the writes of the few in flight
/// over all of its pages; SQLite and PostgreSQL both split pages at random places for them.
///
/// A clock set before 1970, where a v7 id cannot be made (uuid would panic), gives a random
/// (v4) id instead.
pub(crate) fn new_run_id() -> String {
    let clock_ok = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).is_ok();
    if clock_ok { uuid::Uuid::now_v7() } else { uuid::Uuid::new_v4() }.to_string()
}

/// Lifecycle of a run.
///
/// ```
/// use kuralle::RunStatus;
///
/// let status = RunStatus::MaxSteps;
/// assert_eq!(status.as_str(), "max_steps");
/// assert_eq!(serde_json::to_value(status).unwrap(), "max_steps");
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RunStatus {
    /// A turn is in progress (or was, when its process died: resume it).
    Running,
    /// Waiting for a human decision.
    Paused,
    /// The last turn finished with a model answer.
    Finished,
    /// The last turn reached `max_steps` before the model answered.
    MaxSteps,
    /// The caller interrupted the last turn.
    Interrupted,
    /// The last turn failed with an error that is not retryable.
    Failed,
    /// The run was stopped before a model request or tool batch that would have passed one
    /// of its [`RunLimits`](crate::RunLimits).
    LimitExceeded,
    /// An operator cancelled the run ([`RunStore::cancel_run`](super::RunStore::cancel_run),
    /// [`Runtime::cancel`](crate::Runtime::cancel)): its owner, if any, stopped at its next
    /// step, and no worker resumes it.
    Cancelled,
}

impl RunStatus {
    /// The status as stored (`"running"`, `"max_steps"`, ...).
    ///
    /// ```
    /// assert_eq!(kuralle::RunStatus::Paused.as_str(), "paused");
    /// ```
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Running => "running",
            Self::Paused => "paused",
            Self::Finished => "finished",
            Self::MaxSteps => "max_steps",
            Self::Interrupted => "interrupted",
            Self::Failed => "failed",
            Self::LimitExceeded => "limit_exceeded",
            Self::Cancelled => "cancelled",
        }
    }

    /// Parses [`as_str`](Self::as_str) output.
    ///
    /// ```
    /// use kuralle::RunStatus;
    ///
    /// assert_eq!(RunStatus::parse("finished"), Some(RunStatus::Finished));
    /// assert_eq!(RunStatus::parse("cancelled"), Some(RunStatus::Cancelled));
    /// assert_eq!(RunStatus::parse("done"), None);
    /// ```
    pub fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "running" => Self::Running,
            "paused" => Self::Paused,
            "finished" => Self::Finished,
            "max_steps" => Self::MaxSteps,
            "interrupted" => Self::Interrupted,
            "failed" => Self::Failed,
            "limit_exceeded" => Self::LimitExceeded,
            "cancelled" => Self::Cancelled,
            _ => return None,
        })
    }
}

/// As stored: `"running"`, `"cancelled"`, ...
///
/// ```
/// assert_eq!(kuralle::RunStatus::Cancelled.to_string(), "cancelled");
/// ```
impl std::fmt::Display for RunStatus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A run's state row. `state` is owned by the runtime (transcript, current turn); stores
/// keep it opaque.
///
/// ```
/// use kuralle::{RunStore, stores::MemoryStore};
/// # tokio::runtime::Runtime::new().unwrap().block_on(async {
/// let store = MemoryStore::new();
/// let lease = store.acquire_lease("run-1", "worker-a", std::time::Duration::from_secs(30)).await?;
/// store.create_run(kuralle::RunRecord::new("run-1", "support"), lease.token).await?;
/// let record = store.get_run("run-1").await?.expect("created");
/// assert_eq!((record.agent_id.as_str(), record.version), ("support", 0));
/// # Ok::<(), kuralle::StoreError>(())
/// # }).unwrap();
/// ```
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunRecord {
    /// Run id.
    pub run_id: String,
    /// The agent that owns the run.
    pub agent_id: String,
    /// Lifecycle status.
    pub status: RunStatus,
    /// Current turn epoch; journal keys of earlier turns never match.
    pub epoch: u64,
    /// Optimistic-concurrency version, bumped by every successful [`RunStore::put_run`](super::RunStore::put_run).
    pub version: u64,
    /// Runtime-owned state, as JSON text.
    pub state: JsonText,
    /// Creation time, milliseconds since the Unix epoch.
    pub created_at_ms: i64,
    /// Last update time, milliseconds since the Unix epoch.
    pub updated_at_ms: i64,
}

impl RunRecord {
    /// A new run of `agent_id`: status [`Running`](RunStatus::Running), epoch and version 0,
    /// `null` state, created and updated now.
    ///
    /// ```
    /// let record = kuralle::RunRecord::new("run-1", "support");
    /// assert_eq!((record.status, record.version, record.epoch), (kuralle::RunStatus::Running, 0, 0));
    /// assert_eq!(record.created_at_ms, record.updated_at_ms);
    /// ```
    pub fn new(run_id: impl Into<String>, agent_id: impl Into<String>) -> Self {
        let now = crate::clock::now_ms();
        Self {
            run_id: run_id.into(),
            agent_id: agent_id.into(),
            status: RunStatus::Running,
            epoch: 0,
            version: 0,
            state: JsonText::null(),
            created_at_ms: now,
            updated_at_ms: now,
        }
    }

    /// The record with `state` as its runtime-owned state.
    #[must_use]
    pub fn with_state(mut self, state: JsonText) -> Self {
        self.state = state;
        self
    }
}

/// What [`RunStore::list_runs`](super::RunStore::list_runs) returns per run: no state, no journal.
///
/// ```
/// use kuralle::{RunStore, stores::MemoryStore};
/// # tokio::runtime::Runtime::new().unwrap().block_on(async {
/// let store = MemoryStore::new();
/// let lease = store.acquire_lease("run-1", "worker-a", std::time::Duration::from_secs(30)).await?;
/// store.create_run(kuralle::RunRecord::new("run-1", "support"), lease.token).await?;
/// let summaries = store.list_runs(kuralle::RunFilter::default()).await?;
/// assert_eq!(summaries[0].run_id, "run-1");
/// # Ok::<(), kuralle::StoreError>(())
/// # }).unwrap();
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RunSummary {
    /// Run id.
    pub run_id: String,
    /// The agent that owns the run.
    pub agent_id: String,
    /// Lifecycle status.
    pub status: RunStatus,
    /// Last update time, milliseconds since the Unix epoch.
    pub updated_at_ms: i64,
}

/// Which runs [`RunStore::list_runs`](super::RunStore::list_runs) returns.
///
/// ```
/// use kuralle::{RunStore, stores::MemoryStore};
/// # tokio::runtime::Runtime::new().unwrap().block_on(async {
/// use kuralle::{RunFilter, RunStatus};
///
/// let store = MemoryStore::new();
/// let lease = store.acquire_lease("run-1", "worker-a", std::time::Duration::from_secs(30)).await?;
/// store.create_run(kuralle::RunRecord::new("run-1", "support"), lease.token).await?;
/// let paused = RunFilter { status: Some(RunStatus::Paused), limit: Some(10) };
/// assert!(store.list_runs(paused).await?.is_empty());
/// # Ok::<(), kuralle::StoreError>(())
/// # }).unwrap();
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RunFilter {
    /// Only runs with this status.
    pub status: Option<RunStatus>,
    /// At most this many, most recently updated first.
    pub limit: Option<usize>,
}
