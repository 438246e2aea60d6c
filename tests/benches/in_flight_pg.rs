//! Runs in flight on PostgreSQL, driven by worker processes (issue 27): the workload of
//! `kuralle/benches/in_flight.rs` (N runs, each three one-call turns and an answer, the model
//! answering after a fixed latency), submitted to a fresh schema and served by 1, 2 or 4
//! `bench_worker` processes (`Runtime::serve_with`, each taking up to ⌈N / workers⌉ runs).
//!
//! `DATABASE_URL=postgres://postgres@127.0.0.1:5432/test cargo bench -p kuralle-tests --bench
//! in_flight_pg -- [--runs 1000,10000] [--workers 1,2,4] [--latency-ms 100] [--cap-s 300]`
//! prints a Markdown table; per configuration:
//! - wall time from `GO` (all runs submitted, every worker connected) until no run is left
//!   running, and wall / ideal (4 × latency);
//! - runs/s, journal writes/s (step records: 10 per run), journaled calls/s per worker
//!   (3 per run, over the wall time, over the workers);
//! - server transactions (`pg_stat_database.xact_commit` of the database, every session's:
//!   reads, the bench's polling and other sessions included) per store write call the
//!   workers made: each write is one statement, one round trip and one transaction of its
//!   own (the store's pool lends a connection to one operation at a time), and WAL flushes (`pg_stat_wal.wal_sync`) per
//!   transaction: below 1, commits share a flush (PostgreSQL's group commit);
//! - CPU, in cores busy over the wall time: the PostgreSQL server's processes (from
//!   `/proc`, every `postgres` process of this machine) and the workers';
//! - added latency per turn p50 / p99 (request to next request, less the model's latency),
//!   the worst worker's;
//! - leases renewed, and the renewal requests that carried them;
//! - runs submitted a second before the clock starts (one submitting runtime, 32 `submit`
//!   calls in flight at a time).
//!
//! The schema of each configuration is dropped after it. The server is shared: its counters
//! include other sessions' work while the bench runs (note the load).

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt;
use kuralle::stores::{PostgresOptions, PostgresStore};
use kuralle::{RunRequest, RunStore};
use kuralle_tests::in_flight::{CALLS, Turns, cpu_of_stat, runtime};
use kuralle_tests::postgres::{SchemaGuard, connect, unique_schema};

/// A worker process, its stdin (GO, then stop) and stdout (READY, then REPORT).
struct Worker {
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
}

impl Worker {
    fn start(schema: &str, latency_ms: u64, runs: usize, max_runs: usize) -> Self {
        let mut child = Command::new(env!("CARGO_BIN_EXE_bench_worker"))
            .args([schema, &latency_ms.to_string(), &runs.to_string(), &max_runs.to_string()])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("the worker starts");
        let stdin = child.stdin.take().unwrap();
        let mut stdout = BufReader::new(child.stdout.take().unwrap());
        let mut line = String::new();
        stdout.read_line(&mut line).unwrap();
        assert_eq!(line.trim(), "READY", "the worker connected");
        Self { child, stdin, stdout }
    }

    fn say(&mut self, line: &str) {
        writeln!(self.stdin, "{line}").and_then(|()| self.stdin.flush()).expect("the worker reads its stdin");
    }

    /// Stops it; its report as `key=value` pairs.
    fn stop(mut self) -> Vec<(String, f64)> {
        self.say("STOP");
        let mut line = String::new();
        while self.stdout.read_line(&mut line).unwrap() > 0 {
            if let Some(report) = line.trim().strip_prefix("REPORT ") {
                let _ = self.child.wait();
                return report
                    .split_whitespace()
                    .filter_map(|kv| kv.split_once('='))
                    .map(|(k, v)| (k.to_owned(), v.parse().unwrap_or(0.0)))
                    .collect();
            }
            line.clear();
        }
        panic!("the worker ended without a report");
    }
}

fn field(report: &[(String, f64)], key: &str) -> f64 {
    report.iter().find(|(k, _)| k == key).map_or(0.0, |(_, v)| *v)
}

/// CPU time of every `postgres` process of this machine (the server's backends, writers,
/// checkpointer); processes that ended in between are not counted.
fn server_cpu() -> Duration {
    let Ok(dir) = std::fs::read_dir("/proc") else { return Duration::ZERO };
    dir.filter_map(Result::ok)
        .filter(|e| e.file_name().to_str().is_some_and(|n| n.bytes().all(|b| b.is_ascii_digit())))
        .filter(|e| std::fs::read_to_string(e.path().join("comm")).is_ok_and(|c| c.trim() == "postgres"))
        .filter_map(|e| std::fs::read_to_string(e.path().join("stat")).ok())
        .map(|stat| cpu_of_stat(&stat))
        .sum()
}

/// The server's counters: transactions committed in this database, WAL flushes (cluster).
async fn server_counters(client: &tokio_postgres::Client) -> (i64, i64) {
    let row = client
        .query_one(
            "SELECT (SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()), \
             (SELECT wal_sync FROM pg_stat_wal)",
            &[],
        )
        .await
        .expect("the server's statistics");
    (row.get(0), row.get(1))
}

struct Row {
    /// How long submitting the runs took, before the clock.
    submitted: Duration,
    workers: usize,
    runs: usize,
    latency_ms: u64,
    wall: Duration,
    finished: i64,
    steps: f64,
    writes: f64,
    renewals: f64,
    renewal_requests: f64,
    xacts: i64,
    syncs: i64,
    server_cpu: Duration,
    worker_cpu: Duration,
    p50_us: f64,
    p99_us: f64,
}

async fn one(url: &str, workers: usize, runs: usize, latency_ms: u64, cap: Duration) -> Row {
    let schema = unique_schema("inflight");
    let _guard = SchemaGuard { url: url.to_owned(), schema: schema.clone() };
    let options = PostgresOptions { schema: schema.clone(), ..PostgresOptions::default() };
    let store: Arc<dyn RunStore> =
        Arc::new(PostgresStore::connect_with(url, options).await.expect("the bench store connects"));
    // Submitted before the clock starts: the runs wait, runnable, for the workers.
    let submitter = runtime(store, Turns::new(0, Duration::ZERO));
    let submitting = Instant::now();
    let submitted = futures::stream::iter(0..runs)
        .map(|i| submitter.submit(RunRequest::new(format!("run {i}"))))
        .buffer_unordered(32)
        .collect::<Vec<_>>()
        .await;
    let submitted_in = submitting.elapsed();
    for s in submitted {
        s.expect("the run is submitted");
    }
    let per_worker = runs.div_ceil(workers);
    let mut procs: Vec<Worker> = (0..workers).map(|_| Worker::start(&schema, latency_ms, runs, per_worker)).collect();
    let client = connect(url).await.expect("a statistics connection");
    // Polled: whether any run is still running, an index-only scan of the partial index of
    // running runs (0.3–0.6 ms by `EXPLAIN ANALYZE` at 10,000, down to none left running). The
    // count of finished runs, polled before, visited every finished row: 55 ms a poll once
    // 10,000 had finished, server time spent beside the workers' statements. Counted once, at
    // the end.
    let running = format!("SELECT EXISTS (SELECT 1 FROM \"{schema}\".kuralle_runs WHERE status = 'running')");
    let count = format!("SELECT count(*) FROM \"{schema}\".kuralle_runs WHERE status = 'finished'");
    let (xacts_before, syncs_before) = server_counters(&client).await;
    let cpu_before = server_cpu();
    let start = Instant::now();
    for w in &mut procs {
        w.say("GO");
    }
    while start.elapsed() < cap {
        tokio::time::sleep(Duration::from_millis(20)).await;
        if !client.query_one(&running, &[]).await.expect("poll for running runs").get::<_, bool>(0) {
            break;
        }
    }
    let wall = start.elapsed();
    // Before the workers' backends exit with their CPU time, and before the count below.
    let server_cpu = server_cpu().saturating_sub(cpu_before);
    let finished: i64 = client.query_one(&count, &[]).await.expect("count finished runs").get(0);
    let reports: Vec<Vec<(String, f64)>> = procs.into_iter().map(Worker::stop).collect();
    // A backend reports its statistics when it exits at the latest.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let (xacts_after, syncs_after) = server_counters(&client).await;
    let sum = |k: &str| reports.iter().map(|r| field(r, k)).sum::<f64>();
    let max = |k: &str| reports.iter().map(|r| field(r, k)).fold(0.0, f64::max);
    Row {
        submitted: submitted_in,
        workers,
        runs,
        latency_ms,
        wall,
        finished,
        steps: sum("steps"),
        writes: sum("writes"),
        renewals: sum("renewals"),
        renewal_requests: sum("renewal_requests"),
        xacts: xacts_after - xacts_before,
        syncs: syncs_after - syncs_before,
        server_cpu,
        worker_cpu: Duration::from_millis(sum("cpu_ms") as u64),
        p50_us: max("p50_us"),
        p99_us: max("p99_us"),
    }
}

fn print_row(r: &Row) {
    let wall = r.wall.as_secs_f64();
    let ideal = (CALLS + 1) as f64 * r.latency_ms as f64 / 1e3;
    let calls = (CALLS * r.runs) as f64;
    let done = if r.finished < r.runs as i64 {
        format!(" (**{} of {} finished**)", r.finished, r.runs)
    } else {
        String::new()
    };
    println!(
        "| {} | {} | {} ms | {:.2} s{done} | {:.2}× | {:.0} | {:.0} | {:.0} | {:.0} | {:.2} | {:.2} | {:.2} | {:.2} | {:.1} / {:.1} ms | {} / {} | {:.0} |",
        r.workers,
        r.runs,
        r.latency_ms,
        wall,
        wall / ideal,
        r.runs as f64 / wall,
        r.steps / wall,
        calls / wall / r.workers as f64,
        r.writes / wall,
        r.xacts as f64 / r.writes.max(1.0),
        r.syncs as f64 / r.xacts.max(1) as f64,
        r.server_cpu.as_secs_f64() / wall,
        r.worker_cpu.as_secs_f64() / wall,
        r.p50_us / 1e3,
        r.p99_us / 1e3,
        r.renewals,
        r.renewal_requests,
        r.runs as f64 / r.submitted.as_secs_f64(),
    );
}

fn list<T: std::str::FromStr>(s: &str) -> Vec<T> {
    s.split(',').map(|v| v.trim().parse().unwrap_or_else(|_| panic!("not a number: {v}"))).collect()
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let value = |flag: &str| args.iter().position(|a| a == flag).and_then(|i| args.get(i + 1)).cloned();
    let Some(url) = kuralle_tests::postgres::database_url("the in_flight_pg bench") else { return };
    let runs: Vec<usize> = value("--runs").map_or_else(|| vec![1_000, 10_000], |v| list(&v));
    let workers: Vec<usize> = value("--workers").map_or_else(|| vec![1, 2, 4], |v| list(&v));
    let latencies: Vec<u64> = value("--latency-ms").map_or_else(|| vec![100], |v| list(&v));
    let cap = Duration::from_secs(value("--cap-s").map_or(300, |v| v.parse().expect("--cap-s is seconds")));
    println!(
        "runs in flight on PostgreSQL, served by worker processes (2 Tokio threads, a pool of 16 connections each); \
         each run {CALLS} one-call turns and an answer"
    );
    println!(
        "| workers | runs | model latency | wall | wall / ideal | runs/s | journal writes/s | journaled calls/s per worker | store writes/s | server transactions (reads included) per store write | WAL flushes per transaction | server CPU (cores) | workers' CPU (cores) | added latency per turn p50 / p99 | leases renewed / renewal requests | runs submitted/s |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|");
    for latency in &latencies {
        for n in &runs {
            for w in &workers {
                let row = one(&url, *w, *n, *latency, cap).await;
                print_row(&row);
                let _ = std::io::stdout().flush();
            }
        }
    }
}
