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
