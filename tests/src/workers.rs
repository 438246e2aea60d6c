//! The payment agent of the multi-process worker tests (`tests/worker_processes.rs`), shared by
//! the test and its child process (`src/bin/worker_child.rs`).
//!
//! Every tool execution appends `tool\tkey\trun_id\tpid` to a ledger file (one `write` on an
//! `O_APPEND` file, so lines of concurrent processes never interleave) before it returns
//! `{"pid": <pid>}`: the ledger is the external system whose effects the journal must not
//! double.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use kuralle::stores::{PostgresOptions, PostgresStore, SqliteStore};
use kuralle::testing::{ScriptedModel, Turn};
use kuralle::{AgentDef, RunStore, Runtime};
use serde_json::json;

use crate::FnTool;

/// Opens `spec`: `sqlite:PATH`, or `postgres:SCHEMA` on the server named by `DATABASE_URL`.
pub async fn open_store(spec: &str) -> Arc<dyn RunStore> {
    if let Some(path) = spec.strip_prefix("sqlite:") {
        return Arc::new(SqliteStore::open(path).expect("the SQLite store opens"));
    }
    let schema = spec.strip_prefix("postgres:").unwrap_or_else(|| panic!("unknown store spec {spec}"));
    let url = std::env::var("DATABASE_URL").expect("DATABASE_URL for a postgres: store");
    let options = PostgresOptions { schema: schema.to_owned(), ..PostgresOptions::default() };
    Arc::new(PostgresStore::connect_with(&url, options).await.expect("the PostgreSQL store connects"))
}

/// One ledger line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Effect {
    /// `pay` or `refund_once`.
    pub tool: String,
    /// The call's idempotency key.
    pub key: String,
    /// The run.
    pub run_id: String,
    /// The process that executed it.
    pub pid: u32,
}

/// Reads the ledger at `path` (missing: empty).
pub fn read_ledger(path: &Path) -> Vec<Effect> {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    text.lines()
        .filter_map(|line| {
            let mut parts = line.split('\t');
            Some(Effect {
                tool: parts.next()?.to_owned(),
                key: parts.next()?.to_owned(),
                run_id: parts.next()?.to_owned(),
                pid: parts.next()?.parse().ok()?,
            })
        })
        .collect()
}

fn record(ledger: &Path, tool: &str, key: &str, run_id: &str) {
    let line = format!("{tool}\t{key}\t{run_id}\t{}\n", std::process::id());
    let mut file = std::fs::OpenOptions::new().create(true).append(true).open(ledger).expect("the ledger opens");
    file.write_all(line.as_bytes()).expect("the ledger is written");
}

/// A pause of `fixed` or, without it, 5–30 ms (varied so that kills land everywhere).
async fn pause(fixed: Option<Duration>) {
    let jitter = SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.subsec_nanos()).unwrap_or(0) % 25;
    tokio::time::sleep(fixed.unwrap_or(Duration::from_millis(5 + u64::from(jitter)))).await;
}

fn tool(name: &'static str, ledger: PathBuf, fixed: Option<Duration>) -> FnTool {
    FnTool::new(name, move |_, ctx| {
        let ledger = ledger.clone();
        async move {
            record(&ledger, name, ctx.idempotency_key(), ctx.run_id());
            pause(fixed).await;
            Ok(json!({"pid": std::process::id()}))
        }
    })
}

/// The runtime: agent `shop` calls `pay` (at least once) and `refund_once` (at most once) in
/// one batch, then answers `done`. `pay_pause` fixes how long a payment takes.
pub fn runtime(store: Arc<dyn RunStore>, ledger: &Path, lease_ttl: Duration, pay_pause: Option<Duration>) -> Runtime {
    let pay = tool("pay", ledger.to_path_buf(), pay_pause);
    let refund = tool("refund_once", ledger.to_path_buf(), None).at_most_once();
    let model = ScriptedModel::by_transcript([
        Turn::tool_calls([("c1", "pay", r#"{"amount":5}"#), ("c2", "refund_once", r#"{"amount":1}"#)]),
        Turn::text("done"),
    ]);
    Runtime::builder()
        .agent(AgentDef::new("shop", "Take payments.").tool(pay).tool(refund))
        .model(model)
        .store_arc(store)
        .lease_ttl(lease_ttl)
        .build()
        .expect("the runtime builds")
}
