//! What a typed final output can fail with.

use serde::{Deserialize, Serialize};

/// Why a run has no typed output, or the output is not the type asked for.
///
/// ```
/// use kuralle::OutputError;
/// let e = OutputError::Invalid { attempts: 3, message: "at `total`: invalid type: string \"x\", expected u64".into() };
/// assert!(e.to_string().contains("after 3 attempts"));
/// assert!(e.to_string().contains("at `total`"));
/// ```
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
#[non_exhaustive]
pub enum OutputError {
    /// Every answer failed the schema or serde, the last after the repair budget was spent.
    #[error("the model's output was still invalid after {attempts} attempts: {message}")]
    Invalid {
        /// Answers given (the first plus each repair).
        attempts: u32,
        /// What was wrong with the last one, naming the JSON path.
        message: String,
    },
    /// The answer was cut off at the model's output-token limit (`finish_reason: length`).
    #[error("the model's output was cut off at its token limit (finish reason `length`): {partial}")]
    Truncated {
        /// The start of what arrived (at most 200 characters).
        partial: String,
    },
    /// The provider refused to answer, or its content filter stopped the answer.
    #[error("the model refused to give the output: {message}")]
    Refused {
        /// The refusal text, if any.
        message: String,
    },
    /// The run has no typed value: its agent declares no output, or the turn did not finish.
    #[error("the run has no typed output (status `{status}`)")]
    Missing {
        /// The run's status.
        status: String,
    },
    /// The value does not deserialize into the type asked for (a type other than the agent's).
    #[error("the output does not deserialize into `{type_name}`: {message}")]
    Decode {
        /// The type asked for.
        type_name: String,
        /// serde's message.
        message: String,
    },
}
