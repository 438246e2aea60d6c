//! [`Model`](crate::Model) implementations for real providers.
//!
//! With the default `openai` feature, [`OpenAi`] speaks the OpenAI-compatible
//! chat-completions API (streaming SSE, parallel tool calls). That API is also served by
//! Ollama, vLLM, llama.cpp server and LM Studio, so one client covers local models too.

#[cfg(feature = "openai")]
mod openai;

#[cfg(feature = "openai")]
pub use openai::{
    ConfigError, DEFAULT_BASE_URL, DEFAULT_MAX_RESPONSE_BYTES, DEFAULT_MODEL, OpenAi, OpenAiBuilder, assemble_events,
    sse,
};
