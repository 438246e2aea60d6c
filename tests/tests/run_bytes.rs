//! The bytes a run in flight holds at its first model call, and while its closing write
//! waits, counted by this test binary's global allocator: guards for what the in-flight bench
//! measures (`docs/performance.md`, "Where a start's time goes" and "Twentieth pass"). With
//! 10,000 runs started at once, every byte a start keeps is fresh heap the start burst pays for
//! in page faults and arena growth.

use std::sync::{
    Arc,
    atomic::{AtomicUsize, Ordering},
};

use futures::{StreamExt, stream::BoxStream};
use kuralle::{
    AgentDef, FinishReason, Message, Model, ModelError, ModelEvent, ModelRequest, RunHandle, RunRequest, Runtime,
    ToolCallRequest, Usage, stores::MemoryStore, tool,
};
use kuralle_tests::FlakyStore;
use tokio::sync::Notify;

/// The heap count is the whole process's: the tests of this binary take turns, each on a
/// runtime of its own that is gone, its runs freed, before the next counts.
static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// Runs `test` on a Tokio runtime of two workers, alone in this binary; the runtime, and
/// every run left on it, is dropped before the next test starts.
fn alone<F: Future<Output = ()>>(test: impl FnOnce() -> F) {
    let _turn = ONE_AT_A_TIME.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build();
    runtime.expect("a Tokio runtime").block_on(test());
}

#[global_allocator]
static HEAP: heap_count::Counting = heap_count::Counting;

/// Add one.
#[tool]
async fn inc(
    /// The number.
    x: u64,
) -> u64 {
    x + 1
}

/// A model that never answers: every run stops at its first request. It counts the requests
/// and wakes the test when all have come.
struct Silent {
    asked: AtomicUsize,
    expected: usize,
    all: Arc<Notify>,
}

impl Model for Silent {
    fn name(&self) -> &str {
        "silent"
    }

    fn stream(&self, _request: ModelRequest) -> BoxStream<'static, Result<ModelEvent, ModelError>> {
        if self.asked.fetch_add(1, Ordering::SeqCst) + 1 == self.expected {
            self.all.notify_one();
        }
        futures::stream::pending().boxed()
    }
}

/// A model that answers at once, as the in-flight bench's does after its latency: three
/// one-call turns, then a text answer, chosen by the assistant messages in the transcript. It
/// keeps no request (`ScriptedModel` keeps them all, and so every run's transcript).
struct Counted;

impl Model for Counted {
    fn name(&self) -> &str {
        "counted"
    }

    fn stream(&self, request: ModelRequest) -> BoxStream<'static, Result<ModelEvent, ModelError>> {
        let turn = request.messages.iter().filter(|m| matches!(m, Message::Assistant { .. })).count();
        let usage = Usage { input_tokens: 10, output_tokens: 5, ..Usage::default() };
        let events = if turn < 3 {
            let call = ToolCallRequest {
                call_id: format!("call_{turn}").into(),
                name: "inc".into(),
                arguments: format!(r#"{{"x":{turn}}}"#),
            };
            vec![ModelEvent::ToolCall(call), ModelEvent::Finish { reason: FinishReason::ToolCalls, usage }]
        } else {
            let done = ModelEvent::TextDelta { delta: "done".to_owned() };
            vec![done, ModelEvent::Finish { reason: FinishReason::Stop, usage }]
        };
        futures::stream::iter(events.into_iter().map(Ok)).boxed()
    }
}

/// Starts `runs` runs (inputs "run 0", "run 1", ...) and hands each handle to `keep`; returns
/// what `keep` gave back, the heap count before the first start, and the inputs' emptied
/// vector. What the runs hold is counted alone: their inputs and the vector kept are made
/// before counting, and the inputs' buffer is freed by the caller only after it has counted.
fn start<T>(runtime: &Runtime, runs: usize, keep: impl FnMut(RunHandle) -> T) -> (Vec<T>, usize, Vec<RunRequest>) {
    let mut kept = Vec::with_capacity(runs);
    let mut inputs: Vec<RunRequest> = (0..runs).map(|i| RunRequest::new(format!("run {i}"))).collect();
    let before = heap_count::live();
    // Drained, not consumed: the vector's buffer is freed only after counting.
    kept.extend(inputs.drain(..).map(|request| runtime.run(request)).map(keep));
    (kept, before, inputs)
}

/// Bytes a run may hold at its first model call, its handle's own allocations included (its
/// input is allocated before counting). In this test's debug build a run held 7,905 bytes
/// before the eighth pass (8ed8229, f90c6bf) and 5,747–5,824 after it: the memory store's 16
/// shards each double their tables at a point that depends on the random run ids, 5,824 when
/// all have. The in-flight bench's release build counts 5,826 a run, its own input, handle and
/// stream included. The twenty-first pass (a run's task 1,024 bytes instead of 1,408, its turn's
/// context sharing its agent's tools and policy, short names inline) made it 4,858–4,889; the
/// twenty-second (a run's task 896 bytes) 4,730–4,761.
const MAX_BYTES_AT_FIRST_CALL: usize = 5_000;

#[test]
fn a_run_holds_little_heap_at_its_first_model_call() {
    alone(first_model_call);
}

async fn first_model_call() {
    // Enough that the store's tables' growth is a few bytes a run.
    const RUNS: usize = 2_000;
    let all = Arc::new(Notify::new());
    let model = Silent { asked: AtomicUsize::new(0), expected: RUNS, all: Arc::clone(&all) };
    let runtime = Runtime::builder()
        .agent(AgentDef::new("bench", "Count.").tool(Inc).max_steps(4))
        .model(model)
        .build()
        .expect("build the runtime");
    // Held as a service holds them.
    let (handles, before, inputs) = start(&runtime, RUNS, |handle| handle);
    // Bounded: a run that failed before its model call would otherwise leave this waiting.
    tokio::time::timeout(std::time::Duration::from_secs(60), all.notified())
        .await
        .expect("every run reached its model within a minute");
    let per_run = (heap_count::live() - before) / RUNS;
    drop(inputs);
    println!("a run holds {per_run} bytes at its first model call");
    assert!(
        per_run <= MAX_BYTES_AT_FIRST_CALL,
        "a run holds {per_run} bytes at its first model call, more than {MAX_BYTES_AT_FIRST_CALL}"
    );
    for handle in &handles {
        handle.interrupt();
    }
}

/// Bytes a run may hold while its closing write waits, with what the memory store keeps of it
/// (its row and its journal of seven steps) and the task that awaits it. In this test's debug
/// build a run held 11,102–11,133 bytes there while the close kept its state decoded (the
/// transcript, and the journal's cache of its steps), and 8,544–8,576 since it keeps only the
/// state's text (a0dd959): at 10,000 runs in flight on SQLite, every run's close waited in the
/// writer's queue at once. After the twenty-first pass, 8,265–8,312; after the twenty-second
/// (the close no longer keeps its closing's fields twice, a run's task 896 bytes), 7,352.
const MAX_BYTES_WHILE_CLOSING: usize = 8_000;

#[test]
fn a_closing_run_holds_its_states_text_not_its_transcript() {
    alone(closing);
}

async fn closing() {
    const RUNS: usize = 2_000;
    let store = FlakyStore::new(Arc::new(MemoryStore::new()));
    store.hold_closes();
    let runtime = Runtime::builder()
        .agent(AgentDef::new("bench", "Count.").tool(Inc).max_steps(8))
        .model(Counted)
        .store_arc(Arc::new(store.clone()))
        .build()
        .expect("build the runtime");
    // Awaited, as a service awaits its runs: their events are not kept for a listener.
    let (runs, before, inputs) =
        start(&runtime, RUNS, |handle| tokio::spawn(std::future::IntoFuture::into_future(handle)));
    let waited = tokio::time::timeout(std::time::Duration::from_secs(60), async {
        while store.closes_waiting() < RUNS {
            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        }
    })
    .await;
    let per_run = (heap_count::live() - before) / RUNS;
    store.release_closes();
    waited.expect("every run reached its close within a minute");
    drop(inputs);
    for run in runs {
        let out = run.await.expect("the run's task").expect("the run");
        assert_eq!(out.text, "done");
    }
    println!("a run holds {per_run} bytes while its close waits");
    assert!(
        per_run <= MAX_BYTES_WHILE_CLOSING,
        "a run holds {per_run} bytes while its close waits, more than {MAX_BYTES_WHILE_CLOSING}"
    );
}
