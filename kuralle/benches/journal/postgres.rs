//! PostgreSQL rows of the journal bench; they run only when `DATABASE_URL` is set, each in a
//! fresh schema that is dropped afterwards.
//!
//! - `serial/postgres_call` vs `serial/postgres_raw_insert`: one journaled call (two
//!   statements, two commits) next to one raw `INSERT` in autocommit (one round trip and one
//!   commit) on the same server; the interleaved ratio is printed.
//! - `parallel64/postgres`: 64 parallel calls per batch (one `append_steps`, 64 concurrent
//!   `finish_step` over the pool), in calls/s.

use std::time::{Duration, Instant};

use criterion::{Criterion, Throughput};
use kuralle::stores::{PostgresOptions, PostgresStore};

use super::Caller;

/// The server, or `None` after a notice.
pub fn database_url() -> Option<String> {
    match std::env::var("DATABASE_URL") {
        Ok(url) if !url.is_empty() => Some(url),
        _ => {
            eprintln!("postgres rows skipped: DATABASE_URL is not set");
            None
        }
    }
}

/// A fresh schema on the server, dropped when the value is dropped.
pub struct Schema {
    url: String,
    pub name: String,
}

impl Schema {
    pub fn new(url: &str, tag: &str) -> Self {
        let name = format!("kb_{tag}_{}", std::process::id());
        Self { url: url.to_owned(), name }
    }

    pub async fn store(&self) -> PostgresStore {
        let options = PostgresOptions { schema: self.name.clone(), ..PostgresOptions::default() };
        PostgresStore::connect_with(&self.url, options).await.expect("DATABASE_URL is set: the store connects")
    }

    pub async fn client(&self) -> tokio_postgres::Client {
        let (client, connection) = tokio_postgres::connect(&self.url, tokio_postgres::NoTls).await.unwrap();
        tokio::spawn(connection);
        client
    }
}

impl Drop for Schema {
    fn drop(&mut self) {
        super::pg_schema::drop_schema(&self.url, &self.name);
    }
}

/// A scratch table and a prepared one-row `INSERT` (autocommit: one round trip, one commit).
struct RawInsert {
    client: tokio_postgres::Client,
    statement: tokio_postgres::Statement,
    next: i64,
}

impl RawInsert {
    async fn new(schema: &Schema) -> Self {
        let client = schema.client().await;
        let table = format!("\"{}\".raw_insert", schema.name);
        client
            .batch_execute(&format!("CREATE TABLE IF NOT EXISTS {table} (id bigint PRIMARY KEY, body jsonb NOT NULL)"))
            .await
            .unwrap();
        let statement = client.prepare(&format!("INSERT INTO {table} (id, body) VALUES ($1, $2)")).await.unwrap();
        Self { client, statement, next: 0 }
    }

    async fn insert(&mut self) {
        self.next += 1;
        let body = serde_json::json!({"city": "Paris", "temperature_c": 21.5, "conditions": "sunny"});
        self.client.execute(&self.statement, &[&self.next, &body]).await.unwrap();
    }
}

pub fn serial(c: &mut Criterion) {
    let Some(url) = database_url() else { return };
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let schema = Schema::new(&url, "serial");
    let mut caller = runtime.block_on(async { Caller::new(schema.store().await).await });
    let mut raw = runtime.block_on(RawInsert::new(&schema));

    let mut group = c.benchmark_group("serial");
    group.throughput(Throughput::Elements(1));
    group.bench_function("postgres_raw_insert", |b| b.iter(|| runtime.block_on(raw.insert())));
    group.bench_function("postgres_call", |b| b.iter(|| runtime.block_on(caller.call())));
    group.finish();

    // Interleaved medians, so both see the same server conditions.
    let (mut inserts, mut calls) = (Vec::new(), Vec::new());
    for _ in 0..400 {
        let started = Instant::now();
        runtime.block_on(raw.insert());
        inserts.push(started.elapsed());
        let started = Instant::now();
        runtime.block_on(caller.call());
        calls.push(started.elapsed());
    }
    let median = |samples: &mut Vec<Duration>| {
        samples.sort_unstable();
        samples[samples.len() / 2]
    };
    let (insert, call) = (median(&mut inserts), median(&mut calls));
    eprintln!(
        "postgres ratio (400 interleaved samples, medians): journaled call {call:?} / raw INSERT+COMMIT {insert:?} \
         = {:.2}x (a call is two commits: intent, then result)",
        call.as_secs_f64() / insert.as_secs_f64()
    );
    drop(caller);
    drop(runtime);
}

pub fn parallel64(c: &mut Criterion) {
    let Some(url) = database_url() else { return };
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let schema = Schema::new(&url, "parallel");
    let mut caller = runtime.block_on(async { Caller::new(schema.store().await).await });
    let mut group = c.benchmark_group("parallel64");
    group.throughput(Throughput::Elements(64));
    group.bench_function("postgres", |b| b.iter(|| runtime.block_on(caller.parallel_calls(64))));
    group.finish();
    drop(caller);
    drop(runtime);
}

/// Runs per second through the work queue: 200 submitted runs (one model response with one
/// tool call, then the answer: 4 journal steps and 3 run writes each), drained by 1, 2 and 4
/// workers, each its own `serve` loop with its own connection pool, as separate processes
/// would be.
pub fn workers(_: &mut Criterion) {
    let Some(url) = database_url() else { return };
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    for workers in [1usize, 2, 4] {
        let schema = Schema::new(&url, &format!("workers{workers}"));
        let runs = 200;
        let elapsed = runtime.block_on(async {
            let submitter = queue_runtime(schema.store().await);
            for i in 0..runs {
                submitter.submit(kuralle::RunRequest::new(format!("order {i}"))).await.unwrap();
            }
            let mut stops = Vec::new();
            let mut serving = Vec::new();
            let started = Instant::now();
            for _ in 0..workers {
                let rt = queue_runtime(schema.store().await);
                let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
                let options = kuralle::WorkerOptions {
                    max_concurrent_runs: 16,
                    poll_interval: Duration::from_millis(20),
                    ..kuralle::WorkerOptions::default()
                };
                serving.push(tokio::spawn(async move {
                    rt.serve_with(
                        async {
                            let _ = stopped.await;
                        },
                        options,
                    )
                    .await
                }));
                stops.push(stop);
            }
            let store = schema.store().await;
            let finished = kuralle::RunFilter { status: Some(kuralle::RunStatus::Finished), limit: None };
            while kuralle::RunStore::list_runs(&store, finished.clone()).await.unwrap().len() < runs {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            let elapsed = started.elapsed();
            for stop in stops {
                let _ = stop.send(());
            }
            for task in serving {
                task.await.unwrap().unwrap();
            }
            elapsed
        });
        eprintln!(
            "postgres workers={workers}: {runs} runs in {:.2} s = {:.0} runs/s",
            elapsed.as_secs_f64(),
            runs as f64 / elapsed.as_secs_f64()
        );
    }
}

fn queue_runtime(store: PostgresStore) -> kuralle::Runtime {
    use kuralle::testing::{ScriptedModel, Turn};
    let model = ScriptedModel::by_transcript([Turn::tool_calls([("c1", "noop", r#"{"i":1}"#)]), Turn::text("done")]);
    kuralle::Runtime::builder()
        .agent(kuralle::AgentDef::new("bench", "x").tool(super::Noop))
        .model(model)
        .store(store)
        .build()
        .unwrap()
}
