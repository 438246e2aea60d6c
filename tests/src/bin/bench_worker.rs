//! A worker process of the PostgreSQL in-flight bench (`benches/in_flight_pg.rs`):
//! `bench_worker SCHEMA LATENCY_MS RUNS MAX_RUNS` connects to `DATABASE_URL` on SCHEMA, builds
//! the in-flight workload's runtime (`kuralle_tests::in_flight`), prints `READY`, and on a line
//! `GO` on stdin serves the queue (`Runtime::serve_with`, up to MAX_RUNS runs at once) until
//! the next line (or the end of stdin). It then prints one line
//! `REPORT key=value ...`: its serve report, what it wrote (`CountingStore`), its CPU time
//! while serving, and the added latency per turn of the runs it drove.
//!
//! RUNS is the number of runs in the bench (their inputs are `run 0` .. `run RUNS-1`).
//! Environment: `POOL` (PostgreSQL connections, default the store's 16).

use std::sync::Arc;
use std::time::Duration;

use kuralle::WorkerOptions;
use kuralle::stores::{PostgresOptions, PostgresStore};
use kuralle::testing::CountingStore;
use kuralle_tests::in_flight::{Turns, process_cpu, runtime};
use tokio::io::{AsyncBufReadExt, BufReader};

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [schema, latency, runs, max_runs] = args.as_slice() else {
        eprintln!("usage: bench_worker SCHEMA LATENCY_MS RUNS MAX_RUNS");
        std::process::exit(2);
    };
    let number = |v: &str| v.parse::<u64>().unwrap_or_else(|_| panic!("not a number: {v}"));
    let latency = Duration::from_millis(number(latency));
    let (runs, max_runs) = (number(runs) as usize, number(max_runs) as usize);
    let url = std::env::var("DATABASE_URL").expect("DATABASE_URL");
    let mut options = PostgresOptions { schema: schema.clone(), ..PostgresOptions::default() };
    if let Ok(pool) = std::env::var("POOL") {
        options.max_connections = number(&pool) as usize;
    }
    let store = PostgresStore::connect_with(&url, options).await.expect("the PostgreSQL store connects");
    let counting = CountingStore::new(Arc::new(store));
    let turns = Turns::new(runs, latency);
    let rt = runtime(Arc::new(counting.clone()), Arc::clone(&turns));

    let mut stdin = BufReader::new(tokio::io::stdin()).lines();
    println!("READY");
    let go = stdin.next_line().await.expect("stdin");
    assert_eq!(go.as_deref(), Some("GO"), "the bench says GO");
    let cpu = process_cpu();
    let options = WorkerOptions {
        max_concurrent_runs: max_runs,
        poll_interval: Duration::from_millis(50),
        ..WorkerOptions::default()
    };
    let report = rt
        .serve_with(
            async move {
                let _ = stdin.next_line().await;
            },
            options,
        )
        .await
        .expect("serve ends cleanly");
    let cpu = process_cpu().saturating_sub(cpu);
    let counts = counting.counts();
    let (p50, p99) = (turns.added_us(0.5).unwrap_or(0.0), turns.added_us(0.99).unwrap_or(0.0));
    println!(
        "REPORT claimed={} completed={} retried={} lost={} steps={} writes={} renewals={} renewal_requests={} cpu_ms={} p50_us={p50:.0} p99_us={p99:.0}",
        report.claimed,
        report.completed,
        report.retried,
        report.lost,
        counts.steps,
        counts.writes,
        counts.renewals,
        counts.renewal_requests,
        cpu.as_millis(),
    );
}
