//! A run limit stopping a run mid-way, offline: the agent may make four tool calls; the model
//! asks for two, then for three more. The second batch would pass the cap, so none of its
//! calls runs: the run ends `limit_exceeded` with an event naming the cap, what was used and
//! the maximum. Prices make the run's cost visible too.
//!
//! ```text
//! cargo run -p kuralle-examples --example limits
//! ```
//!
//! See docs/limits.md for the rules.

use std::sync::atomic::{AtomicUsize, Ordering};

use futures::StreamExt;
use kuralle::{
    AgentDef, Event, Pricing, RunLimits, RunRequest, Runtime, StepKind,
    testing::{ScriptedModel, Turn},
    tool,
};

/// How many times `lookup`'s body ran: the proof that the refused batch ran nothing.
static LOOKUPS: AtomicUsize = AtomicUsize::new(0);

/// Look up a city's weather.
#[tool(parallel_safe)]
async fn lookup(
    /// The city.
    city: String,
) -> String {
    LOOKUPS.fetch_add(1, Ordering::SeqCst);
    format!("sunny in {city}")
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let agent = AgentDef::new("planner", "Check the weather.")
        .tool(Lookup)
        .limits(RunLimits::new().max_tool_calls(4).max_cost_usd(1.00));
    let runtime = Runtime::builder()
        .agent(agent)
        .model(ScriptedModel::new([
            Turn::tool_calls([("c1", "lookup", r#"{"city":"Oslo"}"#), ("c2", "lookup", r#"{"city":"Rome"}"#)]),
            Turn::tool_calls([
                ("c3", "lookup", r#"{"city":"Lima"}"#),
                ("c4", "lookup", r#"{"city":"Pune"}"#),
                ("c5", "lookup", r#"{"city":"Kyiv"}"#),
            ]),
            Turn::text("All sunny."),
        ]))
        // A dollar cap needs the model's price (`build()` refuses it otherwise).
        .pricing("scripted", Pricing::new(3.0, 15.0))
        .build()?;

    // The request can only tighten the agent's limits: 10 requests is within any run here.
    let mut handle = runtime
        .run(RunRequest::new("Weather in five cities?").run_id("trip").limits(RunLimits::new().max_requests(10)));
    while let Some(event) = handle.next().await {
        match event {
            Event::ToolBatchStart { calls } => {
                println!("batch starts: {}", calls.iter().map(|c| c.call_id.as_str()).collect::<Vec<_>>().join(", "))
            }
            Event::ToolResult { call_id, result, .. } => println!("  {call_id} -> {result}"),
            Event::LimitExceeded { limit, used, max, .. } => {
                println!("limit exceeded: {limit} (used {used} of {max} {})", limit.unit());
                let event = Event::LimitExceeded { run_id: "trip".into(), limit, used, max };
                println!("  event: {}", serde_json::to_string(&event)?);
            }
            _ => {}
        }
    }
    match handle.await {
        Ok(out) => println!("finished: {}", out.text),
        Err(e) => println!("run ended: {e}"),
    }

    let record = runtime.get_run("trip").await?.expect("the run is recorded");
    let journal = runtime.journal("trip").await?;
    let tool_steps = journal.iter().filter(|s| s.kind == StepKind::Tool).count();
    let cost: f64 = journal
        .iter()
        .filter(|s| s.kind == StepKind::Model)
        .filter_map(|s| s.result.as_ref()?.decode::<serde_json::Value>().ok()?["cost_usd"].as_f64())
        .sum();
    println!("status: {}", record.status.as_str());
    println!("lookup ran {} times; {tool_steps} tool calls journaled", LOOKUPS.load(Ordering::SeqCst));
    println!("the second batch (c3, c4, c5) would have made 2 + 3 > 4 calls: none of it ran");
    println!("the run cost ${cost:.6} (priced at $3 / $15 per million input / output tokens)");
    Ok(())
}
