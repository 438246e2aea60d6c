//! `inspect::conversation`: what a run page shows beside the timeline — inputs, the model's
//! text and kept reasoning summaries, from closed turns' transcript and an open turn's journal.

use kuralle::{
    AgentDef, Part, RunRequest, RunStatus, Runtime,
    inspect::conversation,
    testing::{ScriptedModel, Turn},
};
use kuralle_tests::FnTool;
use serde_json::json;

fn said(runtime_lines: &[kuralle::inspect::Utterance]) -> Vec<(&str, &str, Option<u64>)> {
    runtime_lines.iter().map(|u| (u.role, u.text.as_str(), u.ordinal)).collect()
}

#[tokio::test]
async fn closed_turns_and_an_open_turn_in_order_with_reasoning_summaries() {
    let reasoning = |summary: &str| Part::Reasoning {
        text: "raw thoughts".into(),
        summary: vec![summary.into()],
        signature: None,
        encrypted: None,
        id: None,
    };
    let refund = FnTool::new("refund", |_, _| async { Ok(json!("refunded")) }).needs_approval();
    let runtime = Runtime::builder()
        .agent(AgentDef::new("shop", "Help.").tool(refund))
        .model(ScriptedModel::new([
            Turn::text("Hello.").with_part(reasoning("Greet briefly.")),
            Turn::tool_calls([("c1", "refund", "{}")]).with_text("Refunding now."),
        ]))
        .build()
        .unwrap();
    runtime.run(RunRequest::new("Hi").run_id("r1")).await.unwrap();
    let out = runtime.run(RunRequest::new("Refund me").run_id("r1")).await.unwrap();
    assert_eq!(out.status, RunStatus::Paused);

    let record = runtime.get_run("r1").await.unwrap().unwrap();
    let steps = runtime.journal("r1").await.unwrap();
    let lines = conversation(&record, &steps);
    let model_step = steps.iter().rev().find(|s| s.kind == kuralle::StepKind::Model).unwrap().ordinal;
    assert_eq!(
        said(&lines),
        [
            ("user", "Hi", None),
            // In the order the response's parts came: reasoning first.
            ("reasoning", "Greet briefly.", None),
            ("assistant", "Hello.", None),
            ("user", "Refund me", None),
            ("assistant", "Refunding now.", Some(model_step)),
        ]
    );
}
