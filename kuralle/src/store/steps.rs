//! Journal steps: intents, outcomes and the entries a store keeps.

use serde::{Deserialize, Serialize};

use crate::json::JsonText;

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
    /// A turn's accepted typed output.
    Output,
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
            Self::Output => "output",
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
            "output" => Self::Output,
            _ => return None,
        })
    }
}

/// Where a step is.
///
/// ```
/// use kuralle::{RunStore, stores::MemoryStore};
/// # tokio::runtime::Runtime::new().unwrap().block_on(async {
/// use kuralle::{StepOutcome, StepStatus};
///
/// let store = MemoryStore::new();
/// let lease = store.acquire_lease("run-1", "worker-a", std::time::Duration::from_secs(30)).await?;
/// store.create_run(kuralle::RunRecord::new("run-1", "support"), lease.token).await?;
/// store.append_steps("run-1", lease.token, vec![kuralle::NewStep::new("k1", kuralle::StepKind::Tool, "charge")]).await?;
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
/// use kuralle::{RunStore, stores::MemoryStore};
/// # tokio::runtime::Runtime::new().unwrap().block_on(async {
/// use kuralle::{NewStep, StepKind};
///
/// let store = MemoryStore::new();
/// let lease = store.acquire_lease("run-1", "worker-a", std::time::Duration::from_secs(30)).await?;
/// store.create_run(kuralle::RunRecord::new("run-1", "support"), lease.token).await?;
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

impl NewStep {
    /// An intent for `key` of kind `kind`, named `name`, in epoch 0, started now.
    ///
    /// ```
    /// use kuralle::{NewStep, StepKind};
    ///
    /// let intent = NewStep::new("k1", StepKind::Tool, "charge");
    /// assert_eq!((intent.key.as_str(), intent.epoch), ("k1", 0));
    /// ```
    pub fn new(key: impl Into<String>, kind: StepKind, name: impl Into<String>) -> Self {
        Self { key: key.into(), kind, name: name.into(), epoch: 0, started_at_ms: crate::clock::now_ms() }
    }
}

/// The outcome that finalizes a `Running` step, as JSON text ([`JsonText`]): the runtime
/// writes a value's text once, a store measures it by its length and keeps (or writes) that
/// text as it is.
///
/// ```
/// use kuralle::{RunStore, stores::MemoryStore};
/// # tokio::runtime::Runtime::new().unwrap().block_on(async {
/// use kuralle::StepOutcome;
///
/// let store = MemoryStore::new();
/// let lease = store.acquire_lease("run-1", "worker-a", std::time::Duration::from_secs(30)).await?;
/// store.create_run(kuralle::RunRecord::new("run-1", "support"), lease.token).await?;
/// store.append_steps("run-1", lease.token, vec![kuralle::NewStep::new("k1", kuralle::StepKind::Tool, "charge")]).await?;
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
    /// A typed error, serialized (for tool steps, a [`ToolError`](crate::ToolError)).
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
/// use kuralle::{RunStore, stores::MemoryStore};
/// # tokio::runtime::Runtime::new().unwrap().block_on(async {
/// use kuralle::StepOutcome;
///
/// let store = MemoryStore::new();
/// let lease = store.acquire_lease("run-1", "worker-a", std::time::Duration::from_secs(30)).await?;
/// store.create_run(kuralle::RunRecord::new("run-1", "support"), lease.token).await?;
/// store.append_steps("run-1", lease.token, vec![kuralle::NewStep::new("k1", kuralle::StepKind::Tool, "charge")]).await?;
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

/// What [`RunStore::append_finished_with_intents`](super::RunStore::append_finished_with_intents)
/// writes in one commit: a step already finished with `outcome` at `finished_at_ms`, then the
/// `Running` intents that follow it.
///
/// ```
/// use kuralle::{FinishedWithIntents, JsonText, NewStep, StepKind, StepOutcome};
///
/// let write = FinishedWithIntents {
///     finished: NewStep::new("model:0", StepKind::Model, "model"),
///     outcome: StepOutcome::Finished(JsonText::from(serde_json::json!({"text": "hi"}))),
///     finished_at_ms: 5,
///     intents: vec![NewStep::new("call:1", StepKind::Tool, "charge")],
/// };
/// assert_eq!(write.intents.len(), 1);
/// ```
#[derive(Debug, Clone, PartialEq)]
pub struct FinishedWithIntents {
    /// The finished step (appended first).
    pub finished: NewStep,
    /// Its outcome.
    pub outcome: StepOutcome,
    /// When it finished, milliseconds since the Unix epoch.
    pub finished_at_ms: i64,
    /// The intents appended after it, in order.
    pub intents: Vec<NewStep>,
}

/// A step appended already finished: a turn's last model response, which
/// [`RunStore::put_run_and_release_after`](super::RunStore::put_run_and_release_after) journals
/// in the write that closes the turn.
///
/// ```
/// use kuralle::{FinishedStep, JsonText, NewStep, StepKind, StepOutcome};
///
/// let last = FinishedStep {
///     step: NewStep::new("model:3", StepKind::Model, "model"),
///     outcome: StepOutcome::Finished(JsonText::from(serde_json::json!({"text": "done"}))),
///     finished_at_ms: 5,
/// };
/// assert_eq!(last.step.key, "model:3");
/// ```
#[derive(Debug, Clone, PartialEq)]
pub struct FinishedStep {
    /// The step, appended at the journal's next ordinal.
    pub step: NewStep,
    /// Its outcome.
    pub outcome: StepOutcome,
    /// When it finished, milliseconds since the Unix epoch.
    pub finished_at_ms: i64,
}

impl From<FinishedStep> for FinishedWithIntents {
    fn from(last: FinishedStep) -> Self {
        Self { finished: last.step, outcome: last.outcome, finished_at_ms: last.finished_at_ms, intents: Vec::new() }
    }
}
