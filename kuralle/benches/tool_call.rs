//! The cost of calling a trivial 3-field tool through `Tool` (validation from a raw
//! `serde_json::Value`, the call, serializing the result, collecting the outcome) versus
//! calling the fn directly.

use std::hint::black_box;

use criterion::{Criterion, criterion_group, criterion_main};
use futures::StreamExt;
use kuralle::{Tool, ToolContext, ToolEvent, tool};

/// Add three numbers.
#[tool]
async fn add3(a: i64, b: i64, label: String) -> String {
    format!("{label}: {}", a + b)
}

fn bench(c: &mut Criterion) {
    let args = serde_json::json!({"a": 1, "b": 2, "label": "sum"});
    let ctx = ToolContext::detached();
    let mut group = c.benchmark_group("tool_call");
    group.bench_function("direct_fn", |b| {
        b.iter(|| {
            let out = futures::executor::block_on(add3(black_box(1), black_box(2), black_box("sum".to_owned())));
            black_box(out)
        });
    });
    group.bench_function("through_tool_execute", |b| {
        b.iter(|| {
            let stream = Add3.execute(black_box(&args), ctx.clone());
            let events: Vec<ToolEvent> = futures::executor::block_on(stream.collect());
            black_box(events)
        });
    });
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
