//! The quickstart's `echo` tool, and the tools the official MCP conformance suite expects,
//! written with `#[tool]` and served over MCP.
//!
//! ```text
//! cargo run -p kuralle-examples --example mcp_server                         # stdio
//! cargo run -p kuralle-examples --example mcp_server -- --http 127.0.0.1:3001  # http://127.0.0.1:3001/mcp
//! MCP_TOKEN=… cargo run -p kuralle-examples --example mcp_server -- --http 0.0.0.0:3001  # beyond loopback
//! ```
//!
//! Beyond loopback the server needs a bearer token (`MCP_TOKEN`); clients send it as
//! `Authorization: Bearer …` (`mcp_client` reads the same variable).

// Sampling and logging are deprecated only by the 2026 protocol draft; the conformance suite
// (and every released protocol version) exercises them.
#![allow(deprecated)]

use std::{
    error::Error,
    sync::atomic::{AtomicU64, Ordering},
    time::Duration,
};

use kuralle::{
    ToolContext, ToolSet,
    mcp::{
        McpContent, McpRequest, McpServer,
        rmcp::model::{CreateMessageRequestParams, ElicitRequestParams, LoggingLevel, SamplingMessage},
    },
    progress, tool,
};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

/// A 1×1 red PNG.
const PNG: &str = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8/5+hHgAHggJ/PchI7wAAAABJRU5ErkJggg==";
/// A silent WAV.
const WAV: &str = "UklGRiQAAABXQVZFZm10IBAAAAABAAEARKwAAIhYAQACABAAZGF0YQAAAAA=";

/// What `echo` returns.
#[derive(Debug, Serialize, JsonSchema)]
pub struct Echoed {
    /// The text, unchanged.
    pub echoed: String,
}

/// Echo back the provided text.
#[tool(parallel_safe)]
async fn echo(
    /// The text to echo back.
    text: String,
) -> Echoed {
    Echoed { echoed: text }
}

/// Returns simple text content.
#[tool]
async fn test_simple_text() -> String {
    "This is a simple text response for testing.".to_owned()
}

/// Returns image content.
#[tool]
async fn test_image_content() -> McpContent {
    McpContent::new().image(PNG, "image/png")
}

/// Returns audio content.
#[tool]
async fn test_audio_content() -> McpContent {
    McpContent::new().audio(WAV, "audio/wav")
}

/// Returns embedded resource content.
#[tool]
async fn test_embedded_resource() -> McpContent {
    McpContent::new().resource_text("test://embedded-resource", "text/plain", "This is an embedded resource content.")
}

/// Returns multiple content types.
#[tool]
async fn test_multiple_content_types() -> McpContent {
    McpContent::new().text("Multiple content types test:").image(PNG, "image/png").resource_text(
        "test://mixed-content-resource",
        "application/json",
        r#"{"test":"data","value":123}"#,
    )
}

/// Sends logging notifications during execution.
#[tool]
async fn test_tool_with_logging(ctx: &ToolContext) -> Result<String, String> {
    let request = McpRequest::of(ctx).ok_or("this tool logs to an MCP client")?;
    for (i, message) in
        ["Tool execution started", "Tool processing data", "Tool execution completed"].iter().enumerate()
    {
        if i > 0 {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        request.log(LoggingLevel::Info, json!(message)).await.map_err(|e| e.to_string())?;
    }
    Ok("Logging test completed".to_owned())
}

/// Always returns an error.
#[tool]
async fn test_error_handling() -> Result<String, String> {
    Err("This tool intentionally returns an error for testing".to_owned())
}

/// Reports progress notifications.
#[tool]
async fn test_tool_with_progress() -> String {
    for step in [0, 50, 100] {
        if step > 0 {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        progress!(json!({"progress": step, "total": 100}));
    }
    "Progress test completed".to_owned()
}

/// Requests LLM sampling from the client.
#[tool]
async fn test_sampling(
    /// The prompt to send.
    prompt: String,
    ctx: &ToolContext,
) -> Result<String, String> {
    let request = McpRequest::of(ctx).ok_or("sampling needs an MCP client")?;
    let params = CreateMessageRequestParams::new(vec![SamplingMessage::user_text(prompt)], 100);
    let answer = request.peer().create_message(params).await.map_err(|e| format!("sampling failed: {e}"))?;
    let answer = serde_json::to_value(&answer).map_err(|e| e.to_string())?;
    let text = answer["content"]["text"].as_str().map_or_else(|| answer["content"].to_string(), str::to_owned);
    Ok(format!("LLM response: {text}"))
}

async fn elicit(ctx: &ToolContext, message: String, schema: Value) -> Result<String, String> {
    let request = McpRequest::of(ctx).ok_or("elicitation needs an MCP client")?;
    let requested_schema = serde_json::from_value(schema).map_err(|e| e.to_string())?;
    let params = ElicitRequestParams::FormElicitationParams { meta: None, message, requested_schema };
    let answer = request.peer().create_elicitation(params).await.map_err(|e| format!("elicitation failed: {e}"))?;
    let answer = serde_json::to_value(&answer).map_err(|e| e.to_string())?;
    Ok(format!("User response: action={}, content={}", answer["action"], answer["content"]))
}

/// Requests user input from the client.
#[tool]
async fn test_elicitation(
    /// The message to show.
    message: String,
    ctx: &ToolContext,
) -> Result<String, String> {
    let schema = json!({
        "type": "object",
        "properties": {
            "username": {"type": "string", "description": "User's response"},
            "email": {"type": "string", "description": "User's email address"}
        },
        "required": ["username", "email"]
    });
    elicit(ctx, message, schema).await
}

/// Tests elicitation with default values (SEP-1034).
#[tool]
async fn test_elicitation_sep1034_defaults(ctx: &ToolContext) -> Result<String, String> {
    let schema = json!({
        "type": "object",
        "properties": {
            "name": {"type": "string", "description": "User's name", "default": "John Doe"},
            "age": {"type": "integer", "description": "User's age", "default": 30},
            "score": {"type": "number", "description": "User's score", "default": 95.5},
            "status": {"type": "string", "description": "User's status", "enum": ["active", "inactive", "pending"], "default": "active"},
            "verified": {"type": "boolean", "description": "Whether user is verified", "default": true}
        }
    });
    elicit(ctx, "Please provide values (all have defaults)".to_owned(), schema).await
}

/// Tests enum schema improvements (SEP-1330).
#[tool]
async fn test_elicitation_sep1330_enums(ctx: &ToolContext) -> Result<String, String> {
    let schema = json!({
        "type": "object",
        "properties": {
            "untitledSingle": {"type": "string", "enum": ["option1", "option2", "option3"]},
            "titledSingle": {"type": "string", "oneOf": [
                {"const": "value1", "title": "First Option"},
                {"const": "value2", "title": "Second Option"},
                {"const": "value3", "title": "Third Option"}
            ]},
            "legacyEnum": {"type": "string", "enum": ["opt1", "opt2", "opt3"], "enumNames": ["Option One", "Option Two", "Option Three"]},
            "untitledMulti": {"type": "array", "items": {"type": "string", "enum": ["option1", "option2", "option3"]}},
            "titledMulti": {"type": "array", "items": {"anyOf": [
                {"const": "value1", "title": "First Choice"},
                {"const": "value2", "title": "Second Choice"},
                {"const": "value3", "title": "Third Choice"}
            ]}}
        }
    });
    elicit(ctx, "Test enum schema improvements".to_owned(), schema).await
}

/// A postal address.
#[derive(Debug, Deserialize, JsonSchema)]
#[schemars(rename = "address")] // the `$defs` name the conformance suite looks for
pub struct Address {
    /// Street and number.
    pub street: Option<String>,
    /// City.
    pub city: Option<String>,
}

/// Tool with JSON Schema 2020-12 features.
#[tool]
async fn json_schema_2020_12_tool(
    /// Who to greet.
    name: Option<String>,
    /// Where they live.
    address: Option<Address>,
) -> String {
    let place = address.and_then(|a| a.city).map(|c| format!(" from {c}")).unwrap_or_default();
    format!("Hello, {}{place}!", name.as_deref().unwrap_or("world"))
}

/// Tests SSE reconnection behavior.
#[tool]
async fn test_reconnection() -> String {
    tokio::time::sleep(Duration::from_millis(100)).await;
    "Reconnection test completed".to_owned()
}

/// Calls to `slow_count` that ended because their cancellation token fired.
static CANCELLED: AtomicU64 = AtomicU64::new(0);

/// Counts up once every 100 ms, reporting each number as progress, until it reaches `to`
/// or is cancelled.
#[tool]
async fn slow_count(
    /// Where to stop.
    to: u32,
    ctx: &ToolContext,
) -> Result<u32, String> {
    for i in 1..=to {
        tokio::select! {
            () = ctx.cancellation().cancelled() => {
                CANCELLED.fetch_add(1, Ordering::SeqCst);
                return Err(format!("cancelled at {i}"));
            }
            () = tokio::time::sleep(Duration::from_millis(100)) => {}
        }
        progress!(json!({"progress": i, "total": to, "message": format!("counted {i}")}));
    }
    Ok(to)
}

/// How many `slow_count` calls noticed their cancellation.
#[tool]
async fn cancellations() -> u64 {
    CANCELLED.load(Ordering::SeqCst)
}

fn tools() -> ToolSet {
    ToolSet::new()
        .with(Echo)
        .with(TestSimpleText)
        .with(TestImageContent)
        .with(TestAudioContent)
        .with(TestEmbeddedResource)
        .with(TestMultipleContentTypes)
        .with(TestToolWithLogging)
        .with(TestErrorHandling)
        .with(TestToolWithProgress)
        .with(TestSampling)
        .with(TestElicitation)
        .with(TestElicitationSep1034Defaults)
        .with(TestElicitationSep1330Enums)
        .with(JsonSchema202012Tool)
        .with(TestReconnection)
        .with(SlowCount)
        .with(Cancellations)
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn Error>> {
    let mut server = McpServer::new(tools()).named("kuralle-mcp-server", env!("CARGO_PKG_VERSION"));
    if let Ok(token) = std::env::var("MCP_TOKEN") {
        server = server.bearer_token(token);
    }
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.as_slice() {
        [] => server.serve_stdio().await?,
        [flag, addr] if flag == "--http" => {
            let listener = tokio::net::TcpListener::bind(addr).await?;
            // The bound address (a port of 0 picks a free one) tells scripts where to connect.
            eprintln!("listening on http://{}/mcp", listener.local_addr()?);
            server
                .serve_http(listener, async {
                    let _ = tokio::signal::ctrl_c().await;
                })
                .await?;
        }
        _ => return Err("usage: mcp_server [--http ADDR]".into()),
    }
    Ok(())
}
