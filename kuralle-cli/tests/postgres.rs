//! `kuralle runs ...` over a real PostgreSQL store (feature `postgres`; reads `DATABASE_URL`,
//! skipped with a notice without it).

#![cfg(feature = "postgres")]

mod common;

use std::sync::Arc;

use kuralle::{
    AgentDef, RunRequest, RunStatus, Runtime,
    stores::PostgresStore,
    testing::{ScriptedModel, Turn},
    tool,
};
use serde_json::Value;

/// Send money.
#[tool(needs_approval)]
async fn wire(amount: f64) -> String {
    format!("wired {amount}")
}

fn json(args: &[&str]) -> Value {
    let out = common::kuralle(args);
    assert!(out.status.success(), "{args:?}: {}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).unwrap()
}

#[tokio::test]
async fn list_show_and_approve_over_postgres() {
    let Ok(url) = std::env::var("DATABASE_URL") else {
        eprintln!("SKIPPED postgres CLI test: DATABASE_URL is not set");
        return;
    };
    let store = Arc::new(PostgresStore::connect(&url).await.unwrap());
    // The database is shared: this test's runs have an agent and ids of their own.
    let agent = format!("cli-pg-{}", std::process::id());
    let run_id = format!("{agent}-run");
    let rt = Runtime::builder()
        .agent(AgentDef::new(agent.clone(), "Move money.").tool(Wire))
        .model(ScriptedModel::by_transcript([
            Turn::tool_calls([("c1", "wire", r#"{"amount":900}"#)]),
            Turn::text("Wired."),
        ]))
        .store_arc(store)
        .build()
        .unwrap();
    assert_eq!(rt.run(RunRequest::new("wire").run_id(&run_id)).await.unwrap().status, RunStatus::Paused);

    let list = json(&["runs", "list", "--store", &url, "--agent", &agent, "--json"]);
    assert_eq!(list[0]["run_id"], run_id.as_str());
    assert_eq!(list[0]["pending_approvals"], 1);
    let run = json(&["runs", "show", &run_id, "--store", &url, "--json"]);
    let request = run["pending"][0]["request_id"].as_str().unwrap().to_owned();
    json(&["runs", "approve", &run_id, &request, "--by", "alice", "--store", &url, "--json"]);

    let out = rt.resume(&run_id).await.unwrap();
    assert_eq!(out.status, RunStatus::Finished);
    let run = json(&["runs", "show", &run_id, "--store", &url, "--json"]);
    assert!(run["steps"].as_array().unwrap().iter().any(|s| s["kind"] == "approval" && s["result"]["by"] == "alice"));
    // Timed by the database server's clock (the lease's grant), not the CLI's.
    let audit = &run["decisions"][0];
    assert_eq!((audit["clock"].as_str(), audit["channel"].as_str()), (Some("store"), Some("cli")));
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_millis() as i64;
    assert!((audit["at_ms"].as_i64().unwrap() - now).abs() < 60_000, "{audit}");
    rt.store().delete_run(&run_id).await.unwrap();
}
