//! A recorded run becomes a regression test.
//!
//! 1. "Production": a support agent answers from a SQLite store; the run is exported to a file
//!    (what `kuralle runs export RUN_ID -o incident.json` writes).
//! 2. "A later build": the lookup tool regressed. Replaying the file against it answers every
//!    model request with the recorded response and reports where the new build differs.
//! 3. The fixed build replays with no difference.
//!
//! ```sh
//! cargo run -p kuralle-examples --example replay
//! ```

use kuralle::{
    AgentDef, Runtime, ToolError,
    export::RunExport,
    stores::SqliteStore,
    testing::{Replay, ScriptedModel, Turn},
    tool,
};

/// Look up an order's status.
#[tool(parallel_safe)]
async fn order_status(order: String) -> String {
    format!("{order}: shipped on Monday")
}

/// The same tool in a build where the lookup regressed.
#[tool(name = "order_status", parallel_safe)]
async fn order_status_regressed(order: String) -> Result<String, ToolError> {
    Err(ToolError::failed("order_status", format!("no order {order}")))
}

fn agent() -> AgentDef {
    AgentDef::new("support", "Answer questions about orders.").tool(OrderStatus)
}

async fn replay(file: &std::path::Path, agent: AgentDef) -> Result<(), Box<dyn std::error::Error>> {
    let export = RunExport::from_json(&std::fs::read_to_string(file)?)?;
    let replay = Replay::from_export(&export)?;
    let runtime = Runtime::builder().agent(agent).model(replay.clone()).build()?;
    for input in replay.inputs() {
        let out = runtime.run(input.as_str()).await?;
        println!("  answer: {}", out.text);
    }
    match replay.check() {
        Ok(()) => println!("  no divergence: {} recorded responses played", replay.played()),
        Err(diverged) => println!("  {diverged}"),
    }
    Ok(())
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let dir = std::env::temp_dir().join(format!("kuralle-replay-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let file = dir.join("incident.json");

    println!("1. a run in production, exported to {}", file.display());
    let production = Runtime::builder()
        .agent(agent())
        .model(ScriptedModel::new([
            Turn::tool_calls([("c1", "order_status", r#"{"order":"A-17"}"#)]),
            Turn::text("Order A-17 shipped on Monday."),
        ]))
        .store(SqliteStore::open(dir.join("runs.db"))?)
        .build()?;
    let run_id = production.run("Where is order A-17?").await?.run_id;
    let export = RunExport::from_store(production.store().as_ref(), &run_id).await?;
    std::fs::write(&file, export.to_json())?;

    println!("2. replayed against a build whose lookup regressed");
    replay(&file, AgentDef::new("support", "Answer questions about orders.").tool(OrderStatusRegressed)).await?;

    println!("3. replayed against the fixed build");
    replay(&file, agent()).await?;
    std::fs::remove_dir_all(&dir)?;
    Ok(())
}
