//! The bytes a run in flight holds at its first model call, counted by this test binary's
//! global allocator: a guard for what the in-flight bench measures (`docs/performance.md`,
//! "Where a start's time goes"). With 10,000 runs started at once, every byte a start keeps
//! is fresh heap the start burst pays for in page faults and arena growth.

use std::sync::{
    Arc,
    atomic::{AtomicUsize, Ordering},
};

use futures::{StreamExt, stream::BoxStream};
use kuralle::{AgentDef, Model, ModelError, ModelEvent, ModelRequest, RunHandle, RunRequest, Runtime, tool};
use tokio::sync::Notify;

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

/// Bytes a run may hold at its first model call, its handle's own allocations included (its
/// input is allocated before counting). In this test's debug build a run held 7,905 bytes
/// before the eighth pass (8ed8229, f90c6bf) and 5,747–5,824 after it: the memory store's 16
/// shards each double their tables at a point that depends on the random run ids, 5,824 when
/// all have. The in-flight bench's release build counts 5,826 a run, its own input, handle and
/// stream included.
const MAX_BYTES_AT_FIRST_CALL: usize = 6_000;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_holds_little_heap_at_its_first_model_call() {
    // Enough that the store's tables' growth is a few bytes a run.
    const RUNS: usize = 2_000;
    let all = Arc::new(Notify::new());
    let model = Silent { asked: AtomicUsize::new(0), expected: RUNS, all: Arc::clone(&all) };
    let runtime = Runtime::builder()
        .agent(AgentDef::new("bench", "Count.").tool(Inc).max_steps(4))
        .model(model)
        .build()
        .expect("build the runtime");
    // Held as a service holds them; their vector is made before counting.
    let mut handles: Vec<RunHandle> = Vec::with_capacity(RUNS);
    let mut inputs: Vec<RunRequest> = (0..RUNS).map(|i| RunRequest::new(format!("run {i}"))).collect();
    let before = heap_count::live();
    // Drained, not consumed: the vector's buffer is freed only after counting.
    for request in inputs.drain(..) {
        handles.push(runtime.run(request));
    }
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
