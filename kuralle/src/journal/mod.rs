//! The durable effect journal: every tool call, model response, `ctx.now()`, `ctx.uuid()` and
//! nested `ctx.tool()` is a step, written as an intent before it runs and finalized after.

mod key;

pub use key::{approval_key, canonical_json, effect_key, effect_key_for, helper_key, override_key, tool_key};

/// A position in a run's effect sequence, handed to a tool call so its nested effects get
/// deterministic callsites (`"<parent>.<n>"`) whatever the completion order of siblings.
#[allow(dead_code)] // for the runtime (built on another branch)
#[derive(Debug, Clone)]
pub(crate) struct Scope {
    pub(crate) prefix: String,
}
