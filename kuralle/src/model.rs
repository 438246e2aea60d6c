//! The `Model` contract: a request (system text, transcript, tool specs) in, a stream of text
//! deltas, tool calls with raw argument text, and a finish reason with usage out.

use std::sync::Arc;

use futures::stream::BoxStream;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::{ToolSpec, Transcript};

/// Token usage of one or more model responses.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Usage {
    /// Prompt tokens.
    pub input_tokens: u64,
    /// Completion tokens.
    pub output_tokens: u64,
}

impl std::ops::AddAssign for Usage {
    fn add_assign(&mut self, rhs: Self) {
        self.input_tokens += rhs.input_tokens;
        self.output_tokens += rhs.output_tokens;
    }
}

/// A tool call as the model issued it. `arguments` is the raw text, which may be invalid JSON.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ToolCallRequest {
    /// The model's id for the call; its result is sent back under this id.
    pub call_id: String,
    /// The tool name the model used.
    pub name: String,
    /// Raw argument text.
    pub arguments: String,
}

/// Why the model stopped.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FinishReason {
    /// A complete answer.
    Stop,
    /// It wants tool results.
    ToolCalls,
    /// It hit its output-token limit.
    Length,
    /// A provider content filter stopped it.
    ContentFilter,
    /// Anything else the provider reported.
    Other(String),
}

/// One transcript entry.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "role", rename_all = "snake_case")]
pub enum Message {
    /// User input.
    User {
        /// The text.
        content: String,
    },
    /// A model response: text and the tool calls it issued.
    Assistant {
        /// The text (may be empty).
        content: String,
        /// Tool calls, in the order the model issued them.
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        tool_calls: Vec<ToolCallRequest>,
    },
    /// One tool call's result as the model sees it (possibly truncated, or an error object).
    Tool {
        /// The id of the call this answers.
        call_id: String,
        /// Tool name.
        name: String,
        /// The result value.
        content: Value,
    },
}

/// What the runtime sends a model.
///
/// Cloning is cheap and so is building one per step: the transcript is a shared
/// append-only [`Transcript`] and the tool specs an `Arc<[ToolSpec]>`, so a request costs the
/// same at step 5,000 of a run as at step 1.
///
/// ```
/// use kuralle::{Message, ModelRequest};
/// let request = ModelRequest {
///     system: "Be brief.".into(),
///     messages: vec![Message::User { content: "hi".into() }].into(),
///     tools: vec![].into(),
/// };
/// assert_eq!(request.messages.len(), 1);
/// assert!(request.tools.is_empty());
/// ```
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ModelRequest {
    /// System text (the agent's instructions).
    pub system: String,
    /// The transcript so far.
    pub messages: Transcript,
    /// The tools the model may call.
    pub tools: Arc<[ToolSpec]>,
}

/// One item of a model's response stream.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum ModelEvent {
    /// A piece of answer text.
    TextDelta {
        /// The text.
        delta: String,
    },
    /// A complete tool call (arguments assembled, as raw text).
    ToolCall(ToolCallRequest),
    /// The end of the response.
    Finish {
        /// Why it ended.
        reason: FinishReason,
        /// Tokens used.
        usage: Usage,
    },
}

/// Why a model request failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ModelError {
    /// The provider refused the credentials (401/403). Not retried.
    #[error("model provider refused the credentials (HTTP {status}): {message}")]
    Auth {
        /// HTTP status.
        status: u16,
        /// The provider's message.
        message: String,
    },
    /// Still rate limited (429) after the retry budget.
    #[error("model provider rate limit (HTTP 429) persisted after {attempts} attempts: {message}")]
    RateLimited {
        /// Attempts made.
        attempts: u32,
        /// The provider's last message.
        message: String,
    },
    /// An HTTP error status that is not retried, or a 5xx that persisted.
    #[error("model provider returned HTTP {status} after {attempts} attempt(s): {message}")]
    Http {
        /// HTTP status.
        status: u16,
        /// Attempts made.
        attempts: u32,
        /// The provider's message.
        message: String,
    },
    /// The connection failed or was cut.
    #[error("model transport error: {0}")]
    Transport(String),
    /// The response stream was malformed or ended early.
    #[error("malformed model response: {0}")]
    Protocol(String),
    /// The provider reported an error inside the stream.
    #[error("model provider reported an error mid-stream: {0}")]
    Provider(String),
    /// The request cannot be expressed for this provider (for example a tool schema that
    /// OpenAI strict mode cannot express). Not retried.
    #[error("the model request cannot be sent: {0}")]
    InvalidRequest(String),
    /// The response passed the client's size limit; reading stopped there. Resuming asks
    /// again.
    #[error("the model response exceeds the limit of {limit} bytes")]
    TooLarge {
        /// The limit, in bytes.
        limit: usize,
    },
    /// A [`crate::testing::ScriptedModel`] ran out of turns.
    #[error("scripted model has no turn left (request {0})")]
    ScriptExhausted(usize),
}

/// A model the runtime can talk to.
///
/// ```
/// use futures::StreamExt;
/// use kuralle::{Model, ModelEvent, ModelRequest, testing::{ScriptedModel, Turn}};
/// # tokio::runtime::Runtime::new().unwrap().block_on(async {
/// let model = ScriptedModel::new([Turn::text("hello")]);
/// let req = ModelRequest { system: String::new(), messages: Default::default(), tools: Default::default() };
/// let events: Vec<_> = model.stream(req).collect().await;
/// assert_eq!(events[0], Ok(ModelEvent::TextDelta { delta: "hello".into() }));
/// # });
/// ```
pub trait Model: Send + Sync + 'static {
    /// A human-readable model id (`"gpt-4o-mini"`, `"scripted"`).
    fn name(&self) -> &str;

    /// Sends `request`; the stream ends after a [`ModelEvent::Finish`] or an error.
    /// Dropping the stream cancels the request.
    fn stream(&self, request: ModelRequest) -> BoxStream<'static, Result<ModelEvent, ModelError>>;
}
