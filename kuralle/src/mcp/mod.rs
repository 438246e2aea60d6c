//! MCP both ways (feature `mcp`), on [`rmcp`], the official Rust SDK.
//!
//! - [`McpServer`] serves a [`ToolSet`](crate::ToolSet) (or an agent's tools) over stdio or
//!   streamable HTTP. `tools/list` is built from the same [`ToolSpec`](crate::ToolSpec)s the
//!   model sees; `tools/call` goes through the same path as a model's call (validation before
//!   execute, timeouts, `on_error`, contained panics), `progress!` values become
//!   `notifications/progress`, and `notifications/cancelled` fires the call's cancellation
//!   token unless the tool is `interruptible = false`.
//! - [`McpClient`] connects to an MCP server (a stdio command or an HTTP URL) and turns its
//!   tools into [`Tool`](crate::Tool)s for an agent. Their calls are journaled like any tool's:
//!   a resumed run answers a finished call from the journal instead of calling the server
//!   again, and every call carries its idempotency key in `_meta`
//!   ([`IDEMPOTENCY_KEY_META`]). Connecting, listing and calling have deadlines, and a
//!   listing has page, tool and size limits ([`McpClientOptions`]); a tool a model provider
//!   would reject (its name or input schema) is left out of the listing with a warning.
//!
//! ```no_run
//! use kuralle::{ToolSet, mcp::McpServer, tool};
//!
//! /// Echo back the provided text.
//! #[tool]
//! async fn echo(text: String) -> String { text }
//!
//! # async fn serve() -> Result<(), kuralle::mcp::McpError> {
//! McpServer::new(ToolSet::new().with(Echo)).serve_stdio().await?;
//! # Ok(()) }
//! ```

mod auth;
mod client;
mod content;
mod error;
mod options;
mod request;
mod server;

pub use client::{McpClient, McpTool};
pub use content::{CONTENT_KEY, McpContent};
pub use error::McpError;
pub use options::McpClientOptions;
pub use request::McpRequest;
/// The MCP SDK kuralle is built on, for tools that need its types (content blocks, sampling,
/// elicitation) without a dependency of their own.
pub use rmcp;
pub use server::McpServer;

/// The `_meta` key under which [`McpClient`] passes a call's idempotency key (stable across
/// retries, crashes and replays) to the server, so a server that sees the same key twice can
/// deduplicate the effect.
pub const IDEMPOTENCY_KEY_META: &str = "io.kuralle/idempotencyKey";
