//! The child process of the crash tests (`tests/tests/crash.rs`): runs a payment agent on a
//! `SqliteStore`, and when `CRASH_AT` names a boundary of the `CRASH_TOOL` call, prints
//! `MARK <boundary>` and stops there so the parent can SIGKILL it at exactly that point.
//!
//! Environment: `DB` (store path), `EFFECTS` (external effect log), `RUN_ID`, and optionally
//! `CRASH_AT` (`before_intent`, `after_intent`, `in_execute`, `before_result`,
//! `after_result`) with `CRASH_TOOL` (`charge` or `ship`). On completion it prints one JSON
//! line: `{"status", "text", "results": [[call_id, result, is_error], ...]}`.

use std::{
    collections::HashSet,
    io::Write,
    sync::{Arc, Mutex},
};

use futures::StreamExt;
use kuralle::{
    Event, NewStep, RunFilter, RunRecord, RunRequest, RunStore, RunSummary, Runtime, StepKind, StepOutcome, StepRecord,
    StoreFuture, ToolContext, agent,
    stores::SqliteStore,
    testing::{ScriptedModel, Turn},
    tool,
};
use serde_json::json;

fn crash_at() -> Option<(String, String)> {
    Some((std::env::var("CRASH_AT").ok()?, std::env::var("CRASH_TOOL").ok()?))
}

/// Prints the marker and waits to be killed.
async fn stop_here(boundary: &str) {
    println!("MARK {boundary}");
    std::io::stdout().flush().ok();
    std::future::pending::<()>().await;
}

/// Appends one line per execution to the external effect log, durably.
fn effect(tool: &str, key: &str, what: &str) {
    let path = std::env::var("EFFECTS").expect("EFFECTS");
    let mut f = std::fs::OpenOptions::new().create(true).append(true).open(path).expect("effects file");
    writeln!(f, "{tool}\t{key}\t{what}").expect("write effect");
    f.sync_data().expect("fsync effect");
}

async fn maybe_stop_in_execute(tool: &str) {
    if let Some((at, t)) = crash_at()
        && at == "in_execute"
        && t == tool
    {
        stop_here("in_execute").await;
    }
}

/// Charge a card; the payment provider dedupes on the idempotency key.
#[tool]
async fn charge(
    /// Amount in cents.
    amount: u64,
    ctx: &ToolContext,
) -> serde_json::Value {
    effect("charge", ctx.idempotency_key(), &amount.to_string());
    maybe_stop_in_execute("charge").await;
    json!({"charged": amount, "receipt": &ctx.idempotency_key()[..12]})
}

/// Ship an order. Not idempotent on the carrier's side, so never retried blindly.
#[tool(at_most_once)]
async fn ship(
    /// Order number.
    order: u64,
    ctx: &ToolContext,
) -> serde_json::Value {
    effect("ship", ctx.idempotency_key(), &order.to_string());
    maybe_stop_in_execute("ship").await;
    json!({"shipped": order})
}

/// Take payment, then ship.
#[agent(id = "shop", tools = [Charge, Ship])]
struct Shop;

/// Stops at the configured boundary of the first journal write of the configured tool.
struct HookStore {
    inner: SqliteStore,
    target: Option<(String, String)>,
    watched: Mutex<HashSet<u64>>,
}

impl HookStore {
    fn armed(&self, boundary: &str) -> bool {
        self.target.as_ref().is_some_and(|(at, _)| at == boundary)
    }
}

impl RunStore for HookStore {
    fn create_run(&self, run: RunRecord) -> StoreFuture<'_, ()> {
        self.inner.create_run(run)
    }
    fn get_run<'a>(&'a self, run_id: &'a str) -> StoreFuture<'a, Option<RunRecord>> {
        self.inner.get_run(run_id)
    }
    fn put_run(&self, run: RunRecord) -> StoreFuture<'_, u64> {
        self.inner.put_run(run)
    }
    fn list_runs(&self, filter: RunFilter) -> StoreFuture<'_, Vec<RunSummary>> {
        self.inner.list_runs(filter)
    }
    fn delete_run<'a>(&'a self, run_id: &'a str) -> StoreFuture<'a, bool> {
        self.inner.delete_run(run_id)
    }
    fn append_steps<'a>(&'a self, run_id: &'a str, steps: Vec<NewStep>) -> StoreFuture<'a, Vec<u64>> {
        Box::pin(async move {
            let positions: Vec<usize> = steps
                .iter()
                .enumerate()
                .filter(|(_, s)| {
                    s.kind == StepKind::Tool && self.target.as_ref().is_some_and(|(_, tool)| *tool == s.name)
                })
                .map(|(i, _)| i)
                .collect();
            let hit = !positions.is_empty();
            if hit && self.armed("before_intent") {
                stop_here("before_intent").await;
            }
            let ordinals = self.inner.append_steps(run_id, steps).await?;
            if hit {
                self.watched.lock().unwrap().extend(positions.iter().map(|&i| ordinals[i]));
                if self.armed("after_intent") {
                    stop_here("after_intent").await;
                }
            }
            Ok(ordinals)
        })
    }
    fn finish_step<'a>(
        &'a self,
        run_id: &'a str,
        ordinal: u64,
        outcome: StepOutcome,
        finished_at_ms: i64,
    ) -> StoreFuture<'a, ()> {
        Box::pin(async move {
            let hit = self.watched.lock().unwrap().contains(&ordinal);
            if hit && self.armed("before_result") {
                stop_here("before_result").await;
            }
            self.inner.finish_step(run_id, ordinal, outcome, finished_at_ms).await?;
            if hit && self.armed("after_result") {
                stop_here("after_result").await;
            }
            Ok(())
        })
    }
    fn steps<'a>(&'a self, run_id: &'a str) -> StoreFuture<'a, Vec<StepRecord>> {
        self.inner.steps(run_id)
    }
}

#[tokio::main]
async fn main() {
    let db = std::env::var("DB").expect("DB");
    let run_id = std::env::var("RUN_ID").expect("RUN_ID");
    let store = HookStore {
        inner: SqliteStore::open(&db).expect("open store"),
        target: crash_at(),
        watched: Mutex::new(HashSet::new()),
    };
    // Answers are a function of the transcript, so a resumed process (whose earlier model
    // responses replay from the journal) sees the same conversation as an uninterrupted one.
    let model = ScriptedModel::by_transcript([
        Turn::tool_calls([("call_a", "charge", r#"{"amount":100}"#), ("call_b", "charge", r#"{"amount":250}"#)]),
        Turn::tool_calls([("call_c", "ship", r#"{"order":7}"#)]),
        Turn::text("Paid and shipped."),
    ]);
    let runtime = Runtime::builder().agent(Shop).model(model).store_arc(Arc::new(store)).build().expect("runtime");
    let mut handle = runtime.run(RunRequest::new("Buy the thing").run_id(run_id));
    let mut results = Vec::new();
    while let Some(event) = handle.next().await {
        if let Event::ToolResult { call_id, result, is_error, .. } = event {
            results.push(json!([call_id, result, is_error]));
        }
    }
    let out = handle.await.expect("run completes");
    println!("{}", json!({"status": out.status.as_str(), "text": out.text, "results": results}));
}
