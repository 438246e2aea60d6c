//! What an assistant turn is made of: ordered [`Part`]s, each kept exactly as the provider
//! returned it, and the [`Origin`] that says which provider may be sent them back.

use serde::{Deserialize, Serialize};
use smol_str::SmolStr;

use super::ToolCallRequest;

/// One piece of an assistant turn, in the order the provider returned it.
///
/// Besides text and tool calls, a turn keeps the state providers hand back and require on
/// the next request: thinking text with its signature (Anthropic), thought signatures on text
/// and calls (Gemini), reasoning items with encrypted content and item ids (OpenAI
/// Responses), redacted thinking. The journal keeps every part, so a run resumed after a
/// crash sends them back byte for byte.
///
/// ```
/// use kuralle::{Part, ToolCallRequest};
/// let parts = vec![
///     Part::Reasoning {
///         text: "The user wants the weather.".into(),
///         summary: vec![],
///         signature: Some("EqQBCkYIARgCIkD...".into()),
///         encrypted: None,
///         id: None,
///     },
///     Part::text("Let me check."),
///     Part::call(ToolCallRequest { call_id: "toolu_1".into(), name: "weather".into(), arguments: "{}".into() }),
/// ];
/// let json = serde_json::to_string(&parts).unwrap();
/// assert_eq!(serde_json::from_str::<Vec<Part>>(&json).unwrap(), parts);
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Part {
    /// Answer text.
    Text {
        /// The text.
        text: String,
        /// An opaque signature the provider attached (Gemini's `thoughtSignature`).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        signature: Option<String>,
        /// The provider's id for the item holding the text (a Responses `message` id).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        id: Option<String>,
    },
    /// A tool call.
    ToolCall {
        /// The call as the runtime dispatches it.
        call: ToolCallRequest,
        /// An opaque signature the provider attached (Gemini's `thoughtSignature`).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        signature: Option<String>,
        /// The provider's item id when it differs from the call id (a Responses
        /// `function_call` item's `id`, beside its `call_id`).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        id: Option<String>,
    },
    /// Reasoning: thinking text (Anthropic, DeepSeek, Gemini thoughts), summaries (OpenAI),
    /// an opaque signature or encrypted content.
    Reasoning {
        /// Thinking text as streamed (may be empty: signature-only blocks exist).
        #[serde(default, skip_serializing_if = "String::is_empty")]
        text: String,
        /// Reasoning summaries (OpenAI Responses `summary_text` entries), in order.
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        summary: Vec<String>,
        /// The signature that proves the thinking unmodified (Anthropic, Gemini).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        signature: Option<String>,
        /// Encrypted reasoning (OpenAI Responses `encrypted_content`).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        encrypted: Option<String>,
        /// The provider's item id (a Responses `reasoning` item id).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        id: Option<String>,
    },
    /// Thinking the provider redacted: only its opaque data goes back (Anthropic
    /// `redacted_thinking`).
    RedactedReasoning {
        /// The opaque data.
        data: String,
    },
}

impl Part {
    /// A text part with no provider state.
    pub fn text(text: impl Into<String>) -> Self {
        Self::Text { text: text.into(), signature: None, id: None }
    }

    /// A tool-call part with no provider state.
    pub fn call(call: ToolCallRequest) -> Self {
        Self::ToolCall { call, signature: None, id: None }
    }

    /// Whether this part carries state only its provider can read (signatures, reasoning,
    /// item ids), which another provider must not be sent.
    pub fn is_provider_state(&self) -> bool {
        match self {
            Self::Text { signature, id, .. } | Self::ToolCall { signature, id, .. } => {
                signature.is_some() || id.is_some()
            }
            Self::Reasoning { .. } | Self::RedactedReasoning { .. } => true,
        }
    }
}

/// Which provider and model produced an assistant turn. Provider state in its parts goes back
/// only to a client whose [`Model::provider`](crate::Model::provider) is the same; any other
/// model gets the turn's text and tool calls.
///
/// ```
/// use kuralle::Origin;
/// let origin = Origin::new("anthropic", "claude-sonnet-4-5");
/// assert!(origin.is("anthropic"));
/// assert!(!origin.is("gemini"));
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Origin {
    /// The wire that produced the turn ([`Model::provider`](crate::Model::provider)).
    pub provider: SmolStr,
    /// The model id ([`Model::name`](crate::Model::name)).
    pub model: SmolStr,
}

impl Origin {
    /// An origin.
    pub fn new(provider: impl Into<SmolStr>, model: impl Into<SmolStr>) -> Self {
        Self { provider: provider.into(), model: model.into() }
    }

    /// Whether the turn came from `provider`.
    pub fn is(&self, provider: &str) -> bool {
        self.provider == provider
    }
}

/// Whether a turn of `origin` may be sent back with its provider state to `provider`.
/// A turn without an origin (journaled before origins, or built by hand) carries none.
#[cfg(any(feature = "openai", feature = "anthropic", feature = "gemini"))]
pub(crate) fn state_goes_to(origin: Option<&Origin>, provider: &str) -> bool {
    origin.is_some_and(|o| o.is(provider))
}
