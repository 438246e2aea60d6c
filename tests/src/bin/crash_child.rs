//! The child process of the crash tests (`tests/tests/crash.rs`): runs a payment agent on a
//! `SqliteStore`, and when `CRASH_AT` names a boundary of the `CRASH_TOOL` call, prints
//! `MARK <boundary>` and stops there so the parent can SIGKILL (or SIGSTOP) it at exactly
//! that point.
//!
//! Environment: `DB` (store path), `EFFECTS` (external effect log), `RUN_ID`, and optionally
//! - `CRASH_AT` (`before_intent`, `after_intent`, `in_execute`, `before_result`,
//!   `after_result`) with `CRASH_TOOL` (`charge` or `ship`);
//! - `MODE`: `run` (default: start or continue the turn, waiting up to 10 s for the lease),
//!   `resume` (`runtime.resume`, not waiting), or `soak` (a longer order, like `run`);
//! - `LEASE_TTL_MS`: the runtime's lease TTL;
//! - `SLOW_MS`: each charge takes this long after its effect (widens race windows);
//! - `MAX_REQUESTS`: in `run` mode, the run's request limit (`RunLimits::max_requests`);
//! - `ZOMBIE_MS`: at `in_execute`, after the mark, sleep this long and carry on (instead of
//!   waiting to be killed), so a SIGSTOPped child can be resumed as a zombie.
//!
//! Every store write prints `WRITE <op> ok|fenced|error`. Every tool execution appends
//! `tool\tkey\twhat\tpid\trerun` to the effect log, where `rerun` is `1` when the journal
//! already held a finished outcome for that key (a finished step executed again). On
//! completion the child prints one JSON line: `{"status", "text", "results": [[call_id,
//! result, is_error], ...]}`, or `{"error": "busy" | "lease_lost" | "limit_exceeded" | "other", "message"}`.

use std::{
    collections::HashSet,
    io::Write,
    sync::{Arc, Mutex, OnceLock},
    time::Duration,
};

use futures::StreamExt;
use kuralle::{
    Event, Lease, NewStep, RunError, RunFilter, RunLimits, RunRecord, RunRequest, RunStatus, RunStore, RunSummary,
    Runtime, StepKind, StepOutcome, StepRecord, StepStatus, StoreError, StoreFuture, ToolContext, agent,
    stores::SqliteStore,
    testing::{ScriptedModel, Turn},
    tool,
};
use serde_json::json;

/// The store, for tools that check whether the journal already finished their key.
static STORE: OnceLock<SqliteStore> = OnceLock::new();

fn crash_at() -> Option<(String, String)> {
    Some((std::env::var("CRASH_AT").ok()?, std::env::var("CRASH_TOOL").ok()?))
}

fn env_ms(name: &str) -> Option<Duration> {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).map(Duration::from_millis)
}

fn say(line: &str) {
    let mut out = std::io::stdout().lock();
    writeln!(out, "{line}").ok();
    out.flush().ok();
}

/// Prints the marker and waits to be killed (or, as a zombie, carries on after a while).
async fn stop_here(boundary: &str) {
    say(&format!("MARK {boundary}"));
    match env_ms("ZOMBIE_MS") {
        Some(pause) if boundary == "in_execute" => tokio::time::sleep(pause).await,
        _ => std::future::pending::<()>().await,
    }
}

/// Appends one line per execution to the external effect log, durably.
async fn effect(tool: &str, ctx: &ToolContext, what: &str) {
    let key = ctx.idempotency_key();
    let steps = match STORE.get() {
        Some(store) => store.steps(ctx.run_id()).await.unwrap_or_default(),
        None => Vec::new(),
    };
    let rerun = steps.iter().any(|s| s.key == key && s.status != StepStatus::Running);
    let path = std::env::var("EFFECTS").expect("EFFECTS");
    let mut f = std::fs::OpenOptions::new().create(true).append(true).open(path).expect("effects file");
    // One write call: `writeln!` on a `File` writes piece by piece, and a SIGKILL between two
    // pieces left a torn line that the next process's line then ran into.
    let line = format!("{tool}\t{key}\t{what}\t{}\t{}\n", std::process::id(), u8::from(rerun));
    f.write_all(line.as_bytes()).expect("write effect");
    f.sync_data().expect("fsync effect");
}

async fn maybe_stop_in_execute(tool: &str) {
    if let Some((at, t)) = crash_at()
        && at == "in_execute"
        && t == tool
    {
        stop_here("in_execute").await;
    }
}

/// Charge a card; the payment provider dedupes on the idempotency key.
#[tool]
async fn charge(
    /// Amount in cents.
    amount: u64,
    ctx: &ToolContext,
) -> serde_json::Value {
    effect("charge", ctx, &amount.to_string()).await;
    maybe_stop_in_execute("charge").await;
    if let Some(slow) = env_ms("SLOW_MS") {
        tokio::time::sleep(slow).await;
    }
    json!({"charged": amount, "receipt": &ctx.idempotency_key()[..12]})
}

/// Ship an order. Not idempotent on the carrier's side, so never retried blindly.
#[tool(at_most_once)]
async fn ship(
    /// Order number.
    order: u64,
    ctx: &ToolContext,
) -> serde_json::Value {
    effect("ship", ctx, &order.to_string()).await;
    maybe_stop_in_execute("ship").await;
    json!({"shipped": order})
}

/// Take payment, then ship.
#[agent(id = "shop", tools = [Charge, Ship])]
struct Shop;

/// Stops at the configured boundary of the first journal write of the configured tool, and
/// prints the result of every write.
struct HookStore {
    inner: SqliteStore,
    target: Option<(String, String)>,
    watched: Mutex<HashSet<u64>>,
}

impl HookStore {
    fn armed(&self, boundary: &str) -> bool {
        self.target.as_ref().is_some_and(|(at, _)| at == boundary)
    }
}

fn logged<T>(op: &str, result: Result<T, StoreError>) -> Result<T, StoreError> {
    let outcome = match &result {
        Ok(_) => "ok",
        Err(StoreError::Fenced { .. }) => "fenced",
        Err(StoreError::LeaseHeld { .. }) => "held",
        Err(_) => "error",
    };
    say(&format!("WRITE {op} {outcome}"));
    result
}

impl RunStore for HookStore {
    fn create_run(&self, run: RunRecord, fence: u64) -> StoreFuture<'_, ()> {
        Box::pin(async move { logged("create_run", self.inner.create_run(run, fence).await) })
    }
    fn get_run<'a>(&'a self, run_id: &'a str) -> StoreFuture<'a, Option<RunRecord>> {
        self.inner.get_run(run_id)
    }
    fn put_run(&self, run: RunRecord, fence: u64) -> StoreFuture<'_, u64> {
        Box::pin(async move { logged("put_run", self.inner.put_run(run, fence).await) })
    }
    fn list_runs(&self, filter: RunFilter) -> StoreFuture<'_, Vec<RunSummary>> {
        self.inner.list_runs(filter)
    }
    fn cancel_run<'a>(&'a self, run_id: &'a str) -> StoreFuture<'a, Option<kuralle::RunStatus>> {
        self.inner.cancel_run(run_id)
    }
    fn delete_run<'a>(&'a self, run_id: &'a str) -> StoreFuture<'a, bool> {
        self.inner.delete_run(run_id)
    }
    fn append_steps<'a>(&'a self, run_id: &'a str, fence: u64, steps: Vec<NewStep>) -> StoreFuture<'a, Vec<u64>> {
        Box::pin(async move {
            let positions: Vec<usize> = steps
                .iter()
                .enumerate()
                .filter(|(_, s)| {
                    s.kind == StepKind::Tool && self.target.as_ref().is_some_and(|(_, tool)| *tool == s.name)
                })
                .map(|(i, _)| i)
                .collect();
            let hit = !positions.is_empty();
            if hit && self.armed("before_intent") {
                stop_here("before_intent").await;
            }
            let ordinals = logged("append_steps", self.inner.append_steps(run_id, fence, steps).await)?;
            if hit {
                self.watched.lock().unwrap().extend(positions.iter().map(|&i| ordinals[i]));
                if self.armed("after_intent") {
                    stop_here("after_intent").await;
                }
            }
            Ok(ordinals)
        })
    }
    fn finish_step<'a>(
        &'a self,
        run_id: &'a str,
        fence: u64,
        ordinal: u64,
        outcome: StepOutcome,
        finished_at_ms: i64,
    ) -> StoreFuture<'a, ()> {
        Box::pin(async move {
            let hit = self.watched.lock().unwrap().contains(&ordinal);
            if hit && self.armed("before_result") {
                stop_here("before_result").await;
            }
            logged("finish_step", self.inner.finish_step(run_id, fence, ordinal, outcome, finished_at_ms).await)?;
            if hit && self.armed("after_result") {
                stop_here("after_result").await;
            }
            Ok(())
        })
    }
    fn steps<'a>(&'a self, run_id: &'a str) -> StoreFuture<'a, Vec<StepRecord>> {
        self.inner.steps(run_id)
    }
    fn acquire_lease<'a>(&'a self, run_id: &'a str, owner: &'a str, ttl: Duration) -> StoreFuture<'a, Lease> {
        Box::pin(async move { logged("acquire_lease", self.inner.acquire_lease(run_id, owner, ttl).await) })
    }
    fn renew_lease<'a>(&'a self, lease: &'a Lease, ttl: Duration) -> StoreFuture<'a, Lease> {
        Box::pin(async move { logged("renew_lease", self.inner.renew_lease(lease, ttl).await) })
    }
    fn release_lease<'a>(&'a self, lease: &'a Lease) -> StoreFuture<'a, ()> {
        Box::pin(async move { logged("release_lease", self.inner.release_lease(lease).await) })
    }
    fn current_lease<'a>(&'a self, run_id: &'a str) -> StoreFuture<'a, Option<Lease>> {
        self.inner.current_lease(run_id)
    }
}

fn model(mode: &str) -> ScriptedModel {
    // Answers are a function of the transcript, so a resumed process (whose earlier model
    // responses replay from the journal) sees the same conversation as an uninterrupted one.
    if mode == "soak" {
        return ScriptedModel::by_transcript([
            Turn::tool_calls([
                ("call_a", "charge", r#"{"amount":100}"#),
                ("call_b", "charge", r#"{"amount":250}"#),
                ("call_c", "charge", r#"{"amount":325}"#),
            ]),
            Turn::tool_calls([("call_d", "ship", r#"{"order":7}"#)]),
            Turn::tool_calls([("call_e", "charge", r#"{"amount":5}"#), ("call_f", "ship", r#"{"order":8}"#)]),
            Turn::text("Paid and shipped."),
        ]);
    }
    ScriptedModel::by_transcript([
        Turn::tool_calls([("call_a", "charge", r#"{"amount":100}"#), ("call_b", "charge", r#"{"amount":250}"#)]),
        Turn::tool_calls([("call_c", "ship", r#"{"order":7}"#)]),
        Turn::text("Paid and shipped."),
    ])
}

#[tokio::main]
async fn main() {
    let db = std::env::var("DB").expect("DB");
    let run_id = std::env::var("RUN_ID").expect("RUN_ID");
    let mode = std::env::var("MODE").unwrap_or_else(|_| "run".to_owned());
    let inner = SqliteStore::open(&db).expect("open store");
    let _ = STORE.set(inner.clone());
    let store = HookStore { inner, target: crash_at(), watched: Mutex::new(HashSet::new()) };
    let mut builder = Runtime::builder().agent(Shop).model(model(&mode)).store_arc(Arc::new(store));
    if let Some(ttl) = env_ms("LEASE_TTL_MS") {
        builder = builder.lease_ttl(ttl);
    }
    let runtime = builder.build().expect("runtime");
    let mut handle = match mode.as_str() {
        "resume" => runtime.resume(run_id),
        // Every soak process delivers the same inbound message: once its turn finished, a
        // later process gets the recorded output instead of starting another turn.
        "soak" => runtime.run(
            RunRequest::new("Buy the things")
                .run_id(run_id)
                .idempotency_key("order-message")
                .wait_for_lease(Duration::from_secs(10)),
        ),
        // A restarted process waits for the killed one's lease to expire.
        _ => {
            let mut req = RunRequest::new("Buy the thing").run_id(run_id).wait_for_lease(Duration::from_secs(10));
            if let Some(n) = std::env::var("MAX_REQUESTS").ok().and_then(|v| v.parse().ok()) {
                req = req.limits(RunLimits::new().max_requests(n));
            }
            runtime.run(req)
        }
    };
    let mut results = Vec::new();
    while let Some(event) = handle.next().await {
        if let Event::ToolResult { call_id, result, is_error, .. } = event {
            results.push(json!([call_id, result, is_error]));
        }
    }
    let line = match handle.await {
        Ok(out) => {
            assert!(out.status != RunStatus::Running);
            json!({"status": out.status.as_str(), "text": out.text, "results": results})
        }
        Err(e) => {
            let kind = match &e {
                RunError::Busy { .. } => "busy",
                RunError::LeaseLost { .. } => "lease_lost",
                RunError::LimitExceeded { .. } => "limit_exceeded",
                _ => "other",
            };
            json!({"error": kind, "message": e.to_string()})
        }
    };
    say(&line.to_string());
}
