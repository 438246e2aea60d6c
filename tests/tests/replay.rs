//! A recorded run becomes a test: `RunExport` of a run written by one runtime, played back by
//! `Replay` into another, with every request compared with the recorded one.

use kuralle::{
    AgentDef, Part, RunRequest, RunStatus, Runtime, ToolError,
    export::RunExport,
    stores::SqliteStore,
    testing::{Divergence, Replay, ScriptedModel, Turn},
    tool,
};
use serde_json::json;

/// Look up an order's status.
#[tool]
async fn order_status(order: String) -> String {
    format!("{order}: shipped")
}

/// Look up an order's status (a build where the lookup regressed).
#[tool(name = "order_status")]
async fn order_status_broken(order: String) -> Result<String, ToolError> {
    Err(ToolError::failed("order_status", format!("{order}: not found")))
}

/// Cancel an order.
#[tool]
async fn cancel_order(order: String) -> String {
    format!("{order}: cancelled")
}

/// A long report.
#[tool]
async fn report() -> String {
    "line of the report\n".repeat(400)
}

fn agent() -> AgentDef {
    AgentDef::new("support", "Answer about orders.").tool(OrderStatus)
}

fn two_lookups() -> ScriptedModel {
    ScriptedModel::new([
        Turn::tool_calls([("c1", "order_status", r#"{"order":"A1"}"#), ("c2", "order_status", r#"{"order":"B2"}"#)])
            .with_part(Part::Reasoning {
                text: "Look both up.".into(),
                summary: vec![],
                signature: Some("sig-1".into()),
                encrypted: None,
                id: None,
            }),
        Turn::text("A1 and B2 have shipped."),
    ])
}

async fn record(agent: AgentDef, model: ScriptedModel, inputs: &[&str]) -> RunExport {
    let runtime = Runtime::builder().agent(agent).model(model).build().unwrap();
    for input in inputs {
        // A failed turn (the model's error) is part of what a recording can hold.
        let _ = runtime.run(RunRequest::new(*input).run_id("recorded")).await;
    }
    RunExport::from_store(runtime.store().as_ref(), "recorded").await.unwrap()
}

#[tokio::test]
async fn a_recorded_run_replays_with_the_same_answers_and_no_divergence() {
    let export = record(agent(), two_lookups(), &["Where are A1 and B2?"]).await;
    // Through the file a user would keep beside the test.
    let export = RunExport::from_json(&export.to_json()).unwrap();
    let replay = Replay::from_export(&export).unwrap();
    assert_eq!(replay.inputs(), ["Where are A1 and B2?"]);
    assert_eq!(replay.recorded(), 2);

    let runtime = Runtime::builder().agent(agent()).model(replay.clone()).build().unwrap();
    let out = runtime.run(replay.inputs()[0].as_str()).await.unwrap();
    assert_eq!(out.text, "A1 and B2 have shipped.");
    assert_eq!(out.status, RunStatus::Finished);
    replay.check().unwrap();

    // The replayed responses were journaled part for part, provider state included.
    let replayed = RunExport::from_store(runtime.store().as_ref(), &out.run_id).await.unwrap();
    let models = |e: &RunExport| -> Vec<serde_json::Value> {
        e.steps
            .iter()
            .filter(|s| s.name == "model")
            .map(|s| s.result.as_ref().unwrap().decode::<serde_json::Value>().unwrap()["parts"].clone())
            .collect()
    };
    assert_eq!(models(&replayed), models(&export));
    assert_eq!(models(&replayed)[0][0]["signature"], "sig-1");
}

#[tokio::test]
async fn a_tool_that_now_answers_differently_is_reported() {
    let export = record(agent(), two_lookups(), &["Where are A1 and B2?"]).await;
    let replay = Replay::from_export(&export).unwrap();
    let broken = AgentDef::new("support", "Answer about orders.").tool(OrderStatusBroken);
    let runtime = Runtime::builder().agent(broken).model(replay.clone()).build().unwrap();
    runtime.run(replay.inputs()[0].as_str()).await.unwrap();

    let divergences = replay.check().unwrap_err().0;
    assert_eq!(divergences.len(), 2, "{divergences:?}");
    let Divergence::ToolResult { request, call_id, name, recorded, sent } = &divergences[0] else {
        panic!("{divergences:?}")
    };
    assert_eq!((*request, call_id.as_str(), name.as_str()), (1, "c1", "order_status"));
    assert_eq!(recorded, &json!("A1: shipped"));
    assert_eq!(sent.as_ref().unwrap()["error"], true);
    let message = replay.check().unwrap_err().to_string();
    assert!(message.contains("`order_status` (c2) returned"), "{message}");
}

#[tokio::test]
async fn other_tools_offered_are_reported_per_request() {
    let export = record(agent(), two_lookups(), &["Where are A1 and B2?"]).await;
    let replay = Replay::from_export(&export).unwrap();
    let runtime = Runtime::builder().agent(agent().tool(CancelOrder)).model(replay.clone()).build().unwrap();
    runtime.run(replay.inputs()[0].as_str()).await.unwrap();
    let divergences = replay.divergences();
    assert_eq!(
        divergences,
        [0, 1].map(|request| Divergence::ToolsOffered { request, missing: vec![], added: vec!["cancel_order".into()] })
    );
}

#[tokio::test]
async fn a_run_that_asks_more_or_less_than_the_recording_is_reported() {
    // Recorded: the model failed on its second request, so one response was journaled.
    let failing = ScriptedModel::new([
        Turn::tool_calls([("c1", "order_status", r#"{"order":"A1"}"#)]),
        Turn::error("overloaded"),
    ]);
    let export = record(agent(), failing, &["Where is A1?"]).await;
    let replay = Replay::from_export(&export).unwrap();
    assert_eq!(replay.recorded(), 1);
    let runtime = Runtime::builder().agent(agent()).model(replay.clone()).build().unwrap();
    let err = runtime.run(replay.inputs()[0].as_str()).await.unwrap_err();
    assert!(err.to_string().contains("no turn left"), "{err}");
    assert_eq!(replay.check().unwrap_err().0, [Divergence::ExtraRequest { request: 1 }]);

    // A test agent that stops after one step leaves a recorded response unplayed.
    let export = record(agent(), two_lookups(), &["Where are A1 and B2?"]).await;
    let replay = Replay::from_export(&export).unwrap();
    let runtime = Runtime::builder().agent(agent().max_steps(1)).model(replay.clone()).build().unwrap();
    runtime.run(replay.inputs()[0].as_str()).await.unwrap();
    assert_eq!(replay.check().unwrap_err().0, [Divergence::Unplayed { played: 1, recorded: 2 }]);
}

#[tokio::test]
async fn every_turn_of_a_conversation_replays_in_order() {
    let model = ScriptedModel::new([
        Turn::tool_calls([("c1", "order_status", r#"{"order":"A1"}"#)]),
        Turn::text("A1 has shipped."),
        Turn::text("You're welcome."),
    ]);
    let export = record(agent(), model, &["Where is A1?", "Thanks!"]).await;
    let replay = Replay::from_export(&export).unwrap();
    assert_eq!(replay.inputs(), ["Where is A1?", "Thanks!"]);
    let runtime = Runtime::builder().agent(agent()).model(replay.clone()).build().unwrap();
    let first = runtime.run(replay.inputs()[0].as_str()).await.unwrap();
    let second = runtime.run(RunRequest::new(replay.inputs()[1].as_str()).run_id(&first.run_id)).await.unwrap();
    assert_eq!(second.text, "You're welcome.");
    replay.check().unwrap();
}

#[tokio::test]
async fn results_truncated_at_another_budget_still_match() {
    let reporting = || AgentDef::new("support", "Report.").tool(Report);
    let model = ScriptedModel::new([Turn::tool_calls([("c1", "report", "{}")]), Turn::text("Done.")]);
    let export = record(reporting().max_tool_result_tokens(100), model, &["Report"]).await;
    let replay = Replay::from_export(&export).unwrap();
    let runtime =
        Runtime::builder().agent(reporting().max_tool_result_tokens(50)).model(replay.clone()).build().unwrap();
    runtime.run(replay.inputs()[0].as_str()).await.unwrap();
    replay.check().unwrap();
}

#[tokio::test]
async fn an_export_from_a_sqlite_file_replays_and_the_run_stays_paused_for_a_decision() {
    /// Refund an order.
    #[tool(needs_approval)]
    async fn refund(order: String) -> String {
        format!("{order}: refunded")
    }
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("runs.db");
    let runtime = Runtime::builder()
        .agent(AgentDef::new("shop", "Refund when asked.").tool(Refund))
        .model(ScriptedModel::new([Turn::tool_calls([("c1", "refund", r#"{"order":"A1"}"#)])]))
        .store(SqliteStore::open(&path).unwrap())
        .build()
        .unwrap();
    let paused = runtime.run("Refund A1").await.unwrap();
    assert_eq!(paused.status, RunStatus::Paused);
    drop(runtime);

    let store = SqliteStore::open(&path).unwrap();
    let export = RunExport::from_store(&store, &paused.run_id).await.unwrap();
    assert_eq!(export.run.status, RunStatus::Paused);
    let replay = Replay::from_export(&export).unwrap();
    // A paused turn's input is not in the transcript yet; the export still has it.
    assert_eq!(replay.inputs(), ["Refund A1"]);
    let runtime = Runtime::builder()
        .agent(AgentDef::new("shop", "Refund when asked.").tool(Refund))
        .model(replay.clone())
        .build()
        .unwrap();
    let out = runtime.run(replay.inputs()[0].as_str()).await.unwrap();
    assert_eq!(out.status, RunStatus::Paused);
    replay.check().unwrap();
}
