//! Uses an MCP server's tools through kuralle's client: lists them, or calls one.
//!
//! ```text
//! cargo run -p kuralle-examples --example mcp_client -- http://127.0.0.1:3001/mcp
//! cargo run -p kuralle-examples --example mcp_client -- http://127.0.0.1:3001/mcp echo '{"text":"hello"}'
//! cargo run -p kuralle-examples --example mcp_client -- "python3 server.py" add '{"a":1,"b":2}'
//! ```
//!
//! The first argument is a streamable HTTP URL, or a command that speaks MCP on stdio. Each
//! remote tool is an ordinary `kuralle::Tool`, the same object an agent would call.
//!
//! Under the MCP conformance suite (`MCP_CONFORMANCE_SCENARIO` set, the server URL as the
//! last argument) it plays the client each scenario asks for.

use std::error::Error;

use futures::StreamExt;
use kuralle::{
    Tool, ToolContext, ToolEvent,
    mcp::{McpClient, McpClientOptions},
};
use serde_json::{Value, json};

async fn connect(target: &str) -> Result<McpClient, Box<dyn Error>> {
    if target.starts_with("http://") || target.starts_with("https://") {
        // A server beyond loopback wants its bearer token.
        let mut options = McpClientOptions::new();
        if let Ok(token) = std::env::var("MCP_TOKEN") {
            options = options.bearer_token(token);
        }
        return Ok(McpClient::http_with(target, options).await?);
    }
    let mut words = target.split_whitespace();
    let program = words.next().ok_or("an empty command")?;
    let mut command = tokio::process::Command::new(program);
    command.args(words);
    Ok(McpClient::stdio(command).await?)
}

/// Calls `name` with `args` as an agent would, printing progress as it arrives.
async fn call(client: &McpClient, name: &str, args: Value) -> Result<Value, Box<dyn Error>> {
    let tools = client.tools().await?;
    let tool = tools.iter().find(|t| t.name() == name).ok_or_else(|| format!("the server has no tool `{name}`"))?;
    let mut events = tool.execute(&args, ToolContext::detached());
    while let Some(event) = events.next().await {
        match event {
            ToolEvent::Progress(p) => eprintln!("progress: {p}"),
            ToolEvent::Outcome(out) => return Ok(out?),
        }
    }
    Err("the call ended without a result".into())
}

async fn conformance(scenario: &str, url: &str) -> Result<(), Box<dyn Error>> {
    let client = connect(url).await?;
    let listed = client.tools().await?;
    eprintln!("tools: {:?}", listed.iter().map(|t| t.name()).collect::<Vec<_>>());
    match scenario {
        "tools_call" => println!("{}", call(&client, "add_numbers", json!({"a": 2, "b": 3})).await?),
        "sse-retry" => println!("{}", call(&client, "test_reconnection", json!({})).await?),
        _ => {}
    }
    Ok(())
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if let Ok(scenario) = std::env::var("MCP_CONFORMANCE_SCENARIO") {
        let url = args.last().ok_or("the conformance suite passes the server URL last")?;
        return conformance(&scenario, url).await;
    }
    match args.as_slice() {
        [target] => {
            for tool in connect(target).await?.tools().await? {
                println!("{}: {}", tool.name(), tool.description());
            }
        }
        [target, name, rest @ ..] => {
            let args: Value = match rest {
                [] => json!({}),
                [json] => serde_json::from_str(json)?,
                _ => return Err("usage: mcp_client TARGET [TOOL [JSON_ARGS]]".into()),
            };
            let client = connect(target).await?;
            println!("{}", call(&client, name, args).await?);
        }
        _ => return Err("usage: mcp_client TARGET [TOOL [JSON_ARGS]]".into()),
    }
    Ok(())
}
