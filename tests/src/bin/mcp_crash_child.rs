//! A run whose agent uses a FastMCP server's tools (over stdio) on a `SqliteStore`: the
//! model calls the remote `add`, then the local `checkpoint`, which aborts the process when
//! `CRASH` is set. Run again without `CRASH` on the same run id, it must finish without
//! calling `add` on the server a second time. Prints one JSON line with the outcome.

use std::time::Duration;

use futures::StreamExt;
use kuralle::{
    AgentDef, Event, RunRequest, Runtime,
    mcp::McpClient,
    stores::SqliteStore,
    testing::{ScriptedModel, Turn},
    tool,
};
use serde_json::json;

/// Marks the point where the process dies when `CRASH` is set.
#[tool]
async fn checkpoint() -> String {
    if std::env::var_os("CRASH").is_some() {
        // A real crash: no destructors, no flush, the journal as the disk has it.
        std::process::abort();
    }
    "passed".to_owned()
}

#[tokio::main]
async fn main() {
    let db = std::env::var("DB").expect("DB");
    let run_id = std::env::var("RUN_ID").expect("RUN_ID");
    let python = std::env::var("PEER_PYTHON").expect("PEER_PYTHON");
    let script = std::env::var("PEER_SCRIPT").expect("PEER_SCRIPT");

    let mut command = tokio::process::Command::new(python);
    command.arg(script);
    let peer = McpClient::stdio(command).await.expect("connect to the FastMCP server");
    let agent =
        AgentDef::new("mcp_user", "Use the tools.").tools(peer.tool_set().await.expect("list tools")).tool(Checkpoint);
    let model = ScriptedModel::by_transcript([
        Turn::tool_calls([("call_add", "add", r#"{"a":2,"b":3}"#)]),
        Turn::tool_calls([("call_cp", "checkpoint", "{}")]),
        Turn::text("Added and checked."),
    ]);
    let runtime = Runtime::builder()
        .agent(agent)
        .model(model)
        .store(SqliteStore::open(&db).expect("open store"))
        // The crashed process still holds the run's lease until it expires: keep it short,
        // and let the resuming process wait for it.
        .lease_ttl(Duration::from_secs(1))
        .build()
        .expect("runtime");
    let mut handle = runtime.run(RunRequest::new("Add 2 and 3").run_id(run_id).wait_for_lease(Duration::from_secs(20)));
    let mut results = Vec::new();
    while let Some(event) = handle.next().await {
        if let Event::ToolResult { name, result, is_error, replayed, .. } = event {
            results.push(json!({"name": name, "result": result, "is_error": is_error, "replayed": replayed}));
        }
    }
    let out = handle.await.expect("run completes");
    println!("{}", json!({"status": out.status.as_str(), "text": out.text, "results": results}));
}
