//! Journals written before assistant turns became ordered parts (`{content, tool_calls}`)
//! still decode and resume. `tests/fixtures/v3-pre-parts.db` was written by the version before
//! the part model (`cargo test -p kuralle-tests --test transcript_compat -- --ignored` rewrites
//! it with the version checked out, which is only meaningful on that older version).

use std::{
    path::{Path, PathBuf},
    sync::{
        Arc,
        atomic::{AtomicUsize, Ordering},
    },
};

use kuralle::{
    AgentDef, Decision, Message, RunRequest, RunStatus, Runtime,
    stores::SqliteStore,
    testing::{ScriptedModel, Turn},
};
use kuralle_tests::FnTool;
use serde_json::json;

fn fixture() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/v3-pre-parts.db")
}

fn tools(count: &Arc<AtomicUsize>) -> AgentDef {
    let c = count.clone();
    let transfer = FnTool::new("transfer", move |args, _| {
        let c = c.clone();
        async move {
            c.fetch_add(1, Ordering::SeqCst);
            Ok(json!({"sent": args["amount"]}))
        }
    })
    .needs_approval();
    let lookup = FnTool::new("lookup", |args, _| async move { Ok(json!({"order": args["order"], "total": 900})) });
    AgentDef::new("bank", "Be brief.").tool(transfer).tool(lookup)
}

/// Writes the fixture: run `done` finished a tool turn; run `paused` finished one tool turn and
/// waits for approval of a transfer in its second.
#[tokio::test]
#[ignore = "rewrites the fixture; run only on the version that wrote it"]
async fn write_fixture() {
    let path = fixture();
    let _ = std::fs::remove_file(&path);
    let count = Arc::new(AtomicUsize::new(0));
    let model = ScriptedModel::new([
        Turn::tool_calls([("c1", "lookup", r#"{"order":"A-17"}"#)]).with_text("Looking it up."),
        Turn::text("Order A-17 totals 900."),
        Turn::tool_calls([("c2", "lookup", r#"{"order":"B-2"}"#)]),
        Turn::text("B-2 totals 900."),
        Turn::tool_calls([("c3", "transfer", r#"{"amount":900}"#)]).with_text("Sending."),
    ]);
    {
        let rt = Runtime::builder()
            .agent(tools(&count))
            .model(model)
            .store(SqliteStore::open(&path).unwrap())
            .build()
            .unwrap();
        let out = rt.run(RunRequest::new("total of A-17?").run_id("done")).await.unwrap();
        assert_eq!(out.status, RunStatus::Finished);
        let out = rt.run(RunRequest::new("total of B-2?").run_id("paused")).await.unwrap();
        assert_eq!(out.status, RunStatus::Finished);
        let out = rt.run(RunRequest::new("pay it").run_id("paused")).await.unwrap();
        assert_eq!(out.status, RunStatus::Paused);
    }
}

/// A private copy of the fixture, so tests never change the committed file.
fn copy_of_fixture() -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("journal.db");
    std::fs::copy(fixture(), &path).unwrap();
    (dir, path)
}

#[tokio::test]
async fn a_paused_run_journaled_before_parts_resumes_with_its_transcript() {
    let (_dir, path) = copy_of_fixture();
    let count = Arc::new(AtomicUsize::new(0));
    let model = ScriptedModel::new([Turn::text("Sent 900.")]);
    let seen = model.clone();
    let rt =
        Runtime::builder().agent(tools(&count)).model(model).store(SqliteStore::open(&path).unwrap()).build().unwrap();

    let out = rt.deliver("paused", Decision::approve("alice")).await.unwrap();
    assert_eq!(out.status, RunStatus::Finished);
    assert_eq!(out.text, "Sent 900.");
    assert_eq!(count.load(Ordering::SeqCst), 1, "the approved transfer ran once");

    // The one new request carries the old turns as parts: text, then the call, then its result.
    let requests = seen.requests();
    assert_eq!(requests.len(), 1, "the journaled model responses were replayed, not asked again");
    let messages: Vec<&Message> = requests[0].messages.iter().collect();
    let assistants: Vec<&&Message> = messages.iter().filter(|m| matches!(m, Message::Assistant { .. })).collect();
    assert_eq!(assistants.len(), 3, "{messages:#?}");
    assert_eq!(assistants[0].text(), "", "{:?}", assistants[0]);
    assert_eq!(assistants[0].tool_calls().map(|c| c.call_id.as_str()).collect::<Vec<_>>(), ["c2"]);
    assert_eq!(**assistants[1], Message::assistant_text("B-2 totals 900."));
    assert_eq!(assistants[2].text(), "Sending.");
    let last = assistants[2].tool_calls().next().unwrap();
    assert_eq!(
        (last.call_id.as_str(), last.name.as_str(), last.arguments.as_str()),
        ("c3", "transfer", r#"{"amount":900}"#)
    );
    assert!(matches!(messages.last(), Some(Message::Tool { call_id, .. }) if call_id == "c3"));
}

#[tokio::test]
async fn a_finished_run_journaled_before_parts_reads_and_takes_a_new_turn() {
    let (_dir, path) = copy_of_fixture();
    let count = Arc::new(AtomicUsize::new(0));
    let model = ScriptedModel::new([Turn::text("Still 900.")]);
    let seen = model.clone();
    let rt =
        Runtime::builder().agent(tools(&count)).model(model).store(SqliteStore::open(&path).unwrap()).build().unwrap();

    let steps = rt.journal("done").await.unwrap();
    let calls = kuralle::inspect::step_calls("done", &steps);
    assert_eq!(calls.values().map(|c| c.call_id.as_str()).collect::<Vec<_>>(), ["c1"], "old calls are still found");

    let out = rt.run(RunRequest::new("and now?").run_id("done")).await.unwrap();
    assert_eq!(out.status, RunStatus::Finished);
    assert_eq!(out.text, "Still 900.");
    let request = &seen.requests()[0];
    let texts: Vec<String> = request.messages.iter().map(Message::text).filter(|t| !t.is_empty()).collect();
    assert_eq!(texts, ["Looking it up.", "Order A-17 totals 900."]);
}

/// Provider state (here a signed reasoning part and a signed call, as a scripted turn) is
/// journaled with its response and sent back exactly, by a new runtime over the same journal
/// that resumes the paused run.
#[tokio::test]
async fn parts_are_journaled_and_sent_back_after_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("journal.db");
    let count = Arc::new(AtomicUsize::new(0));
    let reasoning = kuralle::Part::Reasoning {
        text: "The user wants 900 sent.".into(),
        summary: vec!["Sending money".into()],
        signature: Some("c2lnbmF0dXJl/+=".into()),
        encrypted: Some("gAAAAB…".into()),
        id: Some("rs_1".into()),
    };
    let call = kuralle::Part::ToolCall {
        call: kuralle::ToolCallRequest {
            call_id: "c9".into(),
            name: "transfer".into(),
            arguments: r#"{"amount":900}"#.into(),
        },
        signature: Some("sig-on-call".into()),
        id: Some("fc_1".into()),
    };
    let first = ScriptedModel::new([Turn::text("Sending.").with_part(reasoning.clone()).with_part(call.clone())]);
    {
        let rt = Runtime::builder()
            .agent(tools(&count))
            .model(first)
            .store(SqliteStore::open(&path).unwrap())
            .build()
            .unwrap();
        assert_eq!(rt.run(RunRequest::new("pay").run_id("r")).await.unwrap().status, RunStatus::Paused);
    }
    let second = ScriptedModel::new([Turn::text("Sent.")]);
    let seen = second.clone();
    let rt =
        Runtime::builder().agent(tools(&count)).model(second).store(SqliteStore::open(&path).unwrap()).build().unwrap();
    assert_eq!(rt.deliver("r", Decision::approve("alice")).await.unwrap().status, RunStatus::Finished);
    assert_eq!(count.load(Ordering::SeqCst), 1);
    let request = &seen.requests()[0];
    let turn = request.messages.iter().find(|m| matches!(m, Message::Assistant { .. })).unwrap();
    assert_eq!(
        *turn,
        Message::Assistant {
            parts: vec![reasoning, call, kuralle::Part::text("Sending.")],
            origin: Some(kuralle::Origin::new("scripted", "scripted")),
        }
    );
}
