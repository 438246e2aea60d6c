//! A worker process of the multi-process tests (`tests/tests/worker_processes.rs`):
//! `worker_child STORE LEDGER` serves the store (`sqlite:PATH` or `postgres:SCHEMA`) with the
//! payment agent of `kuralle_tests::workers` until SIGTERM, then prints
//! `REPORT <claimed> <completed> <retried> <lost> <handed_back>`. It prints `READY` once
//! serving.
//!
//! Environment: `LEASE_TTL_MS` (default 3000), `MAX_RUNS` (default 8), `POLL_MS` (default
//! 50), `PAY_MS` (a fixed payment duration).

use std::path::PathBuf;
use std::time::Duration;

use kuralle::WorkerOptions;
use tokio::signal::unix::{SignalKind, signal};

fn env_u64(name: &str, default: u64) -> u64 {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let mut args = std::env::args().skip(1);
    let (Some(spec), Some(ledger)) = (args.next(), args.next()) else {
        eprintln!("usage: worker_child STORE LEDGER");
        std::process::exit(2);
    };
    let store = kuralle_tests::workers::open_store(&spec).await;
    let pay = std::env::var("PAY_MS").ok().and_then(|v| v.parse().ok()).map(Duration::from_millis);
    let ttl = Duration::from_millis(env_u64("LEASE_TTL_MS", 3000));
    let runtime = kuralle_tests::workers::runtime(store, &PathBuf::from(ledger), ttl, pay);
    let options = WorkerOptions {
        max_concurrent_runs: env_u64("MAX_RUNS", 8) as usize,
        poll_interval: Duration::from_millis(env_u64("POLL_MS", 50)),
        shutdown_grace: Duration::from_secs(5),
        retry_backoff: Duration::from_millis(200),
    };
    let mut term = signal(SignalKind::terminate()).expect("SIGTERM handler");
    println!("READY");
    let report = runtime
        .serve_with(
            async move {
                term.recv().await;
            },
            options,
        )
        .await
        .expect("serve ends cleanly");
    println!(
        "REPORT {} {} {} {} {}",
        report.claimed, report.completed, report.retried, report.lost, report.handed_back
    );
}
