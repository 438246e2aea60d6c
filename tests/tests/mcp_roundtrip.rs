//! kuralle's MCP server and client against each other, in process over streamable HTTP on
//! loopback: what `tools/list` advertises, and that `tools/call` takes the model's call path
//! (validation, timeout, contained panics, `on_error`, approval guard, progress, cancellation
//! unless `interruptible = false`), and that an agent's calls of a remote tool are journaled
//! under the key the server sees in `_meta`.

use std::{
    sync::atomic::{AtomicU64, Ordering},
    time::Duration,
};

use futures::StreamExt;
use kuralle::{
    AgentDef, Event, RunStore, Runtime, StepKind, Tool, ToolContext, ToolError, ToolEvent, ToolSet,
    mcp::{
        IDEMPOTENCY_KEY_META, McpClient, McpClientOptions, McpContent, McpError, McpRequest, McpServer, McpTool,
        rmcp::model::CallToolRequestParams,
    },
    progress,
    stores::MemoryStore,
    testing::{ScriptedModel, Turn},
    tool,
};
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

/// What `lookup` returns.
#[derive(Debug, serde::Serialize, schemars::JsonSchema)]
pub struct Found {
    /// The order id.
    pub id: u32,
}

/// Look up an order.
#[tool(parallel_safe)]
async fn lookup(
    /// The order id.
    id: u32,
) -> Found {
    Found { id }
}

/// Charge once; a repeat would charge twice.
#[tool(at_most_once)]
async fn charge(amount: u32) -> u32 {
    amount
}

/// Sleeps past its timeout.
#[tool(timeout = "50ms")]
async fn sleepy() -> String {
    tokio::time::sleep(Duration::from_secs(30)).await;
    "woke".to_owned()
}

/// Panics.
#[tool]
async fn explode() -> String {
    panic!("boom")
}

fn soften(_error: String, input: &RiskyInput) -> Result<String, String> {
    Ok(format!("recovered {}", input.n))
}

/// Fails, then recovers through `on_error`.
#[tool(on_error = soften)]
async fn risky(n: u32) -> Result<String, String> {
    Err(format!("risky {n} failed"))
}

/// Needs a human.
#[tool(needs_approval)]
async fn wire(amount: u32) -> u32 {
    amount
}

/// Returns a picture.
#[tool]
async fn picture() -> McpContent {
    McpContent::new().text("a pixel").image("iVBORw0KGgo=", "image/png")
}

/// Counts to three with progress.
#[tool]
async fn three() -> String {
    for i in 1..=3 {
        progress!(i);
        // The client's SDK delivers each notification on a task of its own; a pause keeps
        // them in order on the far side without relying on scheduling.
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    "three".to_owned()
}

static INTERRUPTED: AtomicU64 = AtomicU64::new(0);
static STUBBORN_DONE: AtomicU64 = AtomicU64::new(0);

/// Waits for its cancellation token.
#[tool]
async fn wait_for_cancel(ctx: &ToolContext) -> String {
    progress!("waiting");
    ctx.cancellation().cancelled().await;
    INTERRUPTED.fetch_add(1, Ordering::SeqCst);
    "cancelled".to_owned()
}

/// Finishes whatever the caller says.
#[tool(interruptible = false)]
async fn stubborn(ctx: &ToolContext) -> String {
    progress!("started");
    tokio::time::sleep(Duration::from_millis(300)).await;
    if !ctx.is_cancelled() {
        STUBBORN_DONE.fetch_add(1, Ordering::SeqCst);
    }
    "done".to_owned()
}

/// Returns the idempotency key the MCP client sent in `_meta`.
#[tool]
async fn key_seen(ctx: &ToolContext) -> Result<String, String> {
    let request = McpRequest::of(ctx).ok_or("not called over MCP")?;
    let key = request.meta().get(IDEMPOTENCY_KEY_META).and_then(Value::as_str).ok_or("no key in _meta")?;
    Ok(key.to_owned())
}

fn tools() -> ToolSet {
    ToolSet::new()
        .with(Lookup)
        .with(Charge)
        .with(Sleepy)
        .with(Explode)
        .with(Risky)
        .with(Wire)
        .with(Picture)
        .with(Three)
        .with(WaitForCancel)
        .with(Stubborn)
        .with(KeySeen)
}

async fn connect() -> McpClient {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/mcp", listener.local_addr().unwrap());
    tokio::spawn(McpServer::new(tools()).serve_http(listener, std::future::pending()));
    McpClient::http(url).await.expect("connect to the in-process server")
}

async fn remote(client: &McpClient, name: &str) -> McpTool {
    client.tools().await.unwrap().into_iter().find(|t| t.name() == name).unwrap()
}

async fn call(client: &McpClient, name: &str, args: Value) -> Result<Value, ToolError> {
    remote(client, name).await.call(args, ToolContext::detached()).await
}

fn message(result: Result<Value, ToolError>) -> String {
    match result {
        Err(ToolError::Failed { message, .. }) => message,
        other => panic!("expected a failure, got {other:?}"),
    }
}

#[test]
fn tools_list_is_the_model_specs_with_only_declared_hints() {
    let server = McpServer::new(tools());
    let listed = server.list();
    let specs = tools().specs();
    assert_eq!(listed.len(), specs.len());
    for (mcp, spec) in listed.iter().zip(&specs) {
        assert_eq!(mcp.name, spec.name);
        assert_eq!(mcp.description.as_deref(), Some(spec.description.as_str()));
        assert_eq!(Value::Object((*mcp.input_schema).clone()), spec.input_schema);
        let annotations = serde_json::to_value(&mcp.annotations).unwrap();
        if spec.name == "charge" {
            assert_eq!(annotations, json!({"idempotentHint": false}));
        } else {
            assert_eq!(annotations, Value::Null, "{} declared no hint", spec.name);
        }
    }
    let by_name = |n: &str| listed.iter().find(|t| t.name == n).unwrap();
    // An object result's schema as it is; any other result wrapped as {"result": …}.
    let found = Value::Object((*by_name("lookup").output_schema.clone().unwrap()).clone());
    assert_eq!(found["properties"]["id"]["type"], "integer");
    let wrapped = Value::Object((*by_name("charge").output_schema.clone().unwrap()).clone());
    assert_eq!(wrapped["properties"]["result"]["type"], "integer");
    assert_eq!(wrapped["required"], json!(["result"]));
    assert!(by_name("picture").output_schema.is_none(), "McpContent has no JSON Schema");

    // An agent's tools, the same way.
    let agent = AgentDef::new("support", "Look orders up.").tool(Lookup);
    let names: Vec<_> = McpServer::for_agent(&agent).list().into_iter().map(|t| t.name).collect();
    assert_eq!(names, ["lookup"]);
}

#[tokio::test]
async fn calls_take_the_model_call_path() {
    let client = connect().await;
    assert_eq!(call(&client, "lookup", json!({"id": 7})).await, Ok(json!({"id": 7})));
    // Wrapped on the wire, unwrapped by the client; the schema too.
    assert_eq!(call(&client, "charge", json!({"amount": 5})).await, Ok(json!(5)));
    assert_eq!(remote(&client, "charge").await.output_schema().map(|s| &s["type"]), Some(&json!("integer")));

    assert!(
        message(call(&client, "lookup", json!({"id": "seven"})).await).contains("invalid arguments for tool `lookup`")
    );
    assert!(message(call(&client, "sleepy", json!({})).await).contains("timed out"));
    let panicked = message(call(&client, "explode", json!({})).await);
    assert!(panicked.contains("panicked") && panicked.contains("boom"), "{panicked}");
    assert_eq!(call(&client, "risky", json!({"n": 3})).await, Ok(json!("recovered 3")));
    assert!(message(call(&client, "wire", json!({"amount": 1})).await).contains("approval"));
    // An unknown tool is a protocol error, not a tool result.
    let unknown = client.peer().call_tool(CallToolRequestParams::new("nope")).await.unwrap_err().to_string();
    assert!(unknown.contains("unknown tool `nope`"), "{unknown}");

    let picture = call(&client, "picture", json!({})).await.unwrap();
    let blocks = serde_json::from_value::<McpContent>(picture).unwrap();
    assert_eq!(blocks.blocks().len(), 2);

    let events: Vec<ToolEvent> =
        remote(&client, "three").await.execute(&json!({}), ToolContext::detached()).collect().await;
    let progress: Vec<f64> = events
        .iter()
        .filter_map(|e| if let ToolEvent::Progress(p) = e { p["progress"].as_f64() } else { None })
        .collect();
    assert_eq!(progress, [1.0, 2.0, 3.0]);
    assert_eq!(events.last(), Some(&ToolEvent::Outcome(Ok(json!("three")))));
}

/// Runs `name` through the client until its first progress value, then cancels the caller's
/// token; returns the call's outcome.
async fn cancel_after_start(client: &McpClient, name: &str) -> Result<Value, ToolError> {
    let token = CancellationToken::new();
    let ctx = ToolContext::new("run", "call", "key", token.clone());
    let tool = remote(client, name).await;
    let mut events = tool.execute(&json!({}), ctx);
    loop {
        match events.next().await.expect("an outcome") {
            ToolEvent::Progress(_) => token.cancel(),
            ToolEvent::Outcome(out) => return out,
        }
    }
}

#[tokio::test]
async fn cancellation_reaches_the_tool_unless_it_is_not_interruptible() {
    let client = connect().await;
    let out = cancel_after_start(&client, "wait_for_cancel").await;
    assert!(matches!(out, Err(ToolError::Cancelled { .. })), "{out:?}");
    let mut waited = 0;
    while INTERRUPTED.load(Ordering::SeqCst) == 0 && waited < 100 {
        tokio::time::sleep(Duration::from_millis(20)).await;
        waited += 1;
    }
    assert_eq!(INTERRUPTED.load(Ordering::SeqCst), 1, "notifications/cancelled fired the tool's token");

    let out = cancel_after_start(&client, "stubborn").await;
    assert!(matches!(out, Err(ToolError::Cancelled { .. })), "the caller stops waiting: {out:?}");
    let mut waited = 0;
    while STUBBORN_DONE.load(Ordering::SeqCst) == 0 && waited < 100 {
        tokio::time::sleep(Duration::from_millis(20)).await;
        waited += 1;
    }
    assert_eq!(STUBBORN_DONE.load(Ordering::SeqCst), 1, "an uninterruptible tool finishes with its token unfired");
}

#[tokio::test]
async fn an_agent_journals_remote_calls_under_the_key_the_server_sees() {
    let client = connect().await;
    let store = std::sync::Arc::new(MemoryStore::new());
    let agent = AgentDef::new("remote_user", "Use the tools.").tools(client.tool_set().await.unwrap());
    let model = ScriptedModel::new([Turn::tool_calls([("c1", "key_seen", "{}")]), Turn::text("ok")]);
    let runtime = Runtime::builder().agent(agent).model(model).store_arc(store.clone()).build().unwrap();
    let mut handle = runtime.run("go");
    let mut seen = None;
    while let Some(event) = handle.next().await {
        if let Event::ToolResult { result, is_error, .. } = event {
            assert!(!is_error, "{result}");
            seen = Some(result);
        }
    }
    let out = handle.await.unwrap();
    let steps = store.steps(&out.run_id).await.unwrap();
    let step = steps.iter().find(|s| s.kind == StepKind::Tool && s.name == "key_seen").expect("a journal step");
    assert_eq!(seen, Some(Value::String(step.key.clone())));
    assert_eq!(step.result.as_ref().map(kuralle::JsonText::to_value), seen);
}

/// A server that accepts the connection and never answers cannot hang the client: connecting
/// ends with a timeout (issue 24, item 4).
#[tokio::test]
async fn a_server_that_never_answers_the_handshake_times_out() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/mcp", listener.local_addr().unwrap());
    tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((socket, _)) = listener.accept().await {
            held.push(socket); // read nothing, answer nothing
        }
    });
    let options = McpClientOptions::new().connect_timeout(Duration::from_millis(300));
    let err = McpClient::http_with(url, options).await.unwrap_err();
    assert!(matches!(err, McpError::Timeout { after, .. } if after == Duration::from_millis(300)), "{err}");
}

static NEVER_CANCELLED: AtomicU64 = AtomicU64::new(0);

/// Answers only when cancelled.
#[tool]
async fn never_answers(ctx: &ToolContext) -> String {
    ctx.cancellation().cancelled().await;
    NEVER_CANCELLED.fetch_add(1, Ordering::SeqCst);
    "cancelled".to_owned()
}

/// A call the server never answers ends at the call timeout with a typed error for the model,
/// and the server is told to cancel (the tool sees its token fire).
#[tokio::test]
async fn a_call_the_server_never_answers_times_out() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/mcp", listener.local_addr().unwrap());
    tokio::spawn(McpServer::new(ToolSet::new().with(NeverAnswers)).serve_http(listener, std::future::pending()));
    let options = McpClientOptions::new().call_timeout(Duration::from_millis(300));
    let client = McpClient::http_with(url, options).await.unwrap();
    let result = call(&client, "never_answers", json!({})).await;
    assert!(
        matches!(&result, Err(ToolError::Timeout { tool, limit }) if tool == "never_answers" && *limit == Duration::from_millis(300)),
        "{result:?}"
    );
    for _ in 0..100 {
        if NEVER_CANCELLED.load(Ordering::SeqCst) > 0 {
            return;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("the server's call was never cancelled");
}

/// Listing limits reach the real client: a server listing more tools than allowed is refused.
#[tokio::test]
async fn a_listing_past_the_tool_limit_is_refused() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/mcp", listener.local_addr().unwrap());
    tokio::spawn(McpServer::new(tools()).serve_http(listener, std::future::pending()));
    let client = McpClient::http_with(url, McpClientOptions::new().max_tools(3)).await.unwrap();
    let err = client.tools().await.unwrap_err();
    assert!(matches!(&err, McpError::Limit(m) if m.contains("3 tools")), "{err}");
}
