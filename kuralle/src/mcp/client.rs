//! Using an MCP server's tools from an agent, durably.

use std::{
    collections::HashMap,
    sync::{Arc, Mutex, PoisonError},
};

use futures::{StreamExt, stream};
use rmcp::{
    ClientHandler, Peer, RoleClient, ServiceExt,
    model::{
        CallToolRequest, CallToolRequestParams, ClientCapabilities, ClientConfig, ClientRequest, Implementation,
        ProgressNotificationParam, ProgressToken, ProtocolVersion, RequestMetaObject, ServerResult,
    },
    service::{NotificationContext, PeerRequestOptions, RunningService},
    transport::{
        StreamableHttpClientTransport, TokioChildProcess, streamable_http_client::StreamableHttpClientTransportConfig,
    },
};
use serde_json::{Value, json};
use tokio::sync::mpsc::{UnboundedReceiver, UnboundedSender, unbounded_channel};

use super::{
    IDEMPOTENCY_KEY_META, McpError,
    content::{from_call_result, unwrap_output_schema},
    options::{McpClientOptions, gather, unusable},
};
use crate::{
    context::ToolContext,
    error::ToolError,
    tool::{PreparedCall, Tool, ToolEvent, ToolSet, ToolStream},
};

/// Routes `notifications/progress` to the call that asked for them.
///
/// A call learns its progress token only once its request is sent, and a fast server's
/// notifications can arrive before the call subscribes, so notifications for a token nobody
/// listens to yet are kept (a bounded number) and handed over on subscription.
#[derive(Clone, Default)]
struct Handler {
    progress: Arc<Mutex<Routes>>,
}

#[derive(Default)]
struct Routes {
    listeners: HashMap<ProgressToken, UnboundedSender<ProgressNotificationParam>>,
    early: HashMap<ProgressToken, Vec<ProgressNotificationParam>>,
}

/// Early notifications kept, over all tokens; past it they are all dropped (progress is
/// advisory, never journaled).
const EARLY_PROGRESS_LIMIT: usize = 256;

impl Handler {
    fn routes(&self) -> std::sync::MutexGuard<'_, Routes> {
        self.progress.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn subscribe(&self, token: ProgressToken) -> (UnboundedReceiver<ProgressNotificationParam>, Subscription) {
        let (tx, rx) = unbounded_channel();
        let mut routes = self.routes();
        for early in routes.early.remove(&token).unwrap_or_default() {
            let _ = tx.send(early);
        }
        routes.listeners.insert(token.clone(), tx);
        (rx, Subscription { handler: self.clone(), token })
    }
}

/// Stops routing a token's notifications when the call ends.
struct Subscription {
    handler: Handler,
    token: ProgressToken,
}

impl Drop for Subscription {
    fn drop(&mut self) {
        let mut routes = self.handler.routes();
        routes.listeners.remove(&self.token);
        routes.early.remove(&self.token);
    }
}

impl ClientHandler for Handler {
    /// The newest released protocol version: servers deployed today speak it (or negotiate
    /// down from it), while the SDK's default is a draft few servers know.
    fn get_info(&self) -> ClientConfig {
        ClientConfig::new(ClientCapabilities::default(), Implementation::new("kuralle", env!("CARGO_PKG_VERSION")))
            .with_protocol_version(ProtocolVersion::V_2025_11_25)
    }

    async fn on_progress(&self, params: ProgressNotificationParam, _cx: NotificationContext<RoleClient>) {
        let mut routes = self.routes();
        if let Some(listener) = routes.listeners.get(&params.progress_token) {
            let _ = listener.send(params);
            return;
        }
        if routes.early.values().map(Vec::len).sum::<usize>() >= EARLY_PROGRESS_LIMIT {
            routes.early.clear();
        }
        routes.early.entry(params.progress_token.clone()).or_default().push(params);
    }
}

/// A connection to an MCP server whose tools an agent can use.
///
/// Each remote tool becomes an [`McpTool`], a [`Tool`] like any other: add them with
/// [`AgentDef::tools`](crate::AgentDef::tools) (or `tool`). Their calls are journaled, so a
/// resumed run answers a finished call from the journal instead of calling the server again,
/// and each call carries its idempotency key in `_meta` under [`IDEMPOTENCY_KEY_META`].
///
/// ```no_run
/// use kuralle::{AgentDef, mcp::McpClient};
///
/// # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
/// let client = McpClient::http("http://127.0.0.1:3001/mcp").await?;
/// let agent = AgentDef::new("helper", "Use the tools you have.").tools(client.tool_set().await?);
/// # let _ = agent; Ok(()) }
/// ```
#[derive(Clone)]
pub struct McpClient {
    inner: Arc<Inner>,
}

struct Inner {
    service: RunningService<RoleClient, Handler>,
    options: McpClientOptions,
}

impl std::fmt::Debug for McpClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("McpClient")
            .field("server", &self.inner.service.peer_info().and_then(|i| i.server_info.clone()).map(|s| s.name))
            .finish()
    }
}

impl McpClient {
    /// Starts `command` and speaks MCP over its stdin and stdout. The child is killed when
    /// the last clone of the client is dropped.
    ///
    /// # Errors
    /// [`McpError::Connect`] when the command cannot start or the handshake fails.
    pub async fn stdio(command: tokio::process::Command) -> Result<Self, McpError> {
        Self::stdio_with(command, McpClientOptions::default()).await
    }

    /// [`stdio`](Self::stdio) with deadlines and limits of its own.
    ///
    /// # Errors
    /// [`McpError::Connect`] as for `stdio`; [`McpError::Timeout`] when the handshake takes
    /// longer than the connect timeout.
    pub async fn stdio_with(command: tokio::process::Command, options: McpClientOptions) -> Result<Self, McpError> {
        let transport = TokioChildProcess::new(command).map_err(|e| McpError::Connect(e.to_string()))?;
        let served = tokio::time::timeout(options.connect_timeout, Handler::default().serve(transport)).await;
        Self::connect(served, options)
    }

    /// Connects to a streamable HTTP endpoint such as `http://127.0.0.1:3001/mcp`.
    ///
    /// # Errors
    /// [`McpError::Connect`] when the server cannot be reached or the handshake fails;
    /// [`McpError::Timeout`] when it does not answer within 30 s.
    pub async fn http(url: impl Into<String>) -> Result<Self, McpError> {
        Self::http_with(url, McpClientOptions::default()).await
    }

    /// [`http`](Self::http) with deadlines and limits of its own.
    ///
    /// ```no_run
    /// use std::time::Duration;
    /// use kuralle::mcp::{McpClient, McpClientOptions};
    /// # async fn demo() -> Result<(), kuralle::mcp::McpError> {
    /// let options = McpClientOptions::new().connect_timeout(Duration::from_secs(5)).call_timeout(Duration::from_secs(30));
    /// let client = McpClient::http_with("http://127.0.0.1:3001/mcp", options).await?;
    /// # let _ = client; Ok(()) }
    /// ```
    ///
    /// # Errors
    /// See [`http`](Self::http).
    pub async fn http_with(url: impl Into<String>, options: McpClientOptions) -> Result<Self, McpError> {
        let url: String = url.into();
        let mut config = StreamableHttpClientTransportConfig::with_uri(url);
        if let Some(token) = &options.bearer_token {
            config = config.auth_header(token.expose().clone());
        }
        let transport = StreamableHttpClientTransport::from_config(config);
        let served = tokio::time::timeout(options.connect_timeout, Handler::default().serve(transport)).await;
        Self::connect(served, options)
    }

    fn connect<E: std::fmt::Display>(
        served: Result<Result<RunningService<RoleClient, Handler>, E>, tokio::time::error::Elapsed>,
        options: McpClientOptions,
    ) -> Result<Self, McpError> {
        let served = served.map_err(|_| McpError::Timeout { what: "the handshake", after: options.connect_timeout })?;
        let service = served.map_err(|e| McpError::Connect(e.to_string()))?;
        Ok(Self { inner: Arc::new(Inner { service, options }) })
    }

    /// The connection, for requests this type does not wrap.
    pub fn peer(&self) -> &Peer<RoleClient> {
        self.inner.service.peer()
    }

    /// The server's tools, as [`Tool`]s. A tool a model provider would refuse (a name outside
    /// `[a-zA-Z0-9_-]{1,64}`, an input schema that is not an object, a name listed twice) is
    /// left out with a warning, so one bad tool cannot make every model request fail.
    ///
    /// # Errors
    /// [`McpError::Request`] when listing fails; [`McpError::Timeout`] when a page takes
    /// longer than the list timeout; [`McpError::Limit`] past the page, tool or size limit.
    pub async fn tools(&self) -> Result<Vec<McpTool>, McpError> {
        let peer = self.peer();
        let listed = gather(&self.inner.options, |cursor| async move {
            let params = rmcp::model::PaginatedRequestParams::default().with_cursor(cursor);
            let page = peer.list_tools(Some(params)).await?;
            Ok((page.tools, page.next_cursor))
        })
        .await?;
        let mut names = std::collections::HashSet::new();
        Ok(listed
            .into_iter()
            .filter(|t| match unusable(t) {
                Some(why) => {
                    tracing::warn!(tool = %t.name, %why, "an MCP tool is left out");
                    false
                }
                None if !names.insert(t.name.to_string()) => {
                    tracing::warn!(tool = %t.name, "an MCP tool listed twice is left out the second time");
                    false
                }
                None => true,
            })
            .map(|t| {
                let (output_schema, wrapped) = match t.output_schema {
                    Some(s) => {
                        let (schema, wrapped) = unwrap_output_schema(Value::Object((*s).clone()));
                        (Some(schema), wrapped)
                    }
                    None => (None, false),
                };
                McpTool {
                    client: self.clone(),
                    name: t.name.to_string(),
                    description: t.description.map(|d| d.to_string()).unwrap_or_default(),
                    input_schema: Value::Object((*t.input_schema).clone()),
                    output_schema,
                    wrapped,
                }
            })
            .collect())
    }

    /// The server's tools as a [`ToolSet`], ready for [`AgentDef::tools`](crate::AgentDef::tools).
    ///
    /// # Errors
    /// See [`tools`](Self::tools).
    pub async fn tool_set(&self) -> Result<ToolSet, McpError> {
        let mut set = ToolSet::new();
        for tool in self.tools().await? {
            set.push(Arc::new(tool));
        }
        Ok(set)
    }

    /// Calls `name` on the server with `args` (a JSON object), passing `idempotency_key` in
    /// `_meta`. Progress notifications go to `progress`; when `cancel` fires, the server gets
    /// `notifications/cancelled` and the call ends with [`ToolError::Cancelled`].
    #[allow(clippy::too_many_arguments)]
    async fn call(
        &self,
        name: &str,
        wrapped: bool,
        args: serde_json::Map<String, Value>,
        idempotency_key: &str,
        cancel: &tokio_util::sync::CancellationToken,
        progress: futures::channel::mpsc::UnboundedSender<Value>,
    ) -> Result<Value, ToolError> {
        let mut meta = RequestMetaObject::new();
        meta.insert(IDEMPOTENCY_KEY_META.to_owned(), Value::String(idempotency_key.to_owned()));
        let mut options = PeerRequestOptions::no_options();
        options.meta = Some(meta);
        let request = ClientRequest::CallToolRequest(CallToolRequest::new(
            CallToolRequestParams::new(name.to_owned()).with_arguments(args),
        ));
        let unreachable = |e: rmcp::ServiceError| match e {
            // The server answered with a protocol error (an unknown tool, bad parameters).
            rmcp::ServiceError::McpError(e) => {
                ToolError::failed(name, format!("the MCP server refused the call: {}", e.message))
            }
            other => ToolError::failed(name, format!("the MCP server could not be reached: {other}")),
        };
        let mut handle = self.peer().send_cancellable_request(request, options).await.map_err(unreachable)?;
        let (mut updates, _subscription) = self.inner.service.service().subscribe(handle.progress_token.clone());
        let deadline = tokio::time::sleep(self.inner.options.call_timeout);
        tokio::pin!(deadline);
        let response = loop {
            tokio::select! {
                response = &mut handle.rx => break response,
                () = &mut deadline => {
                    let _ = handle.cancel(Some("the call took too long".to_owned())).await;
                    return Err(ToolError::Timeout { tool: name.to_owned(), limit: self.inner.options.call_timeout });
                }
                Some(update) = updates.recv() => {
                    let _ = progress.unbounded_send(progress_value(&update));
                }
                () = cancel.cancelled() => {
                    // The call's outcome is decided here; telling the server is best effort.
                    let _ = handle.cancel(Some("the caller cancelled the call".to_owned())).await;
                    return Err(ToolError::Cancelled { tool: name.to_owned() });
                }
            }
        };
        // rmcp hands each notification to a task of its own, so progress the server sent just
        // before its response may still be on its way: give those tasks a moment to deliver.
        for _ in 0..8 {
            tokio::task::yield_now().await;
            while let Ok(update) = updates.try_recv() {
                let _ = progress.unbounded_send(progress_value(&update));
            }
        }
        let response = response.map_err(|_| ToolError::failed(name, "the MCP connection closed during the call"))?;
        match response.map_err(unreachable)? {
            ServerResult::CallToolResult(result) => from_call_result(name, result, wrapped),
            other => Err(ToolError::InvalidOutput {
                tool: name.to_owned(),
                message: format!("the MCP server answered tools/call with {other:?}"),
            }),
        }
    }
}

/// A progress notification as a [`ToolEvent::Progress`] value.
fn progress_value(update: &ProgressNotificationParam) -> Value {
    json!({"progress": update.progress, "total": update.total, "message": update.message})
}

/// One tool of an MCP server, usable by an agent like any [`Tool`].
///
/// Its arguments are checked to be a JSON object here and validated by the server against
/// its own schema; a server-side failure (`isError`) becomes [`ToolError::Failed`] with the
/// server's message. A single text block is the result as a string, structured content is the
/// result as it is, and other content is an [`McpContent`](super::McpContent).
#[derive(Clone)]
pub struct McpTool {
    client: McpClient,
    name: String,
    description: String,
    input_schema: Value,
    output_schema: Option<Value>,
    /// Structured results arrive as `{"result": …}` (see `unwrap_output_schema`).
    wrapped: bool,
}

impl std::fmt::Debug for McpTool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("McpTool").field("name", &self.name).finish_non_exhaustive()
    }
}

impl Tool for McpTool {
    fn name(&self) -> &str {
        &self.name
    }

    fn description(&self) -> &str {
        &self.description
    }

    fn input_schema(&self) -> &Value {
        &self.input_schema
    }

    fn output_schema(&self) -> Option<&Value> {
        self.output_schema.as_ref()
    }

    fn prepare(&self, args: &Value) -> Result<Box<dyn PreparedCall>, ToolError> {
        let Value::Object(args) = args else {
            return Err(ToolError::invalid_input(&self.name, "the arguments must be a JSON object"));
        };
        Ok(Box::new(RemoteCall { tool: self.clone(), args: args.clone() }))
    }
}

struct RemoteCall {
    tool: McpTool,
    args: serde_json::Map<String, Value>,
}

impl PreparedCall for RemoteCall {
    fn execute(self: Box<Self>, ctx: ToolContext) -> ToolStream {
        let (progress, updates) = futures::channel::mpsc::unbounded();
        let outcome = async move {
            let RemoteCall { tool, args } = *self;
            let result = tool
                .client
                .call(&tool.name, tool.wrapped, args, ctx.idempotency_key(), ctx.cancellation(), progress)
                .await;
            ToolEvent::Outcome(result)
        };
        // Progress ends when the call does (its sender drops), so the outcome is the last
        // thing the runtime needs from this stream.
        stream::select(updates.map(ToolEvent::Progress), stream::once(outcome)).boxed()
    }
}
