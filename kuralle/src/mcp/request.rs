//! The MCP request a tool call is serving, for tools that talk back to the client.
#![allow(deprecated)] // LoggingLevel: deprecated only by the 2026 protocol draft.

use std::{
    collections::HashMap,
    sync::{Arc, LazyLock, Mutex, PoisonError},
};

use rmcp::{
    Peer, RoleServer,
    model::{LoggingLevel, LoggingMessageNotificationParam, RequestMetaObject},
};
use serde_json::Value;

use crate::context::ToolContext;

use super::McpError;

/// Requests being served, by the id of the run their call executes in. A `#[tool]` fn only
/// receives a [`ToolContext`], and the runtime runs each call on a task of its own, so the
/// run id (unique per served call) is the one thread that leads from a tool back to its
/// MCP request.
static ACTIVE: LazyLock<Mutex<HashMap<String, McpRequest>>> = LazyLock::new(Default::default);

/// The MCP `tools/call` request a call is serving: the client connection (for logging,
/// sampling, elicitation) and the request's `_meta`.
///
/// ```
/// use kuralle::{ToolContext, mcp::McpRequest};
/// // Outside an MCP server there is no request.
/// assert!(McpRequest::of(&ToolContext::detached()).is_none());
/// ```
#[derive(Clone)]
pub struct McpRequest {
    peer: Peer<RoleServer>,
    meta: RequestMetaObject,
    log_level: Arc<Mutex<LoggingLevel>>,
}

impl std::fmt::Debug for McpRequest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("McpRequest").field("meta", &self.meta).finish_non_exhaustive()
    }
}

impl McpRequest {
    pub(crate) fn new(peer: Peer<RoleServer>, meta: RequestMetaObject, log_level: Arc<Mutex<LoggingLevel>>) -> Self {
        Self { peer, meta, log_level }
    }

    /// The request the call behind `ctx` is serving, when it was called over MCP.
    pub fn of(ctx: &ToolContext) -> Option<Self> {
        ACTIVE.lock().unwrap_or_else(PoisonError::into_inner).get(ctx.run_id()).cloned()
    }

    /// The connection to the client.
    pub fn peer(&self) -> &Peer<RoleServer> {
        &self.peer
    }

    /// The request's `_meta`.
    pub fn meta(&self) -> &RequestMetaObject {
        &self.meta
    }

    /// Sends a `notifications/message` log entry, unless the client asked for a higher level
    /// with `logging/setLevel`.
    ///
    /// # Errors
    /// [`McpError::Request`] when the connection is gone.
    pub async fn log(&self, level: LoggingLevel, data: Value) -> Result<(), McpError> {
        let min = *self.log_level.lock().unwrap_or_else(PoisonError::into_inner);
        if severity(level) < severity(min) {
            return Ok(());
        }
        #[allow(deprecated)] // Deprecated only by the 2026 draft; every released protocol has it.
        self.peer
            .notify_logging_message(LoggingMessageNotificationParam::new(level, data).with_logger("kuralle"))
            .await?;
        Ok(())
    }

    /// Makes this request findable from the call that runs in `run_id` until the guard drops.
    pub(crate) fn enter(self, run_id: &str) -> ActiveGuard {
        ACTIVE.lock().unwrap_or_else(PoisonError::into_inner).insert(run_id.to_owned(), self);
        ActiveGuard { run_id: run_id.to_owned() }
    }
}

/// Removes a served request from the registry when its call ends (or is dropped).
pub(crate) struct ActiveGuard {
    run_id: String,
}

impl Drop for ActiveGuard {
    fn drop(&mut self) {
        ACTIVE.lock().unwrap_or_else(PoisonError::into_inner).remove(&self.run_id);
    }
}

/// RFC 5424 order, as MCP defines its levels.
pub(crate) fn severity(level: LoggingLevel) -> u8 {
    match level {
        LoggingLevel::Debug => 0,
        LoggingLevel::Info => 1,
        LoggingLevel::Notice => 2,
        LoggingLevel::Warning => 3,
        LoggingLevel::Error => 4,
        LoggingLevel::Critical => 5,
        LoggingLevel::Alert => 6,
        LoggingLevel::Emergency => 7,
    }
}
