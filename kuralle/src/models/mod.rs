//! [`Model`](crate::Model) implementations for real providers.
//!
//! With the default `openai` feature, [`OpenAi`] speaks the OpenAI-compatible
//! chat-completions API (streaming SSE, parallel tool calls). That API is also served by
//! Ollama, vLLM, llama.cpp server and LM Studio, so one client covers local models too;
//! [`OpenAiResponses`] speaks OpenAI's Responses API, stateless, and sends reasoning items
//! back.
//! [`Anthropic`] and [`Gemini`] speak their providers' own APIs, with thinking. [`from_env`]
//! picks one from the environment. `http` holds what every client shares: sending with retries, typed errors, and reading
//! within a byte limit.

#[cfg(feature = "anthropic")]
mod anthropic;
#[cfg(any(feature = "openai", feature = "anthropic", feature = "gemini"))]
mod env;
#[cfg(feature = "gemini")]
mod gemini;
#[cfg(any(feature = "openai", feature = "anthropic", feature = "gemini"))]
pub(crate) mod http;
#[cfg(feature = "openai")]
mod openai;
#[cfg(any(feature = "openai", feature = "anthropic", feature = "gemini"))]
pub mod sse;

#[cfg(feature = "anthropic")]
pub use anthropic::{Anthropic, AnthropicBuilder, DEFAULT_ANTHROPIC_BASE_URL, DEFAULT_ANTHROPIC_MODEL};
#[cfg(any(feature = "openai", feature = "anthropic", feature = "gemini"))]
pub use env::{PROVIDERS, from_env};
#[cfg(feature = "gemini")]
pub use gemini::{DEFAULT_GEMINI_MODEL, Gemini, GeminiBuilder};
#[cfg(any(feature = "openai", feature = "anthropic", feature = "gemini"))]
pub use http::{ConfigError, options::DEFAULT_MAX_RESPONSE_BYTES};
#[cfg(feature = "openai")]
pub use openai::{DEFAULT_BASE_URL, DEFAULT_MODEL, OpenAi, OpenAiBuilder, assemble_events};
#[cfg(feature = "openai")]
pub use openai::{DEFAULT_RESPONSES_MODEL, OpenAiResponses, OpenAiResponsesBuilder};
