//! Per-call runtime overhead of dispatch: one `ScriptedModel` turn with N trivial
//! parallel-safe calls (limit = N), against calling the fn directly N times.
//!
//! `cargo bench -p kuralle --bench dispatch`
//!
//! The overhead per call is `(run(N) - run(0)) / N - direct`, where `run(0)` is the same turn
//! without calls (model, journal and run bookkeeping) and `direct` is one direct fn call.

use std::{
    hint::black_box,
    sync::atomic::{AtomicU64, Ordering},
    time::{Duration, Instant},
};

use criterion::{Criterion, criterion_group, criterion_main};
use kuralle::{
    AgentDef, RunStatus, Runtime,
    testing::{ScriptedModel, Turn},
    tool,
};

static EXECUTED: AtomicU64 = AtomicU64::new(0);

/// Add one.
#[tool(parallel_safe)]
async fn inc(
    /// The number.
    x: u64,
) -> u64 {
    EXECUTED.fetch_add(1, Ordering::Relaxed);
    x + 1
}

fn turn(n: usize) -> Vec<Turn> {
    if n == 0 {
        return vec![Turn::text("done")];
    }
    let calls = (0..n).map(|i| (format!("call_{i}"), "inc".to_owned(), format!(r#"{{"x":{i}}}"#)));
    vec![Turn::tool_calls(calls), Turn::text("done")]
}

/// Times one run of a turn with `n` calls; setup (runtime, script) is not timed.
async fn one_run(n: usize) -> Duration {
    let runtime = Runtime::builder()
        .agent(AgentDef::new("bench", "x").tool(Inc).max_tool_concurrency(n.max(1)).max_steps(4))
        .model(ScriptedModel::new(turn(n)))
        .build()
        .unwrap();
    let before = EXECUTED.load(Ordering::Relaxed);
    let start = Instant::now();
    let out = runtime.run("go").await.unwrap();
    let elapsed = start.elapsed();
    assert_eq!(out.status, RunStatus::Finished);
    assert_eq!(EXECUTED.load(Ordering::Relaxed) - before, n as u64, "every call executed, none rejected");
    elapsed
}

fn bench(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let mut group = c.benchmark_group("dispatch");
    group.bench_function("direct_call", |b| b.to_async(&rt).iter(|| async { black_box(inc(black_box(41)).await) }));
    for n in [0usize, 1, 8, 64, 256] {
        group.bench_function(format!("turn_with_{n}_calls"), |b| {
            b.to_async(&rt).iter_custom(|iters| async move {
                let mut total = Duration::ZERO;
                for _ in 0..iters {
                    total += one_run(n).await;
                }
                total
            });
        });
    }
    group.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default().sample_size(30).warm_up_time(Duration::from_secs(1)).measurement_time(Duration::from_secs(3));
    targets = bench
}
criterion_main!(benches);
