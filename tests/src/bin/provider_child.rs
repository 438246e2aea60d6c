//! The child process of the provider crash tests (`tests/tests/provider_crash.rs`): runs a
//! one-tool agent on a `SqliteStore` against a model client of one wire, pointed at the
//! parent's scripted server.
//!
//! Environment: `WIRE` (`chat`, `anthropic`, `gemini`, `responses`), `ORIGIN` (the server,
//! `http://127.0.0.1:PORT`), `DB` (store path), `RUN_ID`, and `CRASH=1` to stop inside the
//! first tool call (printing `MARK in_tool`) until the parent kills the process. On completion
//! the child prints one JSON line: `{"status", "text"}` or `{"error"}`.

use std::{io::Write, sync::Arc, time::Duration};

use kuralle::{AgentDef, Model, RunRequest, Runtime, stores::SqliteStore};
use kuralle_tests::FnTool;
use serde_json::json;

fn say(line: &str) {
    let mut out = std::io::stdout().lock();
    writeln!(out, "{line}").ok();
    out.flush().ok();
}

fn model(wire: &str, origin: &str) -> Arc<dyn Model> {
    let fast = (Duration::from_millis(1), Duration::from_millis(2));
    match wire {
        "chat" => Arc::new(
            kuralle::models::OpenAi::builder()
                .base_url(format!("{origin}/v1"))
                .model("deepseek-reasoner")
                .retry_backoff(fast.0, fast.1)
                .build()
                .expect("chat client"),
        ),
        "responses" => Arc::new(
            kuralle::models::OpenAiResponses::builder()
                .base_url(format!("{origin}/v1"))
                .model("o4-mini")
                .reasoning_effort("medium")
                .retry_backoff(fast.0, fast.1)
                .build()
                .expect("responses client"),
        ),
        "anthropic" => Arc::new(
            kuralle::models::Anthropic::builder()
                .base_url(origin)
                .api_key("sk-ant-test")
                .model("claude-sonnet-4-5")
                .max_tokens(8192)
                .thinking(2048)
                .retry_backoff(fast.0, fast.1)
                .build()
                .expect("anthropic client"),
        ),
        "gemini" => Arc::new(
            kuralle::models::Gemini::builder()
                .base_url(origin)
                .api_key("AIza-test")
                .model("gemini-2.5-flash")
                .thinking_budget(-1)
                .retry_backoff(fast.0, fast.1)
                .build()
                .expect("gemini client"),
        ),
        other => panic!("unknown WIRE {other}"),
    }
}

#[tokio::main]
async fn main() {
    let wire = std::env::var("WIRE").expect("WIRE");
    let origin = std::env::var("ORIGIN").expect("ORIGIN");
    let run_id = std::env::var("RUN_ID").expect("RUN_ID");
    let crash = std::env::var("CRASH").is_ok_and(|v| v == "1");
    let store = SqliteStore::open(std::env::var("DB").expect("DB")).expect("store");
    let lookup = FnTool::new("lookup", move |args, _| async move {
        if crash {
            say("MARK in_tool");
            std::future::pending::<()>().await;
        }
        Ok(json!({"order": args["order"], "total": 900}))
    })
    .parallel();
    let runtime = Runtime::builder()
        .agent(AgentDef::new("shop", "Look orders up.").tool(lookup))
        .model_arc(model(&wire, &origin))
        .store(store)
        .lease_ttl(Duration::from_millis(300))
        .build()
        .expect("runtime");
    // A restarted process waits for the killed one's lease to expire.
    let request = RunRequest::new("What do A-1 and B-2 total?").run_id(run_id).wait_for_lease(Duration::from_secs(10));
    match runtime.run(request).await {
        Ok(out) => say(&json!({"status": format!("{:?}", out.status), "text": out.text}).to_string()),
        Err(e) => say(&json!({"error": e.to_string()}).to_string()),
    }
}
