//! A run whose tools take and return `Secret<T>` values, read by the CLI and the console:
//! every view shows `[redacted]`, never the value.

mod common;

use std::io::{Read, Write};

use common::{console, kuralle, store_arg};
use kuralle::{
    AgentDef, RunRequest, RunStatus, Runtime, Secret,
    stores::SqliteStore,
    testing::{ScriptedModel, Turn},
    tool,
};

const CARD: &str = "4000056655665556";
const TOKEN: &str = "tok_live_9Qx";

/// Fetch the customer's saved payment token.
#[tool]
async fn saved_token(customer: String) -> Secret<String> {
    let _ = customer;
    Secret::new(TOKEN.to_owned())
}

/// Charge a card; a person approves each charge.
#[tool(needs_approval)]
async fn charge(card: Secret<String>, cents: u64) -> String {
    let _ = card;
    format!("charged {cents}")
}

async fn paused_run(db: &std::path::Path) {
    let model = ScriptedModel::new([
        Turn::tool_calls([("c1", "saved_token", r#"{"customer":"ada"}"#)]),
        Turn::tool_calls([("c2", "charge", &*format!(r#"{{"card":"{CARD}","cents":900}}"#))]),
    ]);
    let runtime = Runtime::builder()
        .agent(AgentDef::new("billing", "Bill.").tool(SavedToken).tool(Charge))
        .model(model)
        .store(SqliteStore::open(db).unwrap())
        .build()
        .unwrap();
    let out = runtime.run(RunRequest::new("charge ada 9 dollars").run_id("bill-1")).await.unwrap();
    assert_eq!(out.status, RunStatus::Paused);
}

fn stdout(args: &[&str]) -> String {
    let out = kuralle(args);
    assert!(out.status.success(), "{args:?} failed: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout).unwrap()
}

fn get(base: &str, path: &str) -> String {
    let addr = base.trim_start_matches("http://");
    let mut stream = std::net::TcpStream::connect(addr).unwrap();
    write!(stream, "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n").unwrap();
    let mut raw = String::new();
    stream.read_to_string(&mut raw).unwrap();
    assert!(raw.starts_with("HTTP/1.1 200"), "{raw}");
    raw
}

#[tokio::test]
async fn show_export_and_the_console_never_print_a_secret() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("runs.db");
    paused_run(&db).await;
    let store = store_arg(&db);

    let views = [
        ("runs show", stdout(&["runs", "show", "bill-1", "--store", &store])),
        ("runs show --json", stdout(&["runs", "show", "bill-1", "--store", &store, "--json"])),
        ("runs export", stdout(&["runs", "export", "bill-1", "--store", &store])),
    ];
    for (view, text) in &views {
        assert!(!text.contains(CARD) && !text.contains(TOKEN), "{view} shows a secret:\n{text}");
        assert!(text.contains("[redacted]"), "{view} shows no placeholder:\n{text}");
    }
    // The pending charge is shown for a decision, its amount whole and its card hidden.
    let json: serde_json::Value = serde_json::from_str(&views[1].1).unwrap();
    assert_eq!(json["pending"][0]["args"], serde_json::json!({"card": "[redacted]", "cents": 900}));

    let (_console, base) = console(&db);
    let page = get(&base, "/runs/bill-1");
    assert!(!page.contains(CARD) && !page.contains(TOKEN), "the console shows a secret:\n{page}");
    assert!(page.contains("[redacted]") && page.contains("900"));

    // The store still has them: the run resumes with the real card once approved.
    let journal = std::fs::read(&db).unwrap();
    let wal = std::fs::read(dir.path().join("runs.db-wal")).unwrap_or_default();
    let holds = |needle: &str| [&journal, &wal].iter().any(|b| b.windows(needle.len()).any(|w| w == needle.as_bytes()));
    assert!(holds(CARD) && holds(TOKEN));
}
