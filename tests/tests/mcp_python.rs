//! kuralle's MCP server and client against the official MCP Python SDK (`mcp` on PyPI, in
//! the virtualenv `.ci/run` creates): the SDK's client against `examples/mcp_server` over
//! stdio and HTTP, and kuralle's client against a FastMCP server, including a crash and
//! resume that must not call the server again for a finished call. Skips with a notice where
//! the virtualenv is missing.

mod mcp_common;

use std::{
    path::Path,
    process::{Command, Stdio},
    time::Duration,
};

use futures::StreamExt;
use kuralle::{
    RunStore, StepKind, StepStatus, Tool, ToolContext, ToolError, ToolEvent,
    mcp::{McpClient, McpTool},
    stores::SqliteStore,
};
use mcp_common::{Running, python, root, serve_http};
use serde_json::{Value, json};

fn python_client(python: &Path, args: &[&str]) -> Value {
    let out = Command::new(python)
        .arg(root().join("tests/fixtures/mcp/python_client.py"))
        .args(args)
        .stderr(Stdio::inherit())
        .output()
        .expect("run the Python client");
    assert!(out.status.success(), "the Python client failed: {out:?}");
    serde_json::from_slice(&out.stdout).expect("the Python client's JSON report")
}

fn check_python_report(report: &Value) {
    let tools: Vec<&str> = report["tools"].as_array().unwrap().iter().map(|t| t.as_str().unwrap()).collect();
    assert!(tools.contains(&"echo") && tools.contains(&"slow_count"), "{tools:?}");
    // The same schema the model sees, and the output schema of the `Echoed` result.
    assert_eq!(report["echo_input_schema"]["required"], json!(["text"]));
    assert_eq!(report["echo_input_schema"]["properties"]["text"]["description"], "The text to echo back.");
    assert_eq!(report["echo_output_schema"]["properties"]["echoed"]["type"], "string");
    assert_eq!(report["echo"]["is_error"], false);
    assert_eq!(report["echo"]["structured"], json!({"echoed": "hi from python"}));
    // Validation happens before execute, as for a model's call, and reads as a tool error.
    assert_eq!(report["invalid"]["is_error"], true);
    assert!(report["invalid"]["text"][0].as_str().unwrap().contains("unknown field `txt`"), "{report}");
    // `progress!` values arrive as notifications/progress, in order.
    assert_eq!(report["count"]["structured"], json!({"result": 3}));
    let progress: Vec<f64> =
        report["count"]["progress"].as_array().unwrap().iter().map(|p| p["progress"].as_f64().unwrap()).collect();
    assert_eq!(progress, [1.0, 2.0, 3.0]);
    assert_eq!(report["count"]["progress"][2]["message"], "counted 3");
    // notifications/cancelled fired the slow call's token: the tool saw it and counted it.
    assert!(report["cancelled_after_progress"].as_u64().unwrap() >= 1);
    assert_eq!(report["cancellations"], json!({"result": 1}), "{report}");
}

#[test]
fn python_sdk_client_over_stdio() {
    let Some(python) = python("python_sdk_client_over_stdio") else { return };
    let report = python_client(&python, &["stdio", env!("CARGO_BIN_EXE_mcp_server")]);
    check_python_report(&report);
}

#[test]
fn python_sdk_client_over_http() {
    let Some(python) = python("python_sdk_client_over_http") else { return };
    let (_server, url) = serve_http();
    let report = python_client(&python, &["http", &url]);
    check_python_report(&report);
}

fn fastmcp(python: &Path) -> tokio::process::Command {
    let mut command = tokio::process::Command::new(python);
    command.arg(root().join("tests/fixtures/mcp/fastmcp_server.py"));
    command
}

async fn remote(client: &McpClient, name: &str) -> McpTool {
    client.tools().await.unwrap().into_iter().find(|t| t.name() == name).unwrap_or_else(|| panic!("no `{name}`"))
}

/// kuralle's client against FastMCP: tools with their schemas, a call with its result, the
/// peer's progress, its failures as tool errors, and the idempotency key in `_meta`.
async fn exercise_fastmcp(client: &McpClient, effects: &Path) {
    let add = remote(client, "add").await;
    assert_eq!(add.description(), "Add two integers.");
    assert_eq!(add.input_schema()["required"], json!(["a", "b"]));
    // The SDK's FastMCP wraps an int result as {"result": …} without marking the schema as a
    // wrapper, so the structured content is the result as the server declared it.
    assert_eq!(add.output_schema().map(|s| &s["properties"]["result"]["type"]), Some(&json!("integer")));
    let ctx = ToolContext::new("run-x", "call-1", "key-123", Default::default());
    assert_eq!(add.call(json!({"a": 2, "b": 40}), ctx).await, Ok(json!({"result": 42})));
    assert_eq!(std::fs::read_to_string(effects).unwrap(), "add\tkey-123\n");

    let count = remote(client, "count").await;
    let events: Vec<ToolEvent> = count.execute(&json!({"to": 3}), ToolContext::detached()).collect().await;
    let progress: Vec<&Value> =
        events.iter().filter_map(|e| if let ToolEvent::Progress(p) = e { Some(p) } else { None }).collect();
    assert_eq!(progress.len(), 3, "{events:?}");
    assert_eq!(progress[2]["message"], "step 3");
    assert_eq!(events.last(), Some(&ToolEvent::Outcome(Ok(json!({"result": "counted to 3"})))));

    let fail = remote(client, "fail").await;
    match fail.call(json!({}), ToolContext::detached()).await {
        Err(ToolError::Failed { tool, message }) => {
            assert_eq!(tool, "fail");
            assert!(message.contains("the peer failed on purpose"), "{message}");
        }
        other => panic!("expected a tool failure, got {other:?}"),
    }
}

#[tokio::test]
async fn kuralle_client_against_fastmcp_over_stdio() {
    let Some(python) = python("kuralle_client_against_fastmcp_over_stdio") else { return };
    let dir = tempfile::tempdir().unwrap();
    let effects = dir.path().join("effects.log");
    let mut command = fastmcp(&python);
    command.env("EFFECTS", &effects);
    let client = McpClient::stdio(command).await.expect("connect over stdio");
    exercise_fastmcp(&client, &effects).await;
}

#[tokio::test]
async fn kuralle_client_against_fastmcp_over_http() {
    let Some(python) = python("kuralle_client_against_fastmcp_over_http") else { return };
    let dir = tempfile::tempdir().unwrap();
    let effects = dir.path().join("effects.log");
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let server = std::process::Command::new(&python)
        .arg(root().join("tests/fixtures/mcp/fastmcp_server.py"))
        .args(["http", &port.to_string()])
        .env("EFFECTS", &effects)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start FastMCP over HTTP");
    let _server = Running(server);
    let url = format!("http://127.0.0.1:{port}/mcp");
    let mut client = None;
    for _ in 0..100 {
        if let Ok(c) = McpClient::http(url.clone()).await {
            client = Some(c);
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let client = client.expect("FastMCP answers over HTTP within 10 s");
    exercise_fastmcp(&client, &effects).await;
}

fn crash_child(dir: &Path, python: &Path, crash: bool) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_mcp_crash_child"));
    cmd.env("DB", dir.join("runs.db"))
        .env("RUN_ID", "mcp-run-1")
        .env("EFFECTS", dir.join("effects.log"))
        .env("PEER_PYTHON", python)
        .env("PEER_SCRIPT", root().join("tests/fixtures/mcp/fastmcp_server.py"))
        .env_remove("CRASH")
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit());
    if crash {
        cmd.env("CRASH", "1");
    }
    cmd
}

/// A process runs an agent whose `add` is a FastMCP tool, and dies (abort) after `add`
/// finished. Resumed on the same run id, the run completes: `add` is answered from the
/// journal, the server ran it once, and it saw the journal's idempotency key.
#[test]
fn crash_and_resume_does_not_call_the_server_again() {
    let Some(python) = python("crash_and_resume_does_not_call_the_server_again") else { return };
    let dir = tempfile::tempdir().unwrap();

    let crashed = crash_child(dir.path(), &python, true).output().expect("run the child");
    assert!(!crashed.status.success(), "the child was meant to abort: {crashed:?}");
    let effects = std::fs::read_to_string(dir.path().join("effects.log")).unwrap();
    assert_eq!(effects.lines().count(), 1, "add ran once before the crash: {effects}");

    let resumed = crash_child(dir.path(), &python, false).output().expect("run the child again");
    assert!(resumed.status.success(), "the resumed child failed: {resumed:?}");
    let line = String::from_utf8(resumed.stdout).unwrap();
    let out: Value = serde_json::from_str(line.lines().last().expect("a JSON line")).unwrap();
    assert_eq!(out["status"], "finished", "{out}");
    assert_eq!(out["text"], "Added and checked.");
    let results = out["results"].as_array().unwrap();
    assert_eq!(results[0], json!({"name": "add", "result": {"result": 5}, "is_error": false, "replayed": true}));
    assert_eq!(results[1]["name"], "checkpoint");
    assert_eq!(results[1]["replayed"], false);

    let effects = std::fs::read_to_string(dir.path().join("effects.log")).unwrap();
    assert_eq!(effects.lines().count(), 1, "the server must not run `add` again: {effects}");
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let steps = runtime.block_on(SqliteStore::open(dir.path().join("runs.db")).unwrap().steps("mcp-run-1")).unwrap();
    let add = steps.iter().find(|s| s.kind == StepKind::Tool && s.name == "add").expect("a journal step for add");
    assert_eq!(add.status, StepStatus::Finished);
    assert_eq!(effects.trim_end(), format!("add\t{}", add.key), "the server saw the journal's idempotency key");
}
