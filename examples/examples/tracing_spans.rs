//! Prints the spans a run emits — `invoke_agent`, `chat` and `execute_tool`, with the
//! OpenTelemetry GenAI attributes (`gen_ai.tool.name`, `gen_ai.tool.call.id`, ...) beside
//! `run_id`, `replayed`, `outcome` and `duration_ms` — using `tracing-subscriber`'s
//! formatter, one line per span as it closes (examples/otel.rs exports them to
//! OpenTelemetry instead). A policy asks before `refund`, so the run pauses; approving it
//! resumes the run, and the spans of the resumed turn show what was replayed.
//!
//! ```text
//! cargo run -p kuralle-examples --example tracing_spans
//! ```

use std::error::Error;

use kuralle::{
    Decision, Policy, RunRequest, Runtime, agent,
    testing::{ScriptedModel, Turn},
    tool,
};
use tracing_subscriber::fmt::format::FmtSpan;

/// Look up an order.
#[tool(parallel_safe)]
async fn lookup_order(order: String) -> String {
    format!("{order}: delivered, 120.00 EUR")
}

/// Refund an order.
#[tool]
async fn refund(order: String, amount: f64) -> String {
    format!("refunded {amount} on {order}")
}

fn policy() -> Policy {
    Policy::new().ask_when("refund", |args| args["amount"].as_f64().is_some_and(|a| a > 100.0))
}

/// You handle refunds.
#[agent(id = "support", tools = [LookupOrder, Refund], policy = policy())]
struct Support;

#[tokio::main]
async fn main() -> Result<(), Box<dyn Error>> {
    tracing_subscriber::fmt().with_span_events(FmtSpan::CLOSE).with_target(false).without_time().init();

    let model = ScriptedModel::by_transcript([
        Turn::tool_calls([("call_1", "lookup_order", r#"{"order":"A-17"}"#)]),
        Turn::tool_calls([("call_2", "refund", r#"{"order":"A-17","amount":120}"#)]),
        Turn::text("Refunded 120.00 EUR."),
    ]);
    let runtime = Runtime::builder().agent(Support).model(model).build()?;

    let paused = runtime.run(RunRequest::new("Refund order A-17").run_id("refund-a17")).await?;
    println!("first turn: {:?}", paused.status);
    let done = runtime.deliver("refund-a17", Decision::approve("alice")).await?;
    println!("after approval: {:?}: {}", done.status, done.text);
    Ok(())
}
