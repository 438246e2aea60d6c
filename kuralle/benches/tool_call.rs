//! The cost of invoking a trivial 3-field tool, next to what the same work costs written by
//! hand with serde_json (the floor), in the same run.
//!
//! - `direct_fn`: the fn alone.
//! - `serde_floor`: raw argument text → the typed arguments (`serde_json::from_str` into a
//!   derived struct) → the fn → the result as a `serde_json::Value`.
//!
//! Both paths start from the text as a model client hands it over, an owned `String` (made
//! outside the measurement), and drop it when done: the runtime moves the model's `String` into
//! [`RawArgs`], and a hand-written loop drops its own.
//! - `from_raw_json`: what the runtime does to invoke a model's call (`dispatch::plan`):
//!   `RawArgs` over the raw text, `Tool::prepare_raw` (the text validated straight into the
//!   typed arguments; `#[tool]` builds no `Value`), `Tool::parallel_safe_raw`, the call, the
//!   result serialized, the outcome collected. Not included, as before: the journal key
//!   (journaling, not invocation), which the runtime now derives from the text too.
//! - `from_raw_json_with_key`: the same plus that key (`journal::tool_key_raw`: the text
//!   canonicalized and hashed with SHA-256), everything the runtime does with the text of a
//!   journaled call short of the journal's own writes.
//! - `through_tool_execute`: the same from an already-parsed `Value`.
//!
//! `cargo bench -p kuralle --bench tool_call` prints criterion's times and, at the end, the
//! ratio `from_raw_json / serde_floor` measured interleaved in the same run.
//! `KURALLE_TOOL_CALL_ONLY=floor|raw|keyed cargo bench -p kuralle --bench tool_call` runs 100,000
//! iterations of one of them and exits, for callgrind, counting only the measured function
//! (not the making of its input): `KURALLE_TOOL_CALL_ONLY=raw valgrind --tool=callgrind
//! --toggle-collect='tool_call::measured' target/release/deps/tool_call-*`.

use std::{
    hint::black_box,
    time::{Duration, Instant},
};

use criterion::{BatchSize::SmallInput, Criterion, criterion_group};
use futures::{FutureExt, StreamExt};
use kuralle::{RawArgs, Tool, ToolContext, ToolError, ToolEvent, tool};
use serde::Deserialize;
use serde_json::Value;

/// Add three numbers.
#[tool]
async fn add3(a: i64, b: i64, label: String) -> String {
    format!("{label}: {}", a + b)
}

/// The hand-written equivalent of the generated argument struct.
#[derive(Deserialize)]
struct Add3Args {
    a: i64,
    b: i64,
    label: String,
}

const RAW: &str = r#"{"a": 1, "b": 2, "label": "sum"}"#;

/// The text as a model client hands it over.
fn input() -> String {
    black_box(RAW).to_owned()
}

/// One call of the path `which` names, alone, for `callgrind --toggle-collect`.
#[inline(never)]
fn measured(which: &str, raw: String, ctx: &ToolContext) {
    match which {
        "floor" => drop(black_box(serde_floor(raw))),
        "keyed" => drop(black_box(from_raw_json_with_key(raw, ctx))),
        _ => drop(black_box(from_raw_json(raw, ctx))),
    }
}

fn serde_floor(raw: String) -> Value {
    let args: Add3Args = serde_json::from_str(&raw).unwrap();
    let out = add3(args.a, args.b, args.label).now_or_never().unwrap();
    serde_json::to_value(out).unwrap()
}

fn from_raw_json(raw: String, ctx: &ToolContext) -> Result<Value, ToolError> {
    // The runtime moves the model's `String` in.
    let args = RawArgs::new(raw);
    let call = Add3.prepare_raw(&args)?;
    black_box(Add3.parallel_safe_raw(&args));
    run(call.execute(ctx.clone()))
}

fn from_raw_json_with_key(raw: String, ctx: &ToolContext) -> Result<Value, ToolError> {
    let args = RawArgs::new(raw);
    let call = Add3.prepare_raw(&args)?;
    black_box(Add3.parallel_safe_raw(&args));
    let key = kuralle::journal::tool_key_raw("run-1", 0, 0, "add3", args.text())
        .map_err(|e| ToolError::invalid_input("add3", e.to_string()))?;
    black_box(key);
    run(call.execute(ctx.clone()))
}

fn run(mut events: kuralle::ToolStream) -> Result<Value, ToolError> {
    loop {
        match events.next().now_or_never().flatten() {
            Some(ToolEvent::Outcome(out)) => return out,
            Some(ToolEvent::Progress(_)) => {}
            None => return Err(ToolError::failed("add3", "no outcome")),
        }
    }
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
    group.bench_function("serde_floor", |b| b.iter_batched(input, |raw| black_box(serde_floor(raw)), SmallInput));
    group.bench_function("from_raw_json", |b| {
        b.iter_batched(input, |raw| black_box(from_raw_json(raw, &ctx)), SmallInput)
    });
    group.bench_function("from_raw_json_with_key", |b| {
        b.iter_batched(input, |raw| black_box(from_raw_json_with_key(raw, &ctx)), SmallInput)
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

/// `from_raw_json / serde_floor`, from interleaved batches in one run (medians), so machine
/// load affects both sides alike.
fn ratio_summary(_: &mut Criterion) {
    let ctx = ToolContext::detached();
    let (mut floor, mut raw) = (Vec::new(), Vec::new());
    for _ in 0..200 {
        let inputs: Vec<String> = (0..200).map(|_| input()).collect();
        let start = Instant::now();
        for text in inputs {
            black_box(serde_floor(text));
        }
        floor.push(start.elapsed());
        let inputs: Vec<String> = (0..200).map(|_| input()).collect();
        let start = Instant::now();
        for text in inputs {
            let _ = black_box(from_raw_json(text, &ctx));
        }
        raw.push(start.elapsed());
    }
    let median = |v: &mut Vec<Duration>| {
        v.sort();
        v[v.len() / 2] / 200
    };
    let (floor, raw) = (median(&mut floor), median(&mut raw));
    println!(
        "ratio (200 interleaved batches of 200, medians): from_raw_json {raw:?} / serde_floor {floor:?} = {:.2}x",
        raw.as_secs_f64() / floor.as_secs_f64()
    );
}

criterion_group!(benches, bench, ratio_summary);

fn main() {
    if let Ok(which) = std::env::var("KURALLE_TOOL_CALL_ONLY") {
        let ctx = ToolContext::detached();
        for _ in 0..100_000 {
            measured(&which, input(), &ctx);
        }
        return;
    }
    benches();
    Criterion::default().configure_from_args().final_summary();
}
