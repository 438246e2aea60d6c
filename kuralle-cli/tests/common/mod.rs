//! A SQLite store with runs in known states, made by a real runtime, for the CLI and console
//! tests.

#![allow(dead_code)] // each test binary uses part of it

use std::{
    io::{BufRead, BufReader},
    path::{Path, PathBuf},
    process::{Child, Command, Output, Stdio},
    sync::{
        Arc,
        atomic::{AtomicUsize, Ordering},
    },
};

use kuralle::{
    AgentDef, RunRequest, RunStatus, Runtime,
    stores::SqliteStore,
    testing::{ScriptedModel, Turn},
    tool,
};

/// Look up an order.
#[tool(parallel_safe)]
pub async fn lookup(order: String) -> String {
    format!("{order}: delivered")
}

/// Wires money; counts how often it really ran.
#[tool(needs_approval)]
async fn wire(amount: f64) -> String {
    WIRES.fetch_add(1, Ordering::SeqCst);
    format!("wired {amount}")
}

/// Times `wire` executed in this process.
pub static WIRES: AtomicUsize = AtomicUsize::new(0);

/// The paused run's id.
pub const PAUSED: &str = "pay-1";
/// The finished run's id.
pub const FINISHED: &str = "chat-1";

fn payments_model() -> ScriptedModel {
    ScriptedModel::by_transcript([
        Turn::tool_calls([("call_lookup", "lookup", r#"{"order":"A-17"}"#)]),
        Turn::tool_calls([("call_wire", "wire", r#"{"amount":900}"#)]),
        Turn::text("Wired 900."),
    ])
}

/// The payments agent, as its own process defines it.
pub fn payments() -> AgentDef {
    AgentDef::new("payments", "Move money.").tool(Lookup).tool(Wire)
}

/// The runtime that owns the runs in `db` (what the agent's own process would build).
pub fn owner(db: &Path) -> Runtime {
    Runtime::builder()
        .agent(payments())
        .agent(AgentDef::new("support", "Chat."))
        .model(payments_model())
        .store(SqliteStore::open(db).unwrap())
        .build()
        .unwrap()
}

/// A store at `dir/runs.db` with run `pay-1` (payments, paused on a `wire` approval after a
/// `lookup`) and run `chat-1` (support, finished).
pub async fn seed(dir: &Path) -> PathBuf {
    let db = dir.join("runs.db");
    let rt = owner(&db);
    let paused = rt.run(RunRequest::new("wire 900 for A-17").run_id(PAUSED)).await.unwrap();
    assert_eq!(paused.status, RunStatus::Paused);
    let chat = Runtime::builder()
        .agent(AgentDef::new("support", "Chat."))
        .model(ScriptedModel::new([Turn::text("Hello!")]))
        .store_arc(Arc::clone(rt.store()))
        .build()
        .unwrap();
    let done = chat.run(RunRequest::new("hi").run_id(FINISHED)).await.unwrap();
    assert_eq!(done.status, RunStatus::Finished);
    db
}

/// Runs the `kuralle` binary.
pub fn kuralle(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_kuralle")).args(args).env_remove("KURALLE_STORE").output().unwrap()
}

/// `sqlite:PATH`.
pub fn store_arg(db: &Path) -> String {
    format!("sqlite:{}", db.display())
}

/// A child process killed when the test ends, pass or fail.
pub struct Killed(pub Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Starts `kuralle console` on a free loopback port; returns it and its base URL.
pub fn console(db: &Path) -> (Killed, String) {
    console_with(db, &["--listen", "127.0.0.1:0", "--operator", "console-test"], &[])
}

/// Starts `kuralle console` with `args` (which name `--listen`) and environment `env`;
/// returns it and a base URL on 127.0.0.1 (also for a wildcard address).
pub fn console_with(db: &Path, args: &[&str], env: &[(&str, &str)]) -> (Killed, String) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_kuralle"))
        .args(["console", "--store", &store_arg(db)])
        .args(args)
        .env_remove("KURALLE_CONSOLE_TOKEN")
        .envs(env.iter().copied())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap()).read_line(&mut line).unwrap();
    let url = line.trim().rsplit(' ').next().unwrap().replace("0.0.0.0", "127.0.0.1");
    assert!(url.starts_with("http://127.0.0.1:"), "unexpected first line: {line:?}");
    (Killed(child), url)
}
