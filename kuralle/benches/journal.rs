//! Journal costs: a journaled tool call is `append_steps` (intent) + `finish_step` (result),
//! two durable commits on a durable store.
//!
//! - `serial/sqlite_call` vs `serial/fdatasync`: one call at a time on `SqliteStore`, next to
//!   a raw 256-byte `write` + `fdatasync` in the same directory (printed ratio at the end).
//!   Every write is fenced by a lease token, as in the runtime (the check runs inside the
//!   write's own transaction: no extra commit).
//! - `serial/sqlite_call_1mb_state`: the same on a run whose state (the conversation a session
//!   carries into its turn) is 1 MB; a call must cost the same as on a fresh run.
//! - `lease/sqlite_acquire_release`: taking and giving back a run's lease on `SqliteStore`
//!   (two durable commits), what every turn adds.
//! - `parallel64/sqlite`: 64 parallel calls (one `append_steps` of 64 intents, then 64
//!   concurrent `finish_step`), through group commit; throughput in calls/s.
//! - `memory/call`: the same serial call on `MemoryStore`.
//! - `replay/{sqlite,memory}/{1000,10000}_steps`: resuming a run whose journal holds that many
//!   steps: the journal is loaded, every finished step replays, and the one unfinished model
//!   step runs. Linear in steps means the 10,000 figure is about 10× the 1,000 one.
//!
//! - PostgreSQL rows (when `DATABASE_URL` is set): see `journal/postgres.rs`.
//!
//! `cargo bench -p kuralle --bench journal -- --warm-up-time 1 --measurement-time 3`

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use futures::FutureExt;
use kuralle::stores::{MemoryStore, SqliteStore};
use std::sync::Arc;

use kuralle::testing::{ScriptedModel, Turn};
use kuralle::{AgentDef, NewStep, RunRecord, RunRequest, RunStatus, RunStore, Runtime, StepKind, StepOutcome};
use serde_json::json;

#[path = "shared/pg_schema.rs"]
mod pg_schema;
#[path = "journal/postgres.rs"]
mod postgres;

/// A fresh run is started after this many steps so the journal does not grow without bound.
const STEPS_PER_RUN: u64 = 10_000;

fn bench_dir() -> PathBuf {
    let dir = std::env::temp_dir().join(format!("kuralle-bench-journal-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn new_run(run_id: &str) -> RunRecord {
    run_with_state(run_id, json!({}))
}

/// A run whose stored state is `state`: a long conversation a session carries into its turn.
fn run_with_state(run_id: &str, state: serde_json::Value) -> RunRecord {
    RunRecord {
        run_id: run_id.to_owned(),
        agent_id: "bench".to_owned(),
        status: RunStatus::Running,
        epoch: 0,
        version: 0,
        state: (&state).into(),
        created_at_ms: 0,
        updated_at_ms: 0,
    }
}

fn intent(i: u64) -> NewStep {
    // A realistic key: 64 hex chars, like `journal::tool_key`.
    NewStep {
        key: format!("{i:064x}"),
        kind: StepKind::Tool,
        name: "get_weather".to_owned(),
        epoch: 0,
        started_at_ms: 0,
    }
}

/// Drives serial journaled calls on one store, rotating runs.
struct Caller<S> {
    store: S,
    /// The lease token of the current run: every write is fenced, as in the runtime.
    fence: u64,
    run: u64,
    run_id: String,
    next: u64,
    calls: u64,
    result: serde_json::Value,
    /// The state each run is created with.
    state: serde_json::Value,
}

impl<S: RunStore> Caller<S> {
    async fn new(store: S) -> Self {
        let fence = store.acquire_lease("run-0", "bench", Duration::from_secs(3600)).await.unwrap().token;
        store.create_run(new_run("run-0"), fence).await.unwrap();
        let result = json!({"city": "Paris", "temperature_c": 21.5, "conditions": "sunny"});
        Self { store, fence, run: 0, run_id: "run-0".to_owned(), next: 0, calls: 0, result, state: json!({}) }
    }

    /// The same caller on a run whose state is about `bytes` long.
    async fn with_state(store: S, bytes: usize) -> Self {
        let mut caller = Self::new(store).await;
        let message = json!({"role": "user", "content": "x".repeat(1000)});
        let state = json!({"messages": vec![message; bytes / 1000]});
        let run_id = "big-state";
        caller.fence = caller.store.acquire_lease(run_id, "bench", Duration::from_secs(3600)).await.unwrap().token;
        caller.store.create_run(run_with_state(run_id, state.clone()), caller.fence).await.unwrap();
        caller.run_id = run_id.to_owned();
        caller.state = state;
        caller
    }

    async fn rotate_if_full(&mut self, calls: u64) {
        if self.next + calls > STEPS_PER_RUN {
            self.store.delete_run(&self.run_id).await.unwrap();
            self.run += 1;
            self.run_id = format!("run-{}", self.run);
            self.next = 0;
            self.fence =
                self.store.acquire_lease(&self.run_id, "bench", Duration::from_secs(3600)).await.unwrap().token;
            self.store.create_run(run_with_state(&self.run_id, self.state.clone()), self.fence).await.unwrap();
        }
    }

    async fn call(&mut self) {
        self.rotate_if_full(1).await;
        let ordinals = self.store.append_steps(&self.run_id, self.fence, vec![intent(self.next)]).await.unwrap();
        self.next += 1;
        self.calls += 1;
        // The tool's output, moved into the journal.
        let outcome = StepOutcome::Finished(kuralle::JsonText::from(&self.result));
        self.store.finish_step(&self.run_id, self.fence, ordinals[0], outcome, 1).await.unwrap();
    }

    async fn parallel_calls(&mut self, width: u64) {
        self.rotate_if_full(width).await;
        let intents = (self.next..self.next + width).map(intent).collect();
        let ordinals = self.store.append_steps(&self.run_id, self.fence, intents).await.unwrap();
        self.next += width;
        self.calls += width;
        let finishes = ordinals.iter().map(|&ordinal| {
            self.store.finish_step(
                &self.run_id,
                self.fence,
                ordinal,
                StepOutcome::Finished(kuralle::JsonText::from(&self.result)),
                1,
            )
        });
        for finished in futures::future::join_all(finishes).await {
            finished.unwrap();
        }
    }
}

fn fdatasync_file(dir: &Path) -> File {
    OpenOptions::new().create(true).append(true).open(dir.join("raw.log")).unwrap()
}

fn raw_fdatasync(file: &mut File) {
    file.write_all(&[b'x'; 256]).unwrap();
    file.sync_data().unwrap();
}

fn serial(c: &mut Criterion) {
    let dir = bench_dir();
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let store = SqliteStore::open(dir.join("serial.db")).unwrap();
    let mut caller = runtime.block_on(Caller::new(store));
    let mut file = fdatasync_file(&dir);

    let mut group = c.benchmark_group("serial");
    group.throughput(Throughput::Elements(1));
    group.bench_function("fdatasync", |b| b.iter(|| raw_fdatasync(&mut file)));
    group.bench_function("sqlite_call", |b| b.iter(|| runtime.block_on(caller.call())));
    // A session's later turns carry its conversation in the run's state: a call must not
    // rewrite that state.
    let store = SqliteStore::open(dir.join("serial-1mb.db")).unwrap();
    let mut big = runtime.block_on(Caller::with_state(store, 1 << 20));
    group.bench_function("sqlite_call_1mb_state", |b| b.iter(|| runtime.block_on(big.call())));
    group.finish();
}

fn lease(c: &mut Criterion) {
    let dir = bench_dir();
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let store = SqliteStore::open(dir.join("lease.db")).unwrap();
    let ttl = Duration::from_secs(30);
    let mut group = c.benchmark_group("lease");
    group.throughput(Throughput::Elements(1));
    group.bench_function("sqlite_acquire_release", |b| {
        b.iter(|| {
            runtime.block_on(async {
                let lease = store.acquire_lease("run-lease", "bench", ttl).await.unwrap();
                store.release_lease(&lease).await.unwrap();
            })
        })
    });
    group.finish();
}

fn parallel64(c: &mut Criterion) {
    let dir = bench_dir();
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let store = SqliteStore::open(dir.join("parallel.db")).unwrap();
    let mut caller = runtime.block_on(Caller::new(store));

    let mut group = c.benchmark_group("parallel64");
    group.throughput(Throughput::Elements(64));
    group.bench_function("sqlite", |b| b.iter(|| runtime.block_on(caller.parallel_calls(64))));
    group.finish();
    let commits = caller.store.commit_count();
    let calls = caller.calls;
    eprintln!(
        "parallel64/sqlite: {calls} journaled calls in {commits} commits ({:.1} calls per commit)",
        calls as f64 / commits as f64
    );
}

fn memory(c: &mut Criterion) {
    // MemoryStore futures are ready at their first poll: poll once, no executor needed.
    let ready = "MemoryStore futures complete at their first poll";
    let mut caller = Caller::new(MemoryStore::new()).now_or_never().expect(ready);
    let mut group = c.benchmark_group("memory");
    group.throughput(Throughput::Elements(1));
    group.bench_function("call", |b| b.iter(|| caller.call().now_or_never().expect(ready)));
    group.finish();
}

/// Medians of interleaved samples, so both see the same disk conditions; prints the ratio.
fn ratio_summary(_: &mut Criterion) {
    let dir = bench_dir();
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let store = SqliteStore::open(dir.join("ratio.db")).unwrap();
    let mut caller = runtime.block_on(Caller::new(store));
    let mut file = fdatasync_file(&dir);
    let (mut sync, mut call) = (Vec::new(), Vec::new());
    for _ in 0..400 {
        let started = Instant::now();
        raw_fdatasync(&mut file);
        sync.push(started.elapsed());
        let started = Instant::now();
        runtime.block_on(caller.call());
        call.push(started.elapsed());
    }
    let median = |samples: &mut Vec<Duration>| {
        samples.sort_unstable();
        samples[samples.len() / 2]
    };
    let (sync, call) = (median(&mut sync), median(&mut call));
    eprintln!(
        "ratio (400 interleaved samples, medians): journaled call {call:?} / fdatasync {sync:?} = {:.2}x \
         (a call is two durable commits, so 2.0x is the floor of a store that fsyncs once per commit)",
        call.as_secs_f64() / sync.as_secs_f64()
    );
    drop(caller);
    let _ = std::fs::remove_dir_all(&dir);

    // On a shared machine wall time includes waiting for a CPU: report on-CPU time as well.
    let ready = "MemoryStore futures complete at their first poll";
    let mut caller = Caller::new(MemoryStore::new()).now_or_never().expect(ready);
    let calls = 500_000;
    let (started, on_cpu) = (Instant::now(), thread_cpu_ns());
    for _ in 0..calls {
        caller.call().now_or_never().expect(ready);
    }
    let wall = started.elapsed().as_nanos() as f64 / f64::from(calls);
    match (on_cpu, thread_cpu_ns()) {
        (Some(before), Some(after)) => eprintln!(
            "memory call ({calls} calls): {wall:.0} ns wall, {:.0} ns on-CPU per call",
            (after - before) as f64 / f64::from(calls)
        ),
        _ => eprintln!("memory call ({calls} calls): {wall:.0} ns wall per call"),
    }
}

/// Nanoseconds this thread has run on a CPU (Linux `schedstat`).
fn thread_cpu_ns() -> Option<u64> {
    let stat = std::fs::read_to_string("/proc/thread-self/schedstat").ok()?;
    stat.split_whitespace().next()?.parse().ok()
}

/// A run left unfinished with `steps` journal steps: one model response with `steps - 2`
/// parallel-safe calls, all finished, and a second model step whose request failed.
async fn unfinished_run(store: Arc<dyn RunStore>, steps: usize) {
    let calls = (0..steps - 2).map(|i| (format!("c{i}"), "noop".to_owned(), format!(r#"{{"i":{i}}}"#)));
    let model = ScriptedModel::new([Turn::tool_calls(calls), Turn::error("the process died here")]);
    let err = replay_runtime(store, model).run(RunRequest::new("go").run_id("replay")).await.unwrap_err();
    assert!(err.is_retryable());
}

fn replay_runtime(store: Arc<dyn RunStore>, model: ScriptedModel) -> Runtime {
    Runtime::builder()
        .agent(AgentDef::new("replay", "x").tool(Noop).max_tool_concurrency(64).max_steps(4))
        .model(model)
        .store_arc(store)
        .max_journal_entries(100_000)
        .build()
        .unwrap()
}

/// Do nothing.
#[kuralle::tool(parallel_safe)]
async fn noop(
    /// Anything.
    i: u64,
) -> u64 {
    i
}

async fn resume_timed(store: Arc<dyn RunStore>) -> Duration {
    let model = ScriptedModel::by_transcript([Turn::text("unused"), Turn::text("done")]);
    let runtime = replay_runtime(store, model);
    let start = Instant::now();
    let out = runtime.resume("replay").await.unwrap();
    let elapsed = start.elapsed();
    assert_eq!(out.status, RunStatus::Finished);
    elapsed
}

fn replay(c: &mut Criterion) {
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let mut group = c.benchmark_group("replay");
    group.sample_size(10);
    for steps in [1_000usize, 10_000] {
        // SQLite: build the unfinished run once, copy the file for every resume.
        let template = bench_dir().join(format!("replay-{steps}.db"));
        let _ = std::fs::remove_file(&template);
        runtime.block_on(unfinished_run(Arc::new(SqliteStore::open(&template).unwrap()), steps));
        // Dropping the store checkpointed the WAL into the file.
        let mut copy = 0u64;
        group.bench_function(format!("sqlite/{steps}_steps"), |b| {
            b.iter_custom(|iters| {
                let mut total = Duration::ZERO;
                for _ in 0..iters {
                    copy += 1;
                    let path = bench_dir().join(format!("replay-{steps}-{copy}.db"));
                    std::fs::copy(&template, &path).unwrap();
                    total += runtime.block_on(resume_timed(Arc::new(SqliteStore::open(&path).unwrap())));
                    let _ = std::fs::remove_file(&path);
                }
                total
            });
        });
        group.bench_function(format!("memory/{steps}_steps"), |b| {
            b.iter_custom(|iters| {
                let mut total = Duration::ZERO;
                for _ in 0..iters {
                    let store: Arc<dyn RunStore> = Arc::new(MemoryStore::new());
                    runtime.block_on(unfinished_run(store.clone(), steps));
                    total += runtime.block_on(resume_timed(store));
                }
                total
            });
        });
    }
    group.finish();
}

criterion_group!(
    benches,
    serial,
    lease,
    parallel64,
    memory,
    replay,
    ratio_summary,
    postgres::serial,
    postgres::parallel64,
    postgres::workers
);
criterion_main!(benches);
