//! The child process of the chaos soak (`tests/tests/chaos.rs`): drives many runs on one
//! `SqliteStore` until each has finished, mixing parallel, serial, `at_most_once`,
//! `needs_approval` and progress tools. The parent SIGKILLs it at random moments and starts it
//! again; every start picks each run up where the journal left it.
//!
//! Environment: `DB` (store path), `EFFECTS` (external effect log), `RUNS` (how many runs,
//! named `run-0`..), `SEED` (for the tools' random pauses). Each tool execution appends
//! `tool\trun\tlabel\tkey\tstart_ms` to the effect log, durably, before doing anything else.
//! Exits 0 once every run has finished.

use std::{io::Write as _, sync::Arc, time::Duration};

use futures::{StreamExt, stream};
use kuralle::{
    Decision, RunRequest, RunStatus, Runtime, ToolContext, agent, progress,
    stores::SqliteStore,
    testing::{ScriptedModel, Turn},
    tool,
};

/// Appends one line per execution to the external effect log, durably, then pauses a little
/// so that kills land inside calls too.
async fn effect(tool: &str, label: &str, ctx: &ToolContext) -> String {
    let path = std::env::var("EFFECTS").expect("EFFECTS");
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_millis();
    let line = format!("{tool}\t{}\t{label}\t{}\t{now}\n", ctx.run_id(), ctx.idempotency_key());
    let mut f = std::fs::OpenOptions::new().create(true).append(true).open(path).expect("effects file");
    f.write_all(line.as_bytes()).expect("write effect");
    f.sync_data().expect("fsync effect");
    tokio::time::sleep(Duration::from_millis(fastrand::u64(0..15))).await;
    format!("{tool}:{label}")
}

/// Read something; safe beside its siblings.
#[tool(parallel_safe)]
async fn fetch(label: String, ctx: &ToolContext) -> String {
    effect("fetch", &label, ctx).await
}

/// Write something; runs alone.
#[tool]
async fn write(label: String, ctx: &ToolContext) -> String {
    effect("write", &label, ctx).await
}

/// Ship something; never retried blindly.
#[tool(at_most_once)]
async fn ship(label: String, ctx: &ToolContext) -> String {
    effect("ship", &label, ctx).await
}

/// Refund something; a human approves each call.
#[tool(needs_approval)]
async fn refund(label: String, ctx: &ToolContext) -> String {
    effect("refund", &label, ctx).await
}

/// Build a report, reporting progress.
#[tool]
async fn report(label: String, ctx: &ToolContext) -> String {
    for i in 0..3 {
        progress!(i);
        tokio::task::yield_now().await;
    }
    effect("report", &label, ctx).await
}

/// Mixes every kind of tool.
#[agent(id = "chaos", tools = [Fetch, Write, Ship, Refund, Report])]
struct Chaos;

/// The calls each run makes, turn by turn (also read by the parent to know what to expect).
fn script() -> ScriptedModel {
    let call = |id: &str, tool: &str| (id.to_owned(), tool.to_owned(), format!(r#"{{"label":"{id}"}}"#));
    ScriptedModel::by_transcript([
        Turn::tool_calls([
            call("f1", "fetch"),
            call("f2", "fetch"),
            call("f3", "fetch"),
            call("w1", "write"),
            call("p1", "report"),
            call("f4", "fetch"),
        ]),
        Turn::tool_calls([call("s1", "ship"), call("f5", "fetch")]),
        Turn::tool_calls([call("r1", "refund"), call("w2", "write")]),
        Turn::text("All done."),
    ])
}

/// Drives one run to its end: start it, resume it, approve (or deny) what it waits for.
async fn drive(runtime: &Runtime, run_id: String) {
    let mut stalls = 0u32;
    for _ in 0..1000 {
        let record = runtime.get_run(&run_id).await.expect("store readable");
        let handle = match record.map(|r| r.status) {
            None => runtime.run(RunRequest::new("go").run_id(run_id.clone())),
            Some(RunStatus::Finished) => return,
            Some(RunStatus::Paused) => {
                // Every third run is denied: the model is told, and the run still finishes.
                let n: u64 = run_id.trim_start_matches("run-").parse().unwrap_or(0);
                let decision =
                    if n.is_multiple_of(3) { Decision::deny("chaos", "not today") } else { Decision::approve("chaos") };
                runtime.deliver(run_id.clone(), decision)
            }
            Some(_) => runtime.resume(run_id.clone()),
        };
        let mut handle = handle;
        while handle.next().await.is_some() {}
        if let Err(e) = handle.await {
            // A store hiccup or (with leases) a previous owner still holding the run: try again.
            stalls += 1;
            assert!(stalls < 2000, "run {run_id} keeps failing: {e}");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
    let record = runtime.get_run(&run_id).await.ok().flatten();
    panic!("run {run_id} did not finish after 1000 starts: {:?}", record.map(|r| (r.status, r.state)));
}

#[tokio::main]
async fn main() {
    let db = std::env::var("DB").expect("DB");
    let runs: usize = std::env::var("RUNS").expect("RUNS").parse().expect("RUNS is a number");
    fastrand::seed(std::env::var("SEED").ok().and_then(|s| s.parse().ok()).unwrap_or(0));
    let store = SqliteStore::open(&db).expect("open store");
    // A short lease: a killed process's runs are free again within half a second.
    let runtime = Arc::new(
        Runtime::builder()
            .agent(Chaos)
            .model(script())
            .store(store)
            .lease_ttl(Duration::from_millis(500))
            .build()
            .expect("runtime"),
    );
    // Several runs at once, in a random order per start, so kills land in different places.
    let mut ids: Vec<String> = (0..runs).map(|i| format!("run-{i}")).collect();
    fastrand::shuffle(&mut ids);
    stream::iter(ids)
        .for_each_concurrent(8, |id| {
            let runtime = Arc::clone(&runtime);
            async move { drive(&runtime, id).await }
        })
        .await;
    println!("ALL DONE");
}
