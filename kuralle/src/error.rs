//! Typed errors: what a tool call can end in, and what can end a run.

use std::time::Duration;

use serde::{Deserialize, Serialize};

/// Why a tool call did not produce a result.
///
/// Every variant carries the tool name so a message is actionable on its own. The type is
/// serializable because a failed step is journaled and replays as *the same* typed error.
///
/// ```
/// use kuralle::ToolError;
/// let e = ToolError::invalid_input("get_weather", "missing field `city`");
/// assert_eq!(e.to_string(), "invalid arguments for tool `get_weather`: missing field `city`");
/// ```
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
#[non_exhaustive]
pub enum ToolError {
    /// The model's arguments were not valid JSON or did not match the input schema.
    #[error("invalid arguments for tool `{tool}`: {message}")]
    InvalidInput {
        /// Tool name.
        tool: String,
        /// What is wrong, naming the field.
        message: String,
    },
    /// The model asked for a tool the agent does not have.
    #[error("unknown tool `{tool}`; available tools: {available}")]
    UnknownTool {
        /// The name the model used.
        tool: String,
        /// Comma-separated names of the tools that exist.
        available: String,
    },
    /// The tool ran and returned an error.
    #[error("tool `{tool}` failed: {message}")]
    Failed {
        /// Tool name.
        tool: String,
        /// The tool error's `Display` text.
        message: String,
    },
    /// The tool panicked; the panic was contained.
    #[error("tool `{tool}` panicked: {message}")]
    Panicked {
        /// Tool name.
        tool: String,
        /// The panic payload, when it was a string.
        message: String,
    },
    /// The call exceeded its `timeout`.
    #[error("tool `{tool}` timed out after {}", humanize(*limit))]
    Timeout {
        /// Tool name.
        tool: String,
        /// The configured limit.
        #[serde(with = "duration_ms")]
        limit: Duration,
    },
    /// The caller interrupted the run while the call was in flight.
    #[error("tool `{tool}` was cancelled")]
    Cancelled {
        /// Tool name.
        tool: String,
    },
    /// The tool's result could not be serialized or is too large.
    #[error("tool `{tool}` produced an invalid result: {message}")]
    InvalidOutput {
        /// Tool name.
        tool: String,
        /// What is wrong with it.
        message: String,
    },
    /// An `at_most_once` call was cut off by a crash: it may or may not have taken effect.
    #[error(
        "tool `{tool}` may or may not have run (idempotency key {key}): it is at-most-once, so it was not retried; a human must resolve it"
    )]
    Indeterminate {
        /// Tool name.
        tool: String,
        /// The call's idempotency key, to look the effect up in the external system.
        key: String,
    },
    /// A human or a policy refused the call.
    #[error("tool `{tool}` was denied by {by}{}", reason.as_deref().map(|r| format!(": {r}")).unwrap_or_default())]
    Denied {
        /// Tool name.
        tool: String,
        /// Who decided (`"policy"` for a policy).
        by: String,
        /// Why, when given.
        reason: Option<String>,
    },
}

impl ToolError {
    /// An [`ToolError::InvalidInput`] for `tool`.
    pub fn invalid_input(tool: impl Into<String>, message: impl Into<String>) -> Self {
        Self::InvalidInput { tool: tool.into(), message: message.into() }
    }

    /// A [`ToolError::Failed`] for `tool`.
    pub fn failed(tool: impl Into<String>, message: impl Into<String>) -> Self {
        Self::Failed { tool: tool.into(), message: message.into() }
    }

    /// The tool name the error is about.
    ///
    /// ```
    /// # use kuralle::ToolError;
    /// assert_eq!(ToolError::failed("charge", "card declined").tool(), "charge");
    /// ```
    pub fn tool(&self) -> &str {
        match self {
            Self::InvalidInput { tool, .. }
            | Self::UnknownTool { tool, .. }
            | Self::Failed { tool, .. }
            | Self::Panicked { tool, .. }
            | Self::Timeout { tool, .. }
            | Self::Cancelled { tool }
            | Self::InvalidOutput { tool, .. }
            | Self::Indeterminate { tool, .. }
            | Self::Denied { tool, .. } => tool,
        }
    }

    /// Whether a journaled failure of this kind is final.
    ///
    /// A cancellation is a fact about one attempt, not about the call, so it is never
    /// journaled as the call's outcome: a resumed run tries the call again.
    pub fn is_final(&self) -> bool {
        !matches!(self, Self::Cancelled { .. })
    }
}

pub(crate) fn humanize(d: Duration) -> String {
    let ms = d.as_millis();
    if ms.is_multiple_of(60_000) && ms > 0 {
        format!("{}m", ms / 60_000)
    } else if ms.is_multiple_of(1000) && ms > 0 {
        format!("{}s", ms / 1000)
    } else {
        format!("{ms}ms")
    }
}

mod duration_ms {
    use std::time::Duration;

    use serde::{Deserialize, Deserializer, Serializer};

    pub(super) fn serialize<S: Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_u64(u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
    }

    pub(super) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
        u64::deserialize(d).map(Duration::from_millis)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn typed_errors_round_trip_through_json() {
        let e = ToolError::Timeout { tool: "slow".into(), limit: Duration::from_secs(5) };
        let json = serde_json::to_value(&e).unwrap();
        assert_eq!(json, serde_json::json!({"kind": "timeout", "tool": "slow", "limit": 5000}));
        assert_eq!(serde_json::from_value::<ToolError>(json).unwrap(), e);
        assert_eq!(e.to_string(), "tool `slow` timed out after 5s");
    }
}

/// Why a run could not go on.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum RunError {
    /// The model request failed; the run stays resumable.
    #[error(transparent)]
    Model(#[from] crate::model::ModelError),
    /// The store failed; when [`StoreError::is_retryable`](crate::StoreError::is_retryable),
    /// the run stays resumable.
    #[error(transparent)]
    Store(#[from] crate::store::StoreError),
    /// No run with that id.
    #[error("run `{0}` not found")]
    RunNotFound(String),
    /// No agent with that id.
    #[error("no agent `{id}`; registered agents: {available}")]
    UnknownAgent {
        /// The requested id.
        id: String,
        /// Comma-separated registered ids.
        available: String,
    },
    /// The run's unfinished turn has other input than the request.
    #[error("run `{0}` has an unfinished turn with other input; resume it first")]
    TurnInProgress(String),
    /// The run's journal reached `max_steps_per_run`.
    #[error("run `{run_id}` reached the journal limit of {limit} steps")]
    StepLimit {
        /// Run id.
        run_id: String,
        /// The configured limit.
        limit: u64,
    },
    /// A model response exceeded `max_result_bytes`.
    #[error("a model response of {size} bytes exceeds the limit of {limit} bytes")]
    ResponseTooLarge {
        /// Its size.
        size: usize,
        /// The configured limit.
        limit: usize,
    },
    /// The runtime is misconfigured.
    #[error("runtime configuration: {0}")]
    Config(String),
    /// An agent has two tools with one name: the model could not tell them apart, and the
    /// later one would silently replace the earlier.
    ///
    /// ```
    /// use kuralle::{AgentDef, RunError, Runtime, testing::ScriptedModel, tool};
    ///
    /// /// Look an order up.
    /// #[tool(name = "lookup")]
    /// async fn lookup_order(id: u64) -> u64 { id }
    /// /// Look a customer up.
    /// #[tool(name = "lookup")]
    /// async fn lookup_customer(id: u64) -> u64 { id }
    ///
    /// let agent = AgentDef::new("support", "Help.").tool(LookupOrder).tool(LookupCustomer);
    /// let err = Runtime::builder().agent(agent).model(ScriptedModel::new([])).build().unwrap_err();
    /// assert!(matches!(&err, RunError::DuplicateTool { tool, .. } if tool == "lookup"));
    /// assert!(err.to_string().contains("LookupOrder") && err.to_string().contains("LookupCustomer"));
    /// ```
    #[error("agent `{agent}` has two tools named `{tool}`: `{first}` and `{second}`")]
    DuplicateTool {
        /// The agent id.
        agent: String,
        /// The shared tool name.
        tool: String,
        /// The type of the tool added first.
        first: String,
        /// The type of the tool added later (which replaced the first).
        second: String,
    },
    /// A decision was delivered for a run that is not waiting for it.
    #[error("run `{run_id}` is not waiting for a decision on `{request_id}`")]
    NotPending {
        /// Run id.
        run_id: String,
        /// The request id in the decision.
        request_id: String,
    },
    /// The run task panicked or was lost; the run stays resumable.
    #[error("internal error: {0}")]
    Internal(String),
    /// Another caller owns the run right now (it holds the run's lease); nothing was executed.
    /// Try again later, or opt into waiting with
    /// [`RunRequest::wait_for_lease`](crate::RunRequest::wait_for_lease).
    #[error("run `{run_id}` is busy: owned by `{owner}` (lease expires at {expires_at_ms} ms since the Unix epoch)")]
    Busy {
        /// Run id.
        run_id: String,
        /// The current owner.
        owner: String,
        /// When its lease expires unless renewed, by the store's clock.
        expires_at_ms: i64,
    },
    /// This turn lost the run's lease (it stalled past the lease's TTL and another owner took
    /// over): it stopped dispatching and journaled nothing more. The new owner carries on.
    #[error("run `{run_id}`: this turn lost the run's lease (token {token}) to another owner and stopped")]
    LeaseLost {
        /// Run id.
        run_id: String,
        /// The token the turn held.
        token: u64,
    },
    /// The pending call(s) a decision names were already decided (a concurrent or earlier
    /// delivery won); the first decision stands.
    #[error("run `{run_id}`: `{request_id}` was already decided")]
    AlreadyDecided {
        /// Run id.
        run_id: String,
        /// The request id in the decision (`*` for all pending calls).
        request_id: String,
    },
}

impl RunError {
    /// Whether resuming the run later may succeed (transient model or store failures).
    pub fn is_retryable(&self) -> bool {
        match self {
            Self::Model(e) => !matches!(e, crate::model::ModelError::Auth { .. }),
            Self::Store(e) => e.is_retryable(),
            Self::Internal(_) | Self::Busy { .. } => true,
            _ => false,
        }
    }
}
