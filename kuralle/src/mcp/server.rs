//! Serving a `ToolSet` over MCP: stdio and streamable HTTP.

// Logging is deprecated only by the 2026 protocol draft; every released protocol version
// (which is what clients speak today) has it.
#![allow(deprecated)]

use std::{
    future::Future,
    sync::{Arc, Mutex, PoisonError},
};

use rmcp::{
    ErrorData, RoleServer, ServerHandler, ServiceExt,
    model::{
        CallToolRequestParams, CallToolResponse, Implementation, ListToolsResult, LoggingLevel, PaginatedRequestParams,
        ProgressNotificationParam, ProgressToken, ServerCapabilities, ServerConfig, SetLevelRequestParams,
        ToolAnnotations,
    },
    service::RequestContext,
    transport::streamable_http_server::{
        StreamableHttpServerConfig, StreamableHttpService, session::local::LocalSessionManager,
    },
};
use serde_json::Value;
use tracing::Instrument;

use super::{
    McpError, McpRequest,
    content::{mcp_output_schema, to_call_result},
};
use crate::{
    agent::Agent,
    dispatch::call_standalone,
    event::Event,
    model::ToolCallRequest,
    policy::Policy,
    tool::{Tool, ToolSet},
};

/// Serves a [`ToolSet`] to MCP clients.
///
/// ```
/// use kuralle::{ToolSet, mcp::McpServer, tool};
///
/// /// Echo back the provided text.
/// #[tool]
/// async fn echo(text: String) -> String { text }
///
/// let server = McpServer::new(ToolSet::new().with(Echo)).named("echo-server", "1.0.0");
/// let listed = server.list();
/// assert_eq!(listed[0].name, "echo");
/// assert_eq!(listed[0].input_schema["required"][0], "text");
/// ```
#[derive(Clone)]
pub struct McpServer {
    shared: Arc<Shared>,
    /// Per session: set by `logging/setLevel`.
    log_level: Arc<Mutex<LoggingLevel>>,
}

struct Shared {
    tools: ToolSet,
    /// The agent's policy (or one set with [`McpServer::policy`]): an MCP client is held to
    /// the same rules as the agent's model.
    policy: Policy,
    info: Implementation,
    instructions: Option<String>,
    allowed_hosts: Option<Vec<String>>,
    tokens: super::auth::Tokens,
}

impl std::fmt::Debug for McpServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("McpServer").field("tools", &self.shared.tools).finish_non_exhaustive()
    }
}

impl McpServer {
    /// A server for `tools`, named `kuralle` with this crate's version.
    pub fn new(tools: impl Into<ToolSet>) -> Self {
        Self {
            shared: Arc::new(Shared {
                tools: tools.into(),
                policy: Policy::new(),
                info: Implementation::new("kuralle", env!("CARGO_PKG_VERSION")),
                instructions: None,
                allowed_hosts: None,
                tokens: super::auth::Tokens::default(),
            }),
            log_level: Arc::new(Mutex::new(LoggingLevel::Info)),
        }
    }

    /// A server for an agent's tools, with its instructions and its [`Policy`]: a call the
    /// policy denies is refused, and one it would ask a human about is refused too (an MCP
    /// call cannot wait for a decision), exactly as for the agent's own model.
    pub fn for_agent(agent: &impl Agent) -> Self {
        let def = agent.definition();
        let mut server = Self::new(def.tools);
        let shared = server.shared_mut();
        shared.instructions = Some(def.instructions);
        shared.policy = def.policy;
        server
    }

    /// The policy every `tools/call` goes through (default: allow all, as a tool set with no
    /// agent has none).
    ///
    /// ```
    /// use kuralle::{Policy, ToolSet, mcp::McpServer};
    /// let server = McpServer::new(ToolSet::new()).policy(Policy::new().deny("delete_*", "not over MCP"));
    /// # let _ = server;
    /// ```
    #[must_use]
    pub fn policy(mut self, policy: impl Into<Policy>) -> Self {
        self.shared_mut().policy = policy.into();
        self
    }

    fn shared_mut(&mut self) -> &mut Shared {
        Arc::get_mut(&mut self.shared).expect("configured before it is shared")
    }

    /// Sets the name and version the server reports in `initialize`.
    #[must_use]
    pub fn named(mut self, name: impl Into<String>, version: impl Into<String>) -> Self {
        self.shared_mut().info = Implementation::new(name, version);
        self
    }

    /// Sets the instructions the server reports in `initialize`.
    #[must_use]
    pub fn instructions(mut self, text: impl Into<String>) -> Self {
        self.shared_mut().instructions = Some(text.into());
        self
    }

    /// The `Host` values streamable HTTP accepts. By default only loopback names
    /// (`localhost`, `127.0.0.1`, `::1`), which protects a local server from DNS rebinding;
    /// a public deployment lists its own host names.
    #[must_use]
    pub fn allowed_hosts(mut self, hosts: impl IntoIterator<Item = impl Into<String>>) -> Self {
        self.shared_mut().allowed_hosts = Some(hosts.into_iter().map(Into::into).collect());
        self
    }

    /// Accepts `token` as `Authorization: Bearer <token>` on streamable HTTP; call it once
    /// per token (one per client, so one can be revoked alone). With a token set, every
    /// request to [`router`](Self::router) or [`serve_http`](Self::serve_http) without an
    /// accepted one gets 401 and never reaches a tool; without one, `serve_http` serves
    /// loopback only. [`http_service`](Self::http_service) is the bare endpoint: an
    /// application that mounts it itself authenticates in front of it.
    ///
    /// ```
    /// use kuralle::{ToolSet, mcp::McpServer};
    /// # tokio::runtime::Runtime::new().unwrap().block_on(async {
    /// let public = tokio::net::TcpListener::bind("0.0.0.0:0").await.unwrap();
    /// let refused = McpServer::new(ToolSet::new()).serve_http(public, async {}).await;
    /// assert!(matches!(refused, Err(kuralle::mcp::McpError::NoCredentials { .. })));
    /// # });
    /// let server = McpServer::new(ToolSet::new()).bearer_token(std::env::var("MCP_TOKEN").unwrap_or_default());
    /// # let _ = server;
    /// ```
    #[must_use]
    pub fn bearer_token(mut self, token: impl Into<String>) -> Self {
        self.shared_mut().tokens.push(token.into());
        self
    }

    /// The `tools/list` entries: name, description, `inputSchema`, `outputSchema` when the
    /// tool has one (wrapped as `{"result": …}` when its root is not an object, as MCP
    /// requires), and annotations only for what the tool declared.
    pub fn list(&self) -> Vec<rmcp::model::Tool> {
        self.shared.tools.iter().map(|t| describe(t.as_ref())).collect()
    }

    /// Serves one client over this process's stdin and stdout until it disconnects.
    ///
    /// # Errors
    /// [`McpError::Serve`] when the handshake or the transport fails.
    pub async fn serve_stdio(self) -> Result<(), McpError> {
        let running = self.serve(rmcp::transport::stdio()).await.map_err(|e| McpError::Serve(e.to_string()))?;
        running.waiting().await.map_err(|e| McpError::Serve(e.to_string()))?;
        Ok(())
    }

    /// The streamable HTTP endpoint as a tower service (one session per client), to mount
    /// wherever the application routes; [`router`](Self::router) mounts it at `/mcp`.
    pub fn http_service(self) -> StreamableHttpService<McpServer, LocalSessionManager> {
        let mut config = StreamableHttpServerConfig::default();
        if let Some(hosts) = &self.shared.allowed_hosts {
            config = config.with_allowed_hosts(hosts.clone());
        }
        StreamableHttpService::new(move || Ok(self.for_session()), LocalSessionManager::default().into(), config)
    }

    /// An axum router with the streamable HTTP endpoint at `/mcp`, behind the bearer tokens
    /// when the server has any ([`bearer_token`](Self::bearer_token)).
    pub fn router(self) -> axum::Router {
        let tokens = self.shared.tokens.clone();
        let router = axum::Router::new().nest_service("/mcp", self.http_service());
        if tokens.is_empty() {
            return router;
        }
        router.layer(axum::middleware::from_fn(move |request, next| tokens.clone().require(request, next)))
    }

    /// Serves streamable HTTP at `http://<listener address>/mcp` until `shutdown` completes.
    ///
    /// # Errors
    /// [`McpError::NoCredentials`] for a listener beyond loopback when the server has no
    /// [`bearer_token`](Self::bearer_token); [`McpError::Io`] when the listener fails.
    pub async fn serve_http(
        self,
        listener: tokio::net::TcpListener,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> Result<(), McpError> {
        let addr = listener.local_addr()?;
        if !addr.ip().is_loopback() && self.shared.tokens.is_empty() {
            return Err(McpError::NoCredentials { addr });
        }
        axum::serve(listener, self.router()).with_graceful_shutdown(shutdown).await?;
        Ok(())
    }

    /// A handler for one more session: the tools are shared, the log level is its own.
    fn for_session(&self) -> Self {
        Self { shared: Arc::clone(&self.shared), log_level: Arc::new(Mutex::new(LoggingLevel::Info)) }
    }

    async fn call(&self, request: CallToolRequestParams, cx: RequestContext<RoleServer>) -> CallToolResponse {
        let tool = self.shared.tools.get(&request.name).cloned();
        let structured = tool.as_ref().and_then(|t| t.output_schema()).and_then(mcp_output_schema).map(|(_, w)| w);
        let run_id = format!("mcp-{}", crate::store::new_run_id());
        let _active = McpRequest::new(cx.peer.clone(), cx.meta.clone(), Arc::clone(&self.log_level)).enter(&run_id);
        let arguments = Value::Object(request.arguments.unwrap_or_default()).to_string();
        let call =
            ToolCallRequest { call_id: format!("mcp:{}", cx.id).into(), name: request.name.as_ref().into(), arguments };

        let (events, progress) = crate::event::EventSender::channel(crate::runtime::DEFAULT_EVENT_BUFFER);
        let token = cx.meta.get_progress_token();
        let mut sent = 0u64;
        let running = call_standalone(&self.shared.tools, &self.shared.policy, &run_id, call, cx.ct.clone(), events);
        tokio::pin!(running);
        let outcome = loop {
            tokio::select! {
                outcome = &mut running => break outcome,
                Ok(event) = progress.recv_async() => forward(&cx, token.as_ref(), *event, &mut sent).await,
            }
        };
        // Progress sent just before the outcome is still in the channel: it goes out before
        // the response, in order.
        while let Ok(event) = progress.try_recv() {
            forward(&cx, token.as_ref(), *event, &mut sent).await;
        }
        to_call_result(outcome, structured).into()
    }
}

/// Sends a `progress!` value as `notifications/progress` when the client asked for progress.
/// A number is the progress itself; an object may carry `progress`, `total` and `message`;
/// anything else counts up and travels as the message.
async fn forward(cx: &RequestContext<RoleServer>, token: Option<&ProgressToken>, event: Event, sent: &mut u64) {
    let (Some(token), Event::ToolProgress { value, .. }) = (token, event) else { return };
    *sent += 1;
    let count = *sent as f64;
    let mut param = match &value {
        Value::Number(n) => ProgressNotificationParam::new(token.clone(), n.as_f64().unwrap_or(count)),
        Value::Object(map) if map.get("progress").is_some_and(Value::is_number) => {
            let mut p = ProgressNotificationParam::new(token.clone(), map["progress"].as_f64().unwrap_or(count));
            p.total = map.get("total").and_then(Value::as_f64);
            p.message = map.get("message").and_then(Value::as_str).map(str::to_owned);
            p
        }
        Value::String(s) => ProgressNotificationParam::new(token.clone(), count).with_message(s.clone()),
        other => ProgressNotificationParam::new(token.clone(), count).with_message(other.to_string()),
    };
    param.meta = None;
    // A client that hung up cannot be told; the call's outcome still decides the response.
    let _ = cx.peer.notify_progress(param).await;
}

fn describe(tool: &dyn Tool) -> rmcp::model::Tool {
    let input = match tool.input_schema() {
        Value::Object(map) => map.clone(),
        _ => serde_json::Map::new(),
    };
    let mut listed = rmcp::model::Tool::new(tool.name().to_owned(), tool.description().to_owned(), Arc::new(input));
    if let Some((schema, _)) = tool.output_schema().and_then(mcp_output_schema) {
        listed = listed.with_raw_output_schema(Arc::new(schema));
    }
    // Only what the tool declared: `at_most_once` says a repeated call is not harmless.
    if tool.at_most_once() {
        listed = listed.with_annotations(ToolAnnotations::new().idempotent(false));
    }
    listed
}

impl ServerHandler for McpServer {
    fn get_info(&self) -> ServerConfig {
        let mut info = ServerConfig::new(ServerCapabilities::builder().enable_tools().enable_logging().build())
            .with_server_info(self.shared.info.clone());
        if let Some(text) = &self.shared.instructions {
            info = info.with_instructions(text.clone());
        }
        info
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        _cx: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        Ok(ListToolsResult::with_all_items(self.list()))
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        cx: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        // An unknown tool is a protocol error in MCP (the request cannot be routed); every
        // failure of a known tool is an `isError` result the client's user can read.
        if self.shared.tools.get(&request.name).is_none() {
            return Err(ErrorData::invalid_params(
                format!("unknown tool `{}`; this server has: {}", request.name, self.shared.tools.names()),
                None,
            ));
        }
        let span = tracing::info_span!("mcp_tool_call", tool = %request.name, request_id = %cx.id);
        Ok(self.call(request, cx).instrument(span).await)
    }

    async fn set_level(
        &self,
        request: SetLevelRequestParams,
        _cx: RequestContext<RoleServer>,
    ) -> Result<(), ErrorData> {
        *self.log_level.lock().unwrap_or_else(PoisonError::into_inner) = request.level;
        Ok(())
    }
}
