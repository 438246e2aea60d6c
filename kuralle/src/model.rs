//! The `Model` contract: a request (system text, transcript, tool specs) in, a stream of text
//! deltas, tool calls with raw argument text, provider state ([`Part`]s) and a finish reason
//! with usage out.

mod output;
mod part;

use std::sync::Arc;

use futures::stream::BoxStream;
use serde::{Deserialize, Serialize};
use serde_json::Value;
/// The string of a transcript's short names: call ids, tool names, a turn's provider and model.
/// Up to 23 bytes are kept inline and longer ones shared, so a clone never copies: a call id
/// goes into the tool's message and its events without an allocation. Ids a provider makes are
/// often longer (OpenAI's and Anthropic's are about 30 bytes): those are shared, one
/// allocation each, however often the transcript and events repeat them.
///
/// ```
/// use kuralle::{SmolStr, ToolCallRequest};
/// let call = ToolCallRequest { call_id: "call_1".into(), name: "weather".into(), arguments: "{}".into() };
/// assert_eq!(call.name, "weather");
/// let id: SmolStr = call.call_id.clone();
/// assert!(!id.is_heap_allocated());
/// ```
pub use smol_str::SmolStr;

pub use output::{OutputMode, OutputSpec, ToolChoice};
#[cfg(any(feature = "openai", feature = "anthropic", feature = "gemini"))]
pub(crate) use part::state_goes_to;
pub use part::{Origin, Part};

use crate::{ToolSpec, Transcript};

/// Token usage of one or more model responses, with one meaning on every wire.
///
/// `input_tokens` includes cache reads and writes (Anthropic reports them apart; the client
/// adds them), and `output_tokens` includes reasoning (Gemini reports thoughts apart; the
/// client adds them). `reasoning_tokens` is the wire's own thinking or reasoning counter, 0
/// where it reports none.
///
/// ```
/// use kuralle::Usage;
/// let mut total = Usage { input_tokens: 100, output_tokens: 20, cache_read_tokens: 80, ..Usage::default() };
/// total += Usage { input_tokens: 50, output_tokens: 5, reasoning_tokens: 3, ..Usage::default() };
/// assert_eq!((total.input_tokens, total.output_tokens, total.cache_read_tokens, total.reasoning_tokens), (150, 25, 80, 3));
/// assert_eq!(total.total_tokens(), 175);
/// ```
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Usage {
    /// Prompt tokens, cached ones included.
    pub input_tokens: u64,
    /// Completion tokens, reasoning included.
    pub output_tokens: u64,
    /// Prompt tokens read from the provider's cache (part of `input_tokens`).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub cache_read_tokens: u64,
    /// Prompt tokens written to the provider's cache (part of `input_tokens`).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub cache_write_tokens: u64,
    /// Reasoning or thinking tokens (part of `output_tokens`).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub reasoning_tokens: u64,
}

// A reference is what `skip_serializing_if` passes.
#[allow(clippy::trivially_copy_pass_by_ref)]
fn is_zero(n: &u64) -> bool {
    *n == 0
}

impl Usage {
    /// Input plus output tokens.
    pub fn total_tokens(&self) -> u64 {
        self.input_tokens + self.output_tokens
    }
}

impl std::ops::AddAssign for Usage {
    fn add_assign(&mut self, rhs: Self) {
        self.input_tokens += rhs.input_tokens;
        self.output_tokens += rhs.output_tokens;
        self.cache_read_tokens += rhs.cache_read_tokens;
        self.cache_write_tokens += rhs.cache_write_tokens;
        self.reasoning_tokens += rhs.reasoning_tokens;
    }
}

/// A tool call as the model issued it. `arguments` is the raw text, which may be invalid JSON.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ToolCallRequest {
    /// The model's id for the call; its result is sent back under this id.
    pub call_id: SmolStr,
    /// The tool name the model used.
    pub name: SmolStr,
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
    /// The model declined to answer (Anthropic `refusal`).
    Refusal,
    /// Anything else the provider reported.
    Other(String),
}

/// One transcript entry.
///
/// ```
/// use kuralle::{Message, Origin, Part};
/// let turn = Message::Assistant {
///     parts: vec![Part::text("Checking."), Part::Reasoning {
///         text: String::new(), summary: vec![], signature: Some("sig".into()), encrypted: None, id: None,
///     }],
///     origin: Some(Origin::new("anthropic", "claude-sonnet-4-5")),
/// };
/// assert_eq!(turn.text(), "Checking.");
/// // Transcripts journaled before parts existed still read:
/// let old: Message = serde_json::from_str(r#"{"role":"assistant","content":"hi","tool_calls":[]}"#).unwrap();
/// assert_eq!(old, Message::assistant_text("hi"));
/// ```
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "role", rename_all = "snake_case", from = "wire::MessageWire")]
pub enum Message {
    /// User input.
    User {
        /// The text.
        content: String,
    },
    /// A model response: every part the provider returned, in order.
    Assistant {
        /// Text, tool calls and provider state, in the order the provider returned them.
        parts: Vec<Part>,
        /// The provider and model that produced the turn (`None` for turns journaled before
        /// origins were kept, or built by hand).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        origin: Option<Origin>,
    },
    /// One tool call's result as the model sees it (possibly truncated, or an error object).
    Tool {
        /// The id of the call this answers.
        call_id: SmolStr,
        /// Tool name.
        name: SmolStr,
        /// The result value.
        content: Value,
    },
}

impl Message {
    /// An assistant turn of plain text, with no origin.
    pub fn assistant_text(text: impl Into<String>) -> Self {
        let text = text.into();
        let parts = if text.is_empty() { Vec::new() } else { vec![Part::text(text)] };
        Self::Assistant { parts, origin: None }
    }

    /// An assistant turn's text parts joined (empty for other messages).
    pub fn text(&self) -> String {
        match self {
            Self::Assistant { parts, .. } => parts
                .iter()
                .filter_map(|p| match p {
                    Part::Text { text, .. } => Some(text.as_str()),
                    _ => None,
                })
                .collect(),
            _ => String::new(),
        }
    }

    /// An assistant turn's tool calls, in order (none for other messages).
    pub fn tool_calls(&self) -> impl Iterator<Item = &ToolCallRequest> {
        let parts: &[Part] = match self {
            Self::Assistant { parts, .. } => parts,
            _ => &[],
        };
        parts.iter().filter_map(|p| match p {
            Part::ToolCall { call, .. } => Some(call),
            _ => None,
        })
    }
}

mod wire {
    //! How a message reads back: today's shape, or an assistant turn journaled before parts
    //! (`content` + `tool_calls`).
    use serde::Deserialize;
    use serde_json::Value;

    use super::{Message, Origin, Part, SmolStr, ToolCallRequest};

    #[derive(Deserialize)]
    #[serde(tag = "role", rename_all = "snake_case")]
    pub(super) enum MessageWire {
        User {
            content: String,
        },
        Assistant {
            #[serde(default)]
            parts: Option<Vec<Part>>,
            #[serde(default)]
            origin: Option<Origin>,
            #[serde(default)]
            content: Option<String>,
            #[serde(default)]
            tool_calls: Vec<ToolCallRequest>,
        },
        Tool {
            call_id: SmolStr,
            name: SmolStr,
            content: Value,
        },
    }

    impl From<MessageWire> for Message {
        fn from(wire: MessageWire) -> Self {
            match wire {
                MessageWire::User { content } => Message::User { content },
                MessageWire::Assistant { parts, origin, content, tool_calls } => Message::Assistant {
                    parts: parts.unwrap_or_else(|| super::legacy_parts(content.unwrap_or_default(), tool_calls)),
                    origin,
                },
                MessageWire::Tool { call_id, name, content } => Message::Tool { call_id, name, content },
            }
        }
    }
}

/// The parts of a turn journaled as text and calls before parts existed.
pub(crate) fn legacy_parts(text: String, calls: Vec<ToolCallRequest>) -> Vec<Part> {
    let mut parts = Vec::with_capacity(calls.len() + 1);
    if !text.is_empty() {
        parts.push(Part::text(text));
    }
    parts.extend(calls.into_iter().map(Part::call));
    parts
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
///     output: None,
/// };
/// assert_eq!(request.messages.len(), 1);
/// assert!(request.tools.is_empty());
/// ```
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ModelRequest {
    /// System text (the agent's instructions), shared by every request of a run: a long
    /// system prompt is not copied per step.
    pub system: Arc<str>,
    /// The transcript so far.
    pub messages: Transcript,
    /// The tools the model may call.
    pub tools: Arc<[ToolSpec]>,
    /// The typed final output asked for, if any (see [`OutputSpec`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output: Option<OutputSpec>,
}

/// One item of a model's response stream.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum ModelEvent {
    /// A piece of answer text. Deltas since the last part make one [`Part::Text`].
    TextDelta {
        /// The text.
        delta: String,
    },
    /// A piece of reasoning or thinking text, for display as it arrives. The turn keeps the
    /// reasoning from the [`ModelEvent::Part`] the client sends when the block is complete.
    ReasoningDelta {
        /// The text.
        delta: String,
    },
    /// A complete tool call (arguments assembled, as raw text).
    ToolCall(ToolCallRequest),
    /// A complete part with provider state. A [`Part::Text`] here closes the text streamed
    /// since the last part and replaces it (same text, with its signature or id); any other
    /// part follows that text.
    Part {
        /// The part.
        part: Part,
    },
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
    /// The provider is overloaded (Anthropic 529 or an `overloaded_error` event, a 503).
    /// Retried by the client only while nothing of the response was emitted.
    #[error("model provider is overloaded: {0}")]
    Overloaded(String),
    /// The request does not fit the model's context window. Not retried.
    #[error("the request exceeds the model's context window: {0}")]
    ContextWindowExceeded(String),
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
/// let req = ModelRequest { system: "".into(), messages: Default::default(), tools: Default::default(), output: None };
/// let events: Vec<_> = model.stream(req).collect().await;
/// assert_eq!(events[0], Ok(ModelEvent::TextDelta { delta: "hello".into() }));
/// # });
/// ```
pub trait Model: Send + Sync + 'static {
    /// A human-readable model id (`"gpt-4o-mini"`, `"scripted"`).
    fn name(&self) -> &str;

    /// The wire this model speaks (`"openai"`, `"openai.responses"`, `"anthropic"`,
    /// `"gemini"`). Provider state of a turn ([`Origin`]) goes back only to a model with the
    /// same provider.
    fn provider(&self) -> &str {
        "unknown"
    }

    /// Sends `request`; the stream ends after a [`ModelEvent::Finish`] or an error.
    /// Dropping the stream cancels the request.
    fn stream(&self, request: ModelRequest) -> BoxStream<'static, Result<ModelEvent, ModelError>>;
}
