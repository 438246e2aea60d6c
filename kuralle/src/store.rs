//! The `RunStore` contract: where runs and their append-only journals live.
//!
//! Implementations are in [`crate::stores`]. Every store passes the same conformance suite
//! (`tests/store_conformance.rs`).

use std::time::Duration;

use futures::future::BoxFuture;
use serde::{Deserialize, Serialize};

use crate::JsonText;

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
        }
    }

    /// Parses [`as_str`](Self::as_str) output.
    ///
    /// ```
    /// use kuralle::RunStatus;
    ///
    /// assert_eq!(RunStatus::parse("finished"), Some(RunStatus::Finished));
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
            _ => return None,
        })
    }
}

/// A run's state row. `state` is owned by the runtime (transcript, current turn); stores
/// keep it opaque.
///
/// ```
/// # fn run(id: &str) -> kuralle::RunRecord {
/// #     kuralle::RunRecord { run_id: id.into(), agent_id: "support".into(), status: kuralle::RunStatus::Running,
/// #         epoch: 0, version: 0, state: kuralle::JsonText::null(), created_at_ms: 0, updated_at_ms: 0 }
/// # }
/// # fn step(key: &str) -> kuralle::NewStep {
/// #     kuralle::NewStep { key: key.into(), kind: kuralle::StepKind::Tool, name: "charge".into(), epoch: 0, started_at_ms: 0 }
/// # }
/// use kuralle::{RunStore, stores::MemoryStore};
/// # tokio::runtime::Runtime::new().unwrap().block_on(async {
/// let store = MemoryStore::new();
/// let lease = store.acquire_lease("run-1", "worker-a", std::time::Duration::from_secs(30)).await?;
/// store.create_run(run("run-1"), lease.token).await?;
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
    /// Optimistic-concurrency version, bumped by every successful [`RunStore::put_run`].
    pub version: u64,
    /// Runtime-owned state, as JSON text.
    pub state: JsonText,
    /// Creation time, milliseconds since the Unix epoch.
    pub created_at_ms: i64,
    /// Last update time, milliseconds since the Unix epoch.
    pub updated_at_ms: i64,
}

/// What [`RunStore::list_runs`] returns per run: no state, no journal.
///
/// ```
/// # fn run(id: &str) -> kuralle::RunRecord {
/// #     kuralle::RunRecord { run_id: id.into(), agent_id: "support".into(), status: kuralle::RunStatus::Running,
/// #         epoch: 0, version: 0, state: kuralle::JsonText::null(), created_at_ms: 0, updated_at_ms: 0 }
/// # }
/// # fn step(key: &str) -> kuralle::NewStep {
/// #     kuralle::NewStep { key: key.into(), kind: kuralle::StepKind::Tool, name: "charge".into(), epoch: 0, started_at_ms: 0 }
/// # }
/// use kuralle::{RunStore, stores::MemoryStore};
/// # tokio::runtime::Runtime::new().unwrap().block_on(async {
/// let store = MemoryStore::new();
/// let lease = store.acquire_lease("run-1", "worker-a", std::time::Duration::from_secs(30)).await?;
/// store.create_run(run("run-1"), lease.token).await?;
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

/// Which runs [`RunStore::list_runs`] returns.
///
/// ```
/// # fn run(id: &str) -> kuralle::RunRecord {
/// #     kuralle::RunRecord { run_id: id.into(), agent_id: "support".into(), status: kuralle::RunStatus::Running,
/// #         epoch: 0, version: 0, state: kuralle::JsonText::null(), created_at_ms: 0, updated_at_ms: 0 }
/// # }
/// # fn step(key: &str) -> kuralle::NewStep {
/// #     kuralle::NewStep { key: key.into(), kind: kuralle::StepKind::Tool, name: "charge".into(), epoch: 0, started_at_ms: 0 }
/// # }
/// use kuralle::{RunStore, stores::MemoryStore};
/// # tokio::runtime::Runtime::new().unwrap().block_on(async {
/// use kuralle::{RunFilter, RunStatus};
///
/// let store = MemoryStore::new();
/// let lease = store.acquire_lease("run-1", "worker-a", std::time::Duration::from_secs(30)).await?;
/// store.create_run(run("run-1"), lease.token).await?;
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

/// What a journal step records.
///
/// ```
/// use kuralle::StepKind;
///
/// assert_eq!(StepKind::Approval.as_str(), "approval");
/// assert_eq!(StepKind::parse("model"), Some(StepKind::Model));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StepKind {
    /// A tool call (model-issued or nested `ctx.tool`).
    Tool,
    /// A model response.
    Model,
    /// `ctx.now()`.
    Now,
    /// `ctx.uuid()`.
    Uuid,
    /// A human decision on a `needs_approval` call.
    Approval,
}

impl StepKind {
    /// The kind as stored.
    ///
    /// ```
    /// assert_eq!(kuralle::StepKind::Tool.as_str(), "tool");
    /// ```
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Tool => "tool",
            Self::Model => "model",
            Self::Now => "now",
            Self::Uuid => "uuid",
            Self::Approval => "approval",
        }
    }

    /// Parses [`as_str`](Self::as_str) output.
    ///
    /// ```
    /// use kuralle::StepKind;
    ///
    /// assert_eq!(StepKind::parse("uuid"), Some(StepKind::Uuid));
    /// assert_eq!(StepKind::parse("sleep"), None);
    /// ```
    pub fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "tool" => Self::Tool,
            "model" => Self::Model,
            "now" => Self::Now,
            "uuid" => Self::Uuid,
            "approval" => Self::Approval,
            _ => return None,
        })
    }
}

/// Where a step is.
///
/// ```
/// # fn run(id: &str) -> kuralle::RunRecord {
/// #     kuralle::RunRecord { run_id: id.into(), agent_id: "support".into(), status: kuralle::RunStatus::Running,
/// #         epoch: 0, version: 0, state: kuralle::JsonText::null(), created_at_ms: 0, updated_at_ms: 0 }
/// # }
/// # fn step(key: &str) -> kuralle::NewStep {
/// #     kuralle::NewStep { key: key.into(), kind: kuralle::StepKind::Tool, name: "charge".into(), epoch: 0, started_at_ms: 0 }
/// # }
/// use kuralle::{RunStore, stores::MemoryStore};
/// # tokio::runtime::Runtime::new().unwrap().block_on(async {
/// use kuralle::{StepOutcome, StepStatus};
///
/// let store = MemoryStore::new();
/// let lease = store.acquire_lease("run-1", "worker-a", std::time::Duration::from_secs(30)).await?;
/// store.create_run(run("run-1"), lease.token).await?;
/// store.append_steps("run-1", lease.token, vec![step("k1")]).await?;
/// assert_eq!(store.steps("run-1").await?[0].status, StepStatus::Running);
/// store.finish_step("run-1", lease.token, 0, StepOutcome::Finished(kuralle::JsonText::from(serde_json::json!(1))), 5).await?;
/// assert_eq!(store.steps("run-1").await?[0].status, StepStatus::Finished);
/// # Ok::<(), kuralle::StoreError>(())
/// # }).unwrap();
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StepStatus {
    /// Intent written; no outcome yet (or the process died before it was written).
    Running,
    /// Finished with a result.
    Finished,
    /// Finished with a typed error.
    Failed,
}

impl StepStatus {
    /// The status as stored.
    ///
    /// ```
    /// assert_eq!(kuralle::StepStatus::Failed.as_str(), "failed");
    /// ```
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Running => "running",
            Self::Finished => "finished",
            Self::Failed => "failed",
        }
    }

    /// Parses [`as_str`](Self::as_str) output.
    ///
    /// ```
    /// use kuralle::StepStatus;
    ///
    /// assert_eq!(StepStatus::parse("running"), Some(StepStatus::Running));
    /// assert_eq!(StepStatus::parse("paused"), None);
    /// ```
    pub fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "running" => Self::Running,
            "finished" => Self::Finished,
            "failed" => Self::Failed,
            _ => return None,
        })
    }
}

/// An intent to append: the store assigns the ordinal.
///
/// ```
/// # fn run(id: &str) -> kuralle::RunRecord {
/// #     kuralle::RunRecord { run_id: id.into(), agent_id: "support".into(), status: kuralle::RunStatus::Running,
/// #         epoch: 0, version: 0, state: kuralle::JsonText::null(), created_at_ms: 0, updated_at_ms: 0 }
/// # }
/// # fn step(key: &str) -> kuralle::NewStep {
/// #     kuralle::NewStep { key: key.into(), kind: kuralle::StepKind::Tool, name: "charge".into(), epoch: 0, started_at_ms: 0 }
/// # }
/// use kuralle::{RunStore, stores::MemoryStore};
/// # tokio::runtime::Runtime::new().unwrap().block_on(async {
/// use kuralle::{NewStep, StepKind};
///
/// let store = MemoryStore::new();
/// let lease = store.acquire_lease("run-1", "worker-a", std::time::Duration::from_secs(30)).await?;
/// store.create_run(run("run-1"), lease.token).await?;
/// let intent = NewStep { key: "k1".into(), kind: StepKind::Now, name: "now".into(), epoch: 0, started_at_ms: 1 };
/// assert_eq!(store.append_steps("run-1", lease.token, vec![intent]).await?, vec![0]);
/// # Ok::<(), kuralle::StoreError>(())
/// # }).unwrap();
/// ```
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NewStep {
    /// Effect key, unique within the run.
    pub key: String,
    /// What the step records.
    pub kind: StepKind,
    /// Tool name, or `"model"`, `"now"`, `"uuid"`.
    pub name: String,
    /// The run epoch the step belongs to.
    pub epoch: u64,
    /// Start time, milliseconds since the Unix epoch.
    pub started_at_ms: i64,
}

/// The outcome that finalizes a `Running` step, as JSON text ([`JsonText`]): the runtime
/// writes a value's text once, a store measures it by its length and keeps (or writes) that
/// text as it is.
///
/// ```
/// # fn run(id: &str) -> kuralle::RunRecord {
/// #     kuralle::RunRecord { run_id: id.into(), agent_id: "support".into(), status: kuralle::RunStatus::Running,
/// #         epoch: 0, version: 0, state: kuralle::JsonText::null(), created_at_ms: 0, updated_at_ms: 0 }
/// # }
/// # fn step(key: &str) -> kuralle::NewStep {
/// #     kuralle::NewStep { key: key.into(), kind: kuralle::StepKind::Tool, name: "charge".into(), epoch: 0, started_at_ms: 0 }
/// # }
/// use kuralle::{RunStore, stores::MemoryStore};
/// # tokio::runtime::Runtime::new().unwrap().block_on(async {
/// use kuralle::StepOutcome;
///
/// let store = MemoryStore::new();
/// let lease = store.acquire_lease("run-1", "worker-a", std::time::Duration::from_secs(30)).await?;
/// store.create_run(run("run-1"), lease.token).await?;
/// store.append_steps("run-1", lease.token, vec![step("k1")]).await?;
/// let error = serde_json::json!({"failed": {"tool": "charge", "message": "card declined"}});
/// store.finish_step("run-1", lease.token, 0, StepOutcome::Failed(kuralle::JsonText::from(error.clone())), 9).await?;
/// assert_eq!(store.steps("run-1").await?[0].error.as_ref().expect("failed"), &error);
/// # Ok::<(), kuralle::StoreError>(())
/// # }).unwrap();
/// ```
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum StepOutcome {
    /// A result value.
    Finished(JsonText),
    /// A typed error, serialized (for tool steps, a [`crate::ToolError`]).
    Failed(JsonText),
}

impl StepOutcome {
    /// The outcome's JSON text, result or error.
    ///
    /// ```
    /// use kuralle::{JsonText, StepOutcome};
    ///
    /// let outcome = StepOutcome::Finished(JsonText::from(serde_json::json!({"charged": 12})));
    /// assert_eq!(outcome.text().as_str(), r#"{"charged":12}"#);
    /// ```
    pub fn text(&self) -> &JsonText {
        match self {
            Self::Finished(text) | Self::Failed(text) => text,
        }
    }
}

/// One journal entry.
///
/// ```
/// # fn run(id: &str) -> kuralle::RunRecord {
/// #     kuralle::RunRecord { run_id: id.into(), agent_id: "support".into(), status: kuralle::RunStatus::Running,
/// #         epoch: 0, version: 0, state: kuralle::JsonText::null(), created_at_ms: 0, updated_at_ms: 0 }
/// # }
/// # fn step(key: &str) -> kuralle::NewStep {
/// #     kuralle::NewStep { key: key.into(), kind: kuralle::StepKind::Tool, name: "charge".into(), epoch: 0, started_at_ms: 0 }
/// # }
/// use kuralle::{RunStore, stores::MemoryStore};
/// # tokio::runtime::Runtime::new().unwrap().block_on(async {
/// use kuralle::StepOutcome;
///
/// let store = MemoryStore::new();
/// let lease = store.acquire_lease("run-1", "worker-a", std::time::Duration::from_secs(30)).await?;
/// store.create_run(run("run-1"), lease.token).await?;
/// store.append_steps("run-1", lease.token, vec![step("k1")]).await?;
/// store.finish_step("run-1", lease.token, 0, StepOutcome::Finished(kuralle::JsonText::from(serde_json::json!("ok"))), 7).await?;
/// let entry = &store.steps("run-1").await?[0];
/// assert_eq!((entry.ordinal, entry.key.as_str(), entry.finished_at_ms), (0, "k1", Some(7)));
/// assert_eq!(entry.result.as_ref().map(kuralle::JsonText::as_str), Some(r#""ok""#));
/// # Ok::<(), kuralle::StoreError>(())
/// # }).unwrap();
/// ```
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StepRecord {
    /// Position in the run's journal: dense, from 0, in intent order.
    pub ordinal: u64,
    /// Effect key, unique within the run.
    pub key: String,
    /// What the step records.
    pub kind: StepKind,
    /// Tool name, or `"model"`, `"now"`, `"uuid"`.
    pub name: String,
    /// The run epoch the step belongs to.
    pub epoch: u64,
    /// Where the step is.
    pub status: StepStatus,
    /// The result as JSON text, when finished.
    pub result: Option<JsonText>,
    /// The serialized typed error as JSON text, when failed.
    pub error: Option<JsonText>,
    /// Start time, milliseconds since the Unix epoch.
    pub started_at_ms: i64,
    /// Finish time, milliseconds since the Unix epoch.
    pub finished_at_ms: Option<i64>,
}

/// Why a store operation failed.
///
/// ```
/// # fn run(id: &str) -> kuralle::RunRecord {
/// #     kuralle::RunRecord { run_id: id.into(), agent_id: "support".into(), status: kuralle::RunStatus::Running,
/// #         epoch: 0, version: 0, state: kuralle::JsonText::null(), created_at_ms: 0, updated_at_ms: 0 }
/// # }
/// # fn step(key: &str) -> kuralle::NewStep {
/// #     kuralle::NewStep { key: key.into(), kind: kuralle::StepKind::Tool, name: "charge".into(), epoch: 0, started_at_ms: 0 }
/// # }
/// use kuralle::{RunStore, stores::MemoryStore};
/// # tokio::runtime::Runtime::new().unwrap().block_on(async {
/// use kuralle::StoreError;
///
/// let store = MemoryStore::new();
/// let lease = store.acquire_lease("run-1", "worker-a", std::time::Duration::from_secs(30)).await?;
/// store.create_run(run("run-1"), lease.token).await?;
/// let again = store.create_run(run("run-1"), lease.token).await;
/// assert_eq!(again, Err(StoreError::RunExists("run-1".into())));
/// # Ok::<(), kuralle::StoreError>(())
/// # }).unwrap();
/// ```
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum StoreError {
    /// No run with that id.
    #[error("run `{0}` not found")]
    RunNotFound(String),
    /// [`RunStore::create_run`] for an id that exists.
    #[error("run `{0}` already exists")]
    RunExists(String),
    /// [`RunStore::put_run`] lost an optimistic-concurrency race.
    #[error("version conflict on run `{run_id}`: expected version {expected}, stored version is {actual}")]
    VersionConflict {
        /// Run id.
        run_id: String,
        /// The version the writer read.
        expected: u64,
        /// The version the store holds.
        actual: u64,
    },
    /// An intent whose key the run's journal already holds.
    #[error("step key `{key}` is already journaled for run `{run_id}`")]
    DuplicateKey {
        /// Run id.
        run_id: String,
        /// The effect key.
        key: String,
    },
    /// No step at that ordinal, or it is not `Running`.
    #[error("no running step {ordinal} in run `{run_id}`")]
    StepNotRunning {
        /// Run id.
        run_id: String,
        /// The ordinal.
        ordinal: u64,
    },
    /// The store cannot be reached or written right now (locked, read-only, disk full,
    /// connection lost). Nothing was lost; the operation can be retried and the run resumed.
    #[error("store unavailable (retryable): {0}")]
    Unavailable(String),
    /// The file or database is not a usable kuralle store.
    #[error("store is corrupt or not a kuralle store: {0}")]
    Corrupt(String),
    /// A limit of the store was reached (for example a value too large to store).
    #[error("store limit exceeded: {0}")]
    LimitExceeded(String),
    /// A write or renewal under a fencing token that is no longer the run's current one
    /// (someone acquired the lease since, or it was released). Nothing was changed.
    #[error("run `{run_id}`: lease token {token} is no longer current (another owner took over, or it was released)")]
    Fenced {
        /// Run id.
        run_id: String,
        /// The stale token.
        token: u64,
    },
    /// [`RunStore::acquire_lease`] while another owner holds an unexpired lease.
    #[error("run `{run_id}` is owned by `{owner}` until {expires_at_ms} (ms since the Unix epoch)")]
    LeaseHeld {
        /// Run id.
        run_id: String,
        /// The current holder.
        owner: String,
        /// When its lease expires, by the store's clock.
        expires_at_ms: i64,
    },
}

impl StoreError {
    /// Whether retrying the same operation later may succeed.
    ///
    /// ```
    /// use kuralle::StoreError;
    ///
    /// assert!(StoreError::Unavailable("database is locked".into()).is_retryable());
    /// assert!(!StoreError::RunNotFound("run-1".into()).is_retryable());
    /// ```
    pub fn is_retryable(&self) -> bool {
        matches!(self, Self::Unavailable(_))
    }
}

/// Proof of ownership of one run, granted by [`RunStore::acquire_lease`].
///
/// Every write that belongs to the run carries [`token`](Self::token) as its `fence`; the
/// store rejects it with [`StoreError::Fenced`] once a newer lease was granted or this one was
/// released.
///
/// ```
/// use std::time::Duration;
/// use kuralle::{RunStore, stores::MemoryStore};
///
/// # futures::executor::block_on(async {
/// let store = MemoryStore::new();
/// let lease = store.acquire_lease("run-1", "worker-a", Duration::from_secs(30)).await?;
/// assert_eq!(lease.token, 1);
/// store.release_lease(&lease).await?;
/// let next = store.acquire_lease("run-1", "worker-b", Duration::from_secs(30)).await?;
/// assert_eq!(next.token, 2, "tokens only grow");
/// # Ok::<(), kuralle::StoreError>(())
/// # }).unwrap();
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Lease {
    /// Run id.
    pub run_id: String,
    /// Who holds it (unique per holder: e.g. `"<process uuid>/<turn uuid>"`).
    pub owner: String,
    /// Fencing token: per run, strictly greater than every token granted before for that
    /// run, including after release or expiry (never reused; the first grant is 1).
    pub token: u64,
    /// Expiry by the store's clock (ms since the Unix epoch). Informational for the holder.
    pub expires_at_ms: i64,
}

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
/// # fn run(id: &str) -> kuralle::RunRecord {
/// #     kuralle::RunRecord { run_id: id.into(), agent_id: "support".into(), status: kuralle::RunStatus::Running,
/// #         epoch: 0, version: 0, state: kuralle::JsonText::null(), created_at_ms: 0, updated_at_ms: 0 }
/// # }
/// # fn step(key: &str) -> kuralle::NewStep {
/// #     kuralle::NewStep { key: key.into(), kind: kuralle::StepKind::Tool, name: "charge".into(), epoch: 0, started_at_ms: 0 }
/// # }
/// use kuralle::{RunStore, stores::MemoryStore};
/// # tokio::runtime::Runtime::new().unwrap().block_on(async {
/// use kuralle::{StepOutcome, StoreError};
///
/// let store = MemoryStore::new();
/// let lease = store.acquire_lease("run-1", "worker-a", std::time::Duration::from_secs(30)).await?;
/// store.create_run(run("run-1"), lease.token).await?;
/// // Intent before execute: the step is journaled `Running` first...
/// let ordinals = store.append_steps("run-1", lease.token, vec![step("charge:o-1")]).await?;
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
    /// # fn run(id: &str) -> kuralle::RunRecord {
    /// #     kuralle::RunRecord { run_id: id.into(), agent_id: "support".into(), status: kuralle::RunStatus::Running,
    /// #         epoch: 0, version: 0, state: kuralle::JsonText::null(), created_at_ms: 0, updated_at_ms: 0 }
    /// # }
    /// # fn step(key: &str) -> kuralle::NewStep {
    /// #     kuralle::NewStep { key: key.into(), kind: kuralle::StepKind::Tool, name: "charge".into(), epoch: 0, started_at_ms: 0 }
    /// # }
    /// use kuralle::{RunStore, stores::MemoryStore};
    /// # tokio::runtime::Runtime::new().unwrap().block_on(async {
    /// let store = MemoryStore::new();
    /// let lease = store.acquire_lease("run-1", "worker-a", std::time::Duration::from_secs(30)).await?;
    /// store.create_run(run("run-1"), lease.token).await?;
    /// assert!(store.create_run(run("run-1"), lease.token).await.is_err()); // ids are unique
    /// # Ok::<(), kuralle::StoreError>(())
    /// # }).unwrap();
    /// ```
    fn create_run(&self, run: RunRecord, fence: u64) -> StoreFuture<'_, ()>;

    /// The run, if it exists.
    ///
    /// ```
    /// # fn run(id: &str) -> kuralle::RunRecord {
    /// #     kuralle::RunRecord { run_id: id.into(), agent_id: "support".into(), status: kuralle::RunStatus::Running,
    /// #         epoch: 0, version: 0, state: kuralle::JsonText::null(), created_at_ms: 0, updated_at_ms: 0 }
    /// # }
    /// # fn step(key: &str) -> kuralle::NewStep {
    /// #     kuralle::NewStep { key: key.into(), kind: kuralle::StepKind::Tool, name: "charge".into(), epoch: 0, started_at_ms: 0 }
    /// # }
    /// use kuralle::{RunStore, stores::MemoryStore};
    /// # tokio::runtime::Runtime::new().unwrap().block_on(async {
    /// let store = MemoryStore::new();
    /// let lease = store.acquire_lease("run-1", "worker-a", std::time::Duration::from_secs(30)).await?;
    /// store.create_run(run("run-1"), lease.token).await?;
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
    /// # fn run(id: &str) -> kuralle::RunRecord {
    /// #     kuralle::RunRecord { run_id: id.into(), agent_id: "support".into(), status: kuralle::RunStatus::Running,
    /// #         epoch: 0, version: 0, state: kuralle::JsonText::null(), created_at_ms: 0, updated_at_ms: 0 }
    /// # }
    /// # fn step(key: &str) -> kuralle::NewStep {
    /// #     kuralle::NewStep { key: key.into(), kind: kuralle::StepKind::Tool, name: "charge".into(), epoch: 0, started_at_ms: 0 }
    /// # }
    /// use kuralle::{RunStore, stores::MemoryStore};
    /// # tokio::runtime::Runtime::new().unwrap().block_on(async {
    /// let store = MemoryStore::new();
    /// let lease = store.acquire_lease("run-1", "worker-a", std::time::Duration::from_secs(30)).await?;
    /// store.create_run(run("run-1"), lease.token).await?;
    /// let read = store.get_run("run-1").await?.expect("created");
    /// assert_eq!(store.put_run(read.clone(), lease.token).await?, 1);
    /// // A second writer that read the same version loses.
    /// assert!(matches!(store.put_run(read, lease.token).await, Err(kuralle::StoreError::VersionConflict { .. })));
    /// # Ok::<(), kuralle::StoreError>(())
    /// # }).unwrap();
    /// ```
    fn put_run(&self, run: RunRecord, fence: u64) -> StoreFuture<'_, u64>;

    /// Runs matching `filter`, most recently updated first.
    ///
    /// ```
    /// # fn run(id: &str) -> kuralle::RunRecord {
    /// #     kuralle::RunRecord { run_id: id.into(), agent_id: "support".into(), status: kuralle::RunStatus::Running,
    /// #         epoch: 0, version: 0, state: kuralle::JsonText::null(), created_at_ms: 0, updated_at_ms: 0 }
    /// # }
    /// # fn step(key: &str) -> kuralle::NewStep {
    /// #     kuralle::NewStep { key: key.into(), kind: kuralle::StepKind::Tool, name: "charge".into(), epoch: 0, started_at_ms: 0 }
    /// # }
    /// use kuralle::{RunStore, stores::MemoryStore};
    /// # tokio::runtime::Runtime::new().unwrap().block_on(async {
    /// let store = MemoryStore::new();
    /// let lease = store.acquire_lease("run-1", "worker-a", std::time::Duration::from_secs(30)).await?;
    /// let lease2 = store.acquire_lease("run-2", "worker-a", std::time::Duration::from_secs(30)).await?;
    /// store.create_run(run("run-1"), lease.token).await?;
    /// store.create_run(run("run-2"), lease2.token).await?;
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
    /// # fn run(id: &str) -> kuralle::RunRecord {
    /// #     kuralle::RunRecord { run_id: id.into(), agent_id: "support".into(), status: kuralle::RunStatus::Running,
    /// #         epoch: 0, version: 0, state: kuralle::JsonText::null(), created_at_ms: 0, updated_at_ms: 0 }
    /// # }
    /// # fn step(key: &str) -> kuralle::NewStep {
    /// #     kuralle::NewStep { key: key.into(), kind: kuralle::StepKind::Tool, name: "charge".into(), epoch: 0, started_at_ms: 0 }
    /// # }
    /// use kuralle::{RunStore, stores::MemoryStore};
    /// # tokio::runtime::Runtime::new().unwrap().block_on(async {
    /// let store = MemoryStore::new();
    /// let lease = store.acquire_lease("run-1", "worker-a", std::time::Duration::from_secs(30)).await?;
    /// store.create_run(run("run-1"), lease.token).await?;
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
    /// # fn run(id: &str) -> kuralle::RunRecord {
    /// #     kuralle::RunRecord { run_id: id.into(), agent_id: "support".into(), status: kuralle::RunStatus::Running,
    /// #         epoch: 0, version: 0, state: kuralle::JsonText::null(), created_at_ms: 0, updated_at_ms: 0 }
    /// # }
    /// # fn step(key: &str) -> kuralle::NewStep {
    /// #     kuralle::NewStep { key: key.into(), kind: kuralle::StepKind::Tool, name: "charge".into(), epoch: 0, started_at_ms: 0 }
    /// # }
    /// use kuralle::{RunStore, stores::MemoryStore};
    /// # tokio::runtime::Runtime::new().unwrap().block_on(async {
    /// let store = MemoryStore::new();
    /// let lease = store.acquire_lease("run-1", "worker-a", std::time::Duration::from_secs(30)).await?;
    /// store.create_run(run("run-1"), lease.token).await?;
    /// assert_eq!(store.append_steps("run-1", lease.token, vec![step("a"), step("b")]).await?, vec![0, 1]);
    /// assert_eq!(store.append_steps("run-1", lease.token, vec![step("c")]).await?, vec![2]);
    /// # Ok::<(), kuralle::StoreError>(())
    /// # }).unwrap();
    /// ```
    fn append_steps<'a>(&'a self, run_id: &'a str, fence: u64, steps: Vec<NewStep>) -> StoreFuture<'a, Vec<u64>>;

    /// Finalizes a `Running` step, under lease `fence`.
    ///
    /// ```
    /// # fn run(id: &str) -> kuralle::RunRecord {
    /// #     kuralle::RunRecord { run_id: id.into(), agent_id: "support".into(), status: kuralle::RunStatus::Running,
    /// #         epoch: 0, version: 0, state: kuralle::JsonText::null(), created_at_ms: 0, updated_at_ms: 0 }
    /// # }
    /// # fn step(key: &str) -> kuralle::NewStep {
    /// #     kuralle::NewStep { key: key.into(), kind: kuralle::StepKind::Tool, name: "charge".into(), epoch: 0, started_at_ms: 0 }
    /// # }
    /// use kuralle::{RunStore, stores::MemoryStore};
    /// # tokio::runtime::Runtime::new().unwrap().block_on(async {
    /// let store = MemoryStore::new();
    /// let lease = store.acquire_lease("run-1", "worker-a", std::time::Duration::from_secs(30)).await?;
    /// store.create_run(run("run-1"), lease.token).await?;
    /// store.append_steps("run-1", lease.token, vec![step("a")]).await?;
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

    /// Appends `finished` already finished with `outcome`, then the `Running` intents
    /// `intents`, atomically, under lease `fence`; returns their ordinals (`finished`'s
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
        finished: NewStep,
        outcome: StepOutcome,
        finished_at_ms: i64,
        intents: Vec<NewStep>,
    ) -> StoreFuture<'a, Vec<u64>> {
        Box::pin(async move {
            let mut steps = Vec::with_capacity(intents.len() + 1);
            steps.push(finished);
            steps.extend(intents);
            let ordinals = self.append_steps(run_id, fence, steps).await?;
            let first = *ordinals
                .first()
                .ok_or_else(|| StoreError::Corrupt("the store assigned no ordinal to an appended step".to_owned()))?;
            self.finish_step(run_id, fence, first, outcome, finished_at_ms).await?;
            Ok(ordinals)
        })
    }

    /// The run's journal in ordinal order (empty for an unknown run).
    ///
    /// ```
    /// # fn run(id: &str) -> kuralle::RunRecord {
    /// #     kuralle::RunRecord { run_id: id.into(), agent_id: "support".into(), status: kuralle::RunStatus::Running,
    /// #         epoch: 0, version: 0, state: kuralle::JsonText::null(), created_at_ms: 0, updated_at_ms: 0 }
    /// # }
    /// # fn step(key: &str) -> kuralle::NewStep {
    /// #     kuralle::NewStep { key: key.into(), kind: kuralle::StepKind::Tool, name: "charge".into(), epoch: 0, started_at_ms: 0 }
    /// # }
    /// use kuralle::{RunStore, stores::MemoryStore};
    /// # tokio::runtime::Runtime::new().unwrap().block_on(async {
    /// let store = MemoryStore::new();
    /// let lease = store.acquire_lease("run-1", "worker-a", std::time::Duration::from_secs(30)).await?;
    /// store.create_run(run("run-1"), lease.token).await?;
    /// store.append_steps("run-1", lease.token, vec![step("a"), step("b")]).await?;
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

    /// Extends `lease` to the store's now + `ttl`; returns it with the new expiry. Succeeds iff
    /// its token is still the run's current one and not released (an expired lease nobody took
    /// over may be renewed); else [`StoreError::Fenced`].
    fn renew_lease<'a>(&'a self, lease: &'a Lease, ttl: Duration) -> StoreFuture<'a, Lease>;

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
