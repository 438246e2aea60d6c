//! The child process of the instance tests (`tests/tests/instance.rs`): a runtime with an
//! instance id and a one-hour lease TTL, on the store `STORE` (`sqlite:PATH` or
//! `postgres:SCHEMA`, with `DATABASE_URL`).
//!
//! Environment: `STORE`, `INSTANCE_ID`, `EFFECTS` (the effect log: one `tool\tpid` line per
//! execution), `RUN_ID`, and `MODE`:
//! - `run`: runs `RUN_ID`; the agent calls `step_one`, then `block`, then answers `Done.`.
//!   `block` prints `MARK blocked` and waits to be killed when `BLOCK=1`.
//! - `recover`: `runtime.recover()`, then prints one JSON line: `{"taken_back": [..],
//!   "resumed": [{"run_id", "status", "text"} | {"run_id", "error"}]}`.
//! - `hold`: claims the instance (`recover`), prints `MARK claimed`, and waits to be killed.
//!
//! Any run error is printed as `{"error": "instance_in_use" | "busy" | "other", "message"}`.

use std::{io::Write, time::Duration};

use kuralle::{AgentDef, RunError, RunRequest, Runtime, testing::ScriptedModel, testing::Turn};
use kuralle_tests::FnTool;
use serde_json::json;

fn say(line: &str) {
    let mut out = std::io::stdout().lock();
    writeln!(out, "{line}").ok();
    out.flush().ok();
}

fn effect(tool: &str) {
    let path = std::env::var("EFFECTS").expect("EFFECTS");
    let mut f = std::fs::OpenOptions::new().create(true).append(true).open(path).expect("effects file");
    writeln!(f, "{tool}\t{}", std::process::id()).expect("write effect");
    f.sync_data().expect("fsync effect");
}

fn error_line(e: &RunError) -> String {
    let kind = match e {
        RunError::InstanceInUse { .. } => "instance_in_use",
        RunError::Busy { .. } => "busy",
        _ => "other",
    };
    json!({"error": kind, "message": e.to_string()}).to_string()
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let store = kuralle_tests::workers::open_store(&std::env::var("STORE").expect("STORE")).await;
    let block = std::env::var("BLOCK").is_ok_and(|v| v == "1");
    let step_one = FnTool::new("step_one", |_, _| async {
        effect("step_one");
        Ok(json!("one"))
    });
    let blocker = FnTool::new("block", move |_, _| async move {
        effect("block");
        if block {
            say("MARK blocked");
            std::future::pending::<()>().await;
        }
        Ok(json!("unblocked"))
    });
    let model = ScriptedModel::by_transcript([
        Turn::tool_calls([("call_1", "step_one", "{}")]),
        Turn::tool_calls([("call_2", "block", "{}")]),
        Turn::text("Done."),
    ]);
    let runtime = Runtime::builder()
        .agent(AgentDef::new("app", "Do both steps.").tool(step_one).tool(blocker))
        .model(model)
        .store_arc(store)
        .instance_id(std::env::var("INSTANCE_ID").expect("INSTANCE_ID"))
        .lease_ttl(Duration::from_secs(3600))
        .build()
        .expect("runtime");
    match std::env::var("MODE").as_deref() {
        Ok("run") => {
            let run_id = std::env::var("RUN_ID").expect("RUN_ID");
            match runtime.run(RunRequest::new("Do it.").run_id(run_id)).await {
                Ok(out) => say(&json!({"status": out.status.as_str(), "text": out.text}).to_string()),
                Err(e) => say(&error_line(&e)),
            }
        }
        Ok("recover") => match runtime.recover().await {
            Ok(recovered) => {
                let resumed: Vec<_> = recovered
                    .resumed
                    .iter()
                    .map(|run| match &run.result {
                        Ok(out) => json!({"run_id": run.run_id, "status": out.status.as_str(), "text": out.text}),
                        Err(e) => json!({"run_id": run.run_id, "error": e.to_string()}),
                    })
                    .collect();
                say(&json!({"taken_back": recovered.taken_back, "resumed": resumed}).to_string());
            }
            Err(e) => say(&error_line(&e)),
        },
        Ok("hold") => match runtime.recover().await {
            Ok(_) => {
                say("MARK claimed");
                std::future::pending::<()>().await;
            }
            Err(e) => say(&error_line(&e)),
        },
        other => panic!("unknown MODE {other:?}"),
    }
}
