//! `#[tool]` fns through the runtime: `on_error` recovery and where it is not called
//! (timeout, cancellation, invalid input), and streaming progress events before the result.

use std::{
    sync::atomic::{AtomicUsize, Ordering},
    time::Duration,
};

use futures::StreamExt;
use kuralle::{
    Event, RunStatus, Runtime, ToolContext, agent, progress,
    testing::{ScriptedModel, Turn},
    tool,
};
use kuralle_tests::tool_results as results;
use serde_json::json;

static RECOVERIES: AtomicUsize = AtomicUsize::new(0);
/// Serializes the tests that count recoveries.
static COUNTING: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// Why a lookup failed.
#[derive(Debug)]
pub struct StockError(String);

impl std::fmt::Display for StockError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

fn recover(error: StockError, input: &CheckStockInput) -> Result<serde_json::Value, StockError> {
    RECOVERIES.fetch_add(1, Ordering::SeqCst);
    Ok(json!({"sku": input.sku, "available": null, "reason": error.to_string()}))
}

/// Check warehouse stock.
#[tool(on_error = recover, timeout = "100ms")]
async fn check_stock(
    /// Stock-keeping unit.
    sku: String,
    ctx: &ToolContext,
) -> Result<serde_json::Value, StockError> {
    match sku.as_str() {
        "broken" => Err(StockError("upstream 503".into())),
        "slow" => {
            // Cooperative: stops when the timeout fires, with an error of its own that must
            // not reach `on_error`.
            ctx.cancellation().cancelled().await;
            Err(StockError("aborted".into()))
        }
        _ => Ok(json!({"sku": sku, "available": 3})),
    }
}

/// Run a migration, reporting progress.
#[tool]
async fn migrate(
    /// Table name.
    table: String,
) -> String {
    for batch in 1..=3u32 {
        progress!(json!({"table": table, "migrated": batch * 100}));
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    format!("migrated {table}")
}

/// Warehouse assistant.
#[agent(id = "warehouse", tools = [CheckStock, Migrate])]
struct Warehouse;

async fn drain(runtime: &Runtime) -> (Vec<Event>, kuralle::RunOutput) {
    let mut handle = runtime.run("go");
    let mut events = Vec::new();
    while let Some(e) = handle.next().await {
        events.push(e);
    }
    (events, handle.await.unwrap())
}

#[tokio::test]
async fn on_error_recovers_failures_only() {
    let model = ScriptedModel::new([
        Turn::tool_calls([
            ("ok", "check_stock", r#"{"sku":"A1"}"#),
            ("broken", "check_stock", r#"{"sku":"broken"}"#),
            ("slow", "check_stock", r#"{"sku":"slow"}"#),
            ("invalid", "check_stock", r#"{"sku":42}"#),
        ]),
        Turn::text("ok"),
    ]);
    let runtime = Runtime::builder().agent(Warehouse).model(model).build().unwrap();
    let _counting = COUNTING.lock().await;
    let before = RECOVERIES.load(Ordering::SeqCst);
    let (events, out) = drain(&runtime).await;
    assert_eq!(out.status, RunStatus::Finished);
    let r = results(&events);
    assert_eq!(r[0], ("ok".into(), json!({"sku": "A1", "available": 3}), false));
    // A genuine failure becomes the recovered value, a success for the model.
    assert_eq!(r[1], ("broken".into(), json!({"sku": "broken", "available": null, "reason": "upstream 503"}), false));
    // A timeout is a fact about the run: not passed to `on_error`.
    assert!(r[2].2);
    assert_eq!(r[2].1["kind"], "timeout");
    // Invalid input never reaches the tool, nor `on_error`.
    assert!(r[3].2);
    assert_eq!(r[3].1["kind"], "invalid_input");
    assert!(r[3].1["message"].as_str().unwrap().contains("sku"));
    assert_eq!(RECOVERIES.load(Ordering::SeqCst) - before, 1);
}

#[tokio::test]
async fn on_error_is_not_called_for_an_interrupted_call() {
    let model = ScriptedModel::new([Turn::tool_calls([("slow", "check_stock", r#"{"sku":"slow"}"#)]), Turn::text("x")]);
    let runtime = Runtime::builder().agent(Warehouse).model(model).build().unwrap();
    let _counting = COUNTING.lock().await;
    let before = RECOVERIES.load(Ordering::SeqCst);
    let mut handle = runtime.run("go");
    let mut events = Vec::new();
    while let Some(e) = handle.next().await {
        if matches!(e, Event::ToolCall { .. }) {
            handle.interrupt();
        }
        events.push(e);
    }
    let out = handle.await.unwrap();
    assert_eq!(out.status, RunStatus::Interrupted);
    assert_eq!(results(&events)[0].1["kind"], "cancelled");
    assert_eq!(RECOVERIES.load(Ordering::SeqCst), before);
}

#[tokio::test]
async fn streaming_progress_arrives_live_before_the_result() {
    let model = ScriptedModel::new([Turn::tool_calls([("m1", "migrate", r#"{"table":"users"}"#)]), Turn::text("done")]);
    let seen = model.clone();
    let runtime = Runtime::builder().agent(Warehouse).model(model).build().unwrap();
    let (events, _) = drain(&runtime).await;
    let stream: Vec<_> = events
        .iter()
        .filter_map(|e| match e {
            Event::ToolProgress { call_id, value, .. } => Some(format!("progress {call_id} {}", value["migrated"])),
            Event::ToolResult { call_id, result, .. } => Some(format!("result {call_id} {result}")),
            _ => None,
        })
        .collect();
    assert_eq!(stream, ["progress m1 100", "progress m1 200", "progress m1 300", "result m1 \"migrated users\""]);
    // Only the return value reaches the model.
    let last = seen.requests().pop().unwrap();
    assert_eq!(
        last.messages.last().unwrap(),
        &kuralle::Message::Tool { call_id: "m1".into(), name: "migrate".into(), content: json!("migrated users") }
    );
}
