//! Sensitive tool values (`Secret<T>`): hidden in events and exports, kept in the journal so a
//! resumed run has them, and SQLite files only their owner can read.

use futures::StreamExt;
use kuralle::{
    AgentDef, Event, REDACTED, Redaction, RunRequest, RunStatus, Runtime, Secret, Tool,
    export::RunExport,
    stores::SqliteStore,
    testing::{Replay, ScriptedModel, Turn},
    tool,
};
use serde_json::json;

const CARD: &str = "4242 4242 4242 4242";
const TOKEN: &str = "tok_live_51Hx";

/// A card number.
type Card = Secret<String>;

/// Charge a card.
#[tool]
async fn charge(card: Secret<String>, cents: u64, backup: Option<Card>) -> String {
    let _ = backup;
    format!("charged {cents} to card ending {}", &card.expose()[card.expose().len() - 4..])
}

/// Issue an API token for a user.
#[tool]
async fn issue_token(user: String) -> Secret<String> {
    let _ = user;
    Secret::new(TOKEN.to_owned())
}

/// Look up an order.
#[tool]
async fn lookup(order: String) -> String {
    format!("{order}: shipped")
}

fn agent() -> AgentDef {
    AgentDef::new("billing", "Bill customers.").tool(Charge).tool(IssueToken).tool(Lookup)
}

fn model() -> ScriptedModel {
    ScriptedModel::new([
        Turn::tool_calls([
            ("c1", "charge", &*format!(r#"{{"card":"{CARD}","cents":500}}"#)),
            ("c2", "issue_token", r#"{"user":"ada"}"#),
            ("c3", "lookup", r#"{"order":"A1"}"#),
        ]),
        Turn::text("Charged and issued."),
    ])
}

#[test]
fn the_macro_marks_secret_parameters_and_results_by_type() {
    // An alias and an optional secret are found: the probe asks the type, not its spelling.
    assert_eq!(Charge.redaction(), Redaction::new(["card", "backup"], false));
    assert_eq!(IssueToken.redaction(), Redaction::new(Vec::<String>::new(), true));
    assert!(Lookup.redaction().is_empty());
    // The model is asked for the value itself: no wrapper in the schema.
    assert_eq!(Charge.input_schema()["properties"]["card"]["type"], "string");
}

#[tokio::test]
async fn secrets_never_reach_events_or_exports_and_the_journal_keeps_them() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("runs.db");
    let runtime =
        Runtime::builder().agent(agent()).model(model()).store(SqliteStore::open(&db).unwrap()).build().unwrap();

    let mut handle = runtime.run(RunRequest::new("charge ada").run_id("bill-1"));
    let mut events = Vec::new();
    while let Some(event) = handle.next().await {
        events.push(event);
    }
    let out = handle.await.unwrap();
    assert_eq!((out.status, out.text.as_str()), (RunStatus::Finished, "Charged and issued."));

    let shown = serde_json::to_string(&events).unwrap();
    assert!(!shown.contains(CARD) && !shown.contains(TOKEN), "{shown}");
    let call = events.iter().find_map(|e| match e {
        Event::ToolCall { name, args, .. } if name == "charge" => Some(args.clone()),
        _ => None,
    });
    assert_eq!(call, Some(json!({"card": REDACTED, "cents": 500})));
    let token = events.iter().find_map(|e| match e {
        Event::ToolResult { name, result, .. } if name == "issue_token" => Some(result.clone()),
        _ => None,
    });
    assert_eq!(token, Some(json!(REDACTED)));
    // What is not secret is shown as it was.
    assert!(shown.contains("charged 500 to card ending 4242") && shown.contains("A1: shipped"), "{shown}");

    // The journal and the run's conversation keep the values: a resumed run needs them.
    let store = runtime.store();
    let journal: String = store
        .steps("bill-1")
        .await
        .unwrap()
        .iter()
        .filter_map(|s| s.result.clone())
        .map(|t| t.as_str().to_owned())
        .collect();
    assert!(journal.contains(CARD) && journal.contains(TOKEN));
    assert!(store.get_run("bill-1").await.unwrap().unwrap().state.as_str().contains(TOKEN));

    // An export leaves the machine without them.
    let export = RunExport::from_store(store.as_ref(), "bill-1").await.unwrap();
    let text = export.to_json();
    assert!(!text.contains(CARD) && !text.contains(TOKEN), "{text}");
    assert!(text.contains(REDACTED) && text.contains("A1: shipped"));

    // And still replays as a test: the replayed call gets the placeholder, and the fresh
    // token the test's tool returns is compared redacted.
    let replay = Replay::from_export(&RunExport::from_json(&text).unwrap()).unwrap();
    let test = Runtime::builder().agent(agent()).model(replay.clone()).build().unwrap();
    let replayed = test.run(replay.inputs()[0].as_str()).await.unwrap();
    assert_eq!(replayed.text, "Charged and issued.");
    replay.check().unwrap();
}

#[cfg(unix)]
#[tokio::test]
async fn new_sqlite_files_are_readable_by_their_owner_only() {
    use std::os::unix::fs::PermissionsExt;

    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("runs.db");
    let runtime =
        Runtime::builder().agent(agent()).model(model()).store(SqliteStore::open(&db).unwrap()).build().unwrap();
    runtime.run("charge ada").await.unwrap();
    for file in [db.clone(), dir.path().join("runs.db-wal")] {
        let mode = std::fs::metadata(&file).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600, "{}", file.display());
    }

    // A file the operator made keeps the mode they gave it.
    let shared = dir.path().join("shared.db");
    std::fs::write(&shared, b"").unwrap();
    std::fs::set_permissions(&shared, std::fs::Permissions::from_mode(0o640)).unwrap();
    drop(SqliteStore::open(&shared).unwrap());
    assert_eq!(std::fs::metadata(&shared).unwrap().permissions().mode() & 0o777, 0o640);
}
