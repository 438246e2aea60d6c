//! `ToolError`: what a tool call can end in.

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
