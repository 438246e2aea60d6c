//! Workers in separate processes sharing one store: PostgreSQL (`DATABASE_URL`; skipped with a
//! notice without it) and SQLite (one file). Workers are SIGKILLed at random and restarted,
//! SIGSTOPped past their lease, and their database connections are terminated; every run
//! finishes, no finished step runs again, a re-run carries the same idempotency key, and
//! `at_most_once` calls never run twice.

use std::collections::{HashMap, HashSet};
use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, ChildStdout, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use kuralle::stores::{PostgresOptions, PostgresStore};
use kuralle::{RunFilter, RunRequest, RunStatus, RunStore, StepKind, StepStatus};
use kuralle_tests::postgres::{SchemaGuard, connect, database_url, unique_schema};
use kuralle_tests::workers::{Effect, open_store, read_ledger, runtime};

/// A worker process and its stdout.
struct Worker {
    child: Child,
    stdout: BufReader<ChildStdout>,
}

impl Worker {
    fn start(spec: &str, ledger: &Path, env: &[(&str, String)]) -> Self {
        let mut command = Command::new(env!("CARGO_BIN_EXE_worker_child"));
        command.arg(spec).arg(ledger).stdout(Stdio::piped()).stderr(Stdio::null());
        for (name, value) in env {
            command.env(name, value);
        }
        let mut child = command.spawn().expect("the worker starts");
        let mut stdout = BufReader::new(child.stdout.take().unwrap());
        let mut line = String::new();
        stdout.read_line(&mut line).unwrap();
        assert_eq!(line.trim(), "READY", "the worker is serving");
        Self { child, stdout }
    }

    fn pid(&self) -> u32 {
        self.child.id()
    }

    fn kill(mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    fn signal(&self, name: &str) {
        // The shell's builtin `kill`: no dependency on a `kill` binary being installed.
        let status = Command::new("sh").arg("-c").arg(format!("kill -{name} {}", self.pid())).status().unwrap();
        assert!(status.success(), "kill -{name}");
    }

    /// SIGTERM, then the worker's report: `[claimed, completed, retried, lost, handed_back]`.
    fn stop(mut self) -> [u64; 5] {
        self.signal("TERM");
        let mut line = String::new();
        while self.stdout.read_line(&mut line).unwrap() > 0 {
            if let Some(report) = line.trim().strip_prefix("REPORT ") {
                let numbers: Vec<u64> = report.split(' ').map(|n| n.parse().unwrap()).collect();
                let _ = self.child.wait();
                return numbers.try_into().unwrap();
            }
            line.clear();
        }
        panic!("worker {} ended without a report", self.pid());
    }
}

/// A cheap seeded generator, so a failing schedule can be told apart (the seed is printed).
struct Rng(u64);

impl Rng {
    fn next(&mut self, below: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % below
    }
}

async fn submit_runs(store: Arc<dyn RunStore>, ledger: &Path, count: usize) -> Vec<String> {
    let rt = runtime(store, ledger, Duration::from_secs(3), None);
    let mut ids = Vec::new();
    for i in 0..count {
        ids.push(rt.submit(RunRequest::new(format!("order {i}")).run_id(format!("order-{i:03}"))).await.unwrap());
    }
    ids
}

async fn statuses(store: &dyn RunStore) -> HashMap<RunStatus, usize> {
    let mut counts = HashMap::new();
    for run in store.list_runs(RunFilter::default()).await.unwrap() {
        *counts.entry(run.status).or_default() += 1;
    }
    counts
}

/// Waits until every run is finished (or panics after `limit`, with the status counts).
async fn wait_all_finished(store: &dyn RunStore, runs: usize, limit: Duration) {
    let started = Instant::now();
    loop {
        let counts = statuses(store).await;
        if counts.get(&RunStatus::Finished) == Some(&runs) {
            return;
        }
        assert!(started.elapsed() < limit, "not every run finished within {limit:?}: {counts:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The invariants, from the journal and the ledger. `cut_off` are processes whose executions
/// may have been cut off (killed, or reporting a lost lease).
async fn check(store: &dyn RunStore, ids: &[String], ledger: &[Effect], cut_off: &HashSet<u32>) {
    let mut by_key: HashMap<&str, Vec<&Effect>> = HashMap::new();
    for effect in ledger {
        by_key.entry(&effect.key).or_default().push(effect);
    }
    for run_id in ids {
        let journal = store.steps(run_id).await.unwrap();
        let ordinals: Vec<u64> = journal.iter().map(|s| s.ordinal).collect();
        assert_eq!(ordinals, (0..journal.len() as u64).collect::<Vec<_>>(), "{run_id}: dense ordinals");
        assert!(journal.iter().all(|s| s.status != StepStatus::Running), "{run_id}: every step settled");
        for name in ["pay", "refund_once"] {
            let steps: Vec<_> = journal.iter().filter(|s| s.kind == StepKind::Tool && s.name == name).collect();
            assert_eq!(steps.len(), 1, "{run_id}: one {name} step in the journal");
            let step = steps[0];
            let effects = by_key.get(step.key.as_str()).cloned().unwrap_or_default();
            let keys: HashSet<&str> =
                ledger.iter().filter(|e| &e.run_id == run_id && e.tool == name).map(|e| e.key.as_str()).collect();
            assert!(keys.len() <= 1, "{run_id}: every execution of {name} carries the same key: {keys:?}");
            if name == "refund_once" {
                assert!(effects.len() <= 1, "{run_id}: the at_most_once refund ran {} times", effects.len());
                continue;
            }
            assert!(!effects.is_empty(), "{run_id}: the payment ran");
            let final_pid =
                step.result.as_ref().and_then(|r| r.to_value()["pid"].as_u64()).expect("pay finished with a pid");
            let (last, earlier) = effects.split_last().unwrap();
            assert_eq!(
                u64::from(last.pid),
                final_pid,
                "{run_id}: the journaled payment is the last execution (a finished step never re-ran)"
            );
            for effect in earlier {
                assert!(
                    cut_off.contains(&effect.pid),
                    "{run_id}: pid {} re-ran a payment it was not cut off from",
                    effect.pid
                );
            }
        }
    }
}

/// The chaos run: `workers` processes serve `runs` submitted runs while a worker is SIGKILLed
/// and restarted every 300–900 ms, `kills` times; then every invariant is checked.
async fn chaos(spec: &str, store: Arc<dyn RunStore>, dir: &Path, runs: usize, workers: usize, kills: usize) {
    let ledger = dir.join("ledger.tsv");
    let ids = submit_runs(store.clone(), &ledger, runs).await;
    let seed = SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_nanos() as u64 | 1;
    eprintln!("chaos seed {seed}");
    let mut rng = Rng(seed);
    let env = [("LEASE_TTL_MS", "2000".to_owned()), ("MAX_RUNS", "8".to_owned())];
    let mut pool: Vec<Worker> = (0..workers).map(|_| Worker::start(spec, &ledger, &env)).collect();
    let mut killed = HashSet::new();
    for _ in 0..kills {
        tokio::time::sleep(Duration::from_millis(300 + rng.next(600))).await;
        let victim = pool.swap_remove(rng.next(pool.len() as u64) as usize);
        killed.insert(victim.pid());
        victim.kill();
        pool.push(Worker::start(spec, &ledger, &env));
    }
    wait_all_finished(store.as_ref(), runs, Duration::from_secs(120)).await;
    let mut cut_off = killed;
    for worker in pool {
        let pid = worker.pid();
        // A turn that lost its lease, or failed with a retryable error (a store write in
        // doubt), may have been cut off between a payment and its journal entry.
        let [_, _, retried, lost, _] = worker.stop();
        if lost > 0 || retried > 0 {
            cut_off.insert(pid);
        }
    }
    let effects = read_ledger(&ledger);
    check(store.as_ref(), &ids, &effects, &cut_off).await;
    let pays = effects.iter().filter(|e| e.tool == "pay").count();
    let refunds = effects.iter().filter(|e| e.tool == "refund_once").count();
    eprintln!(
        "{runs} runs finished; {pays} payments ({} cut off and re-ran under the same key), {refunds} refunds; \
         {} workers killed",
        pays - runs,
        kills
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_four_workers_200_runs_with_random_sigkills() {
    let Some(url) = database_url("postgres_four_workers_200_runs_with_random_sigkills") else { return };
    let schema = unique_schema("chaos");
    let _guard = SchemaGuard { url, schema: schema.clone() };
    let dir = tempfile::tempdir().unwrap();
    let store = open_store(&format!("postgres:{schema}")).await;
    chaos(&format!("postgres:{schema}"), store, dir.path(), 200, 4, 6).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_three_worker_processes_share_one_file() {
    let dir = tempfile::tempdir().unwrap();
    let spec = format!("sqlite:{}", dir.path().join("runs.db").display());
    let store = open_store(&spec).await;
    chaos(&spec, store, dir.path(), 60, 3, 3).await;
}

/// A worker SIGSTOPped mid-payment, past its lease: another worker takes the run over and
/// finishes it; after SIGCONT the stopped worker's writes are all fenced (it reports the lost
/// lease) and the journal holds each step once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_sigstopped_worker_is_fenced_after_takeover() {
    let Some(url) = database_url("postgres_sigstopped_worker_is_fenced_after_takeover") else { return };
    let schema = unique_schema("zombie");
    let _guard = SchemaGuard { url, schema: schema.clone() };
    let dir = tempfile::tempdir().unwrap();
    let ledger = dir.path().join("ledger.tsv");
    let spec = format!("postgres:{schema}");
    let store = open_store(&spec).await;
    let ids = submit_runs(store.clone(), &ledger, 1).await;
    let slow = [("LEASE_TTL_MS", "1000".to_owned()), ("PAY_MS", "1500".to_owned())];
    let zombie = Worker::start(&spec, &ledger, &slow);
    // Stop it once its payment has started.
    let started = Instant::now();
    while !read_ledger(&ledger).iter().any(|e| e.tool == "pay") {
        assert!(started.elapsed() < Duration::from_secs(30), "the payment never started");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    zombie.signal("STOP");
    let taker = Worker::start(&spec, &ledger, &[("LEASE_TTL_MS", "1000".to_owned())]);
    wait_all_finished(store.as_ref(), 1, Duration::from_secs(30)).await;
    let journal_before = store.steps(&ids[0]).await.unwrap();
    zombie.signal("CONT");
    // Let the zombie wake up, finish its payment, and try to write.
    tokio::time::sleep(Duration::from_millis(2500)).await;
    let [claimed, completed, _, lost, _] = zombie.stop();
    assert_eq!((claimed, completed, lost), (1, 0, 1), "the zombie's turn lost its lease");
    let _ = taker.stop();
    assert_eq!(store.steps(&ids[0]).await.unwrap(), journal_before, "the zombie wrote nothing");
    let effects = read_ledger(&ledger);
    let pays: Vec<&Effect> = effects.iter().filter(|e| e.tool == "pay").collect();
    assert_eq!(pays.len(), 2, "the cut-off payment re-ran once, under the same key");
    assert_eq!(pays[0].key, pays[1].key);
    check(store.as_ref(), &ids, &effects, &HashSet::from([pays[0].pid])).await;
}

/// The server terminates the worker's connections again and again mid-run
/// (`pg_terminate_backend`): every run still finishes and nothing is lost or doubled.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_terminated_backends_mid_run_lose_nothing() {
    let Some(url) = database_url("postgres_terminated_backends_mid_run_lose_nothing") else { return };
    let schema = unique_schema("term");
    let _guard = SchemaGuard { url: url.clone(), schema: schema.clone() };
    let separator = if url.contains('?') { '&' } else { '?' };
    let tagged = format!("{url}{separator}application_name={schema}");
    let options = PostgresOptions { schema: schema.clone(), ..PostgresOptions::default() };
    let store: Arc<dyn RunStore> = Arc::new(PostgresStore::connect_with(&tagged, options).await.unwrap());
    let dir = tempfile::tempdir().unwrap();
    let ledger = dir.path().join("ledger.tsv");
    let ids = submit_runs(store.clone(), &ledger, 30).await;
    let rt = runtime(store.clone(), &ledger, Duration::from_secs(3), None);
    let options = kuralle::WorkerOptions {
        max_concurrent_runs: 8,
        poll_interval: Duration::from_millis(50),
        retry_backoff: Duration::from_millis(100),
        ..kuralle::WorkerOptions::default()
    };
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let worker = tokio::spawn(async move {
        rt.serve_with(
            async {
                let _ = stopped.await;
            },
            options,
        )
        .await
    });
    let admin = connect(&url).await.unwrap();
    let mut terminated = 0;
    for _ in 0..10 {
        tokio::time::sleep(Duration::from_millis(40)).await;
        let rows = admin
            .query("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = $1", &[&schema])
            .await
            .unwrap();
        terminated += rows.len();
    }
    assert!(terminated > 0, "connections were terminated");
    wait_all_finished(store.as_ref(), ids.len(), Duration::from_secs(60)).await;
    stop.send(()).unwrap();
    let report = worker.await.unwrap().unwrap();
    eprintln!("terminated {terminated} backends; worker report {report:?}");
    // Only this process executed, and none of its executions was cut off by a kill: an
    // interrupted store write leaves the turn to be retried, and a re-run payment is allowed
    // only where the worker reported a retried turn.
    let effects = read_ledger(&ledger);
    let cut_off = if report.retried > 0 { HashSet::from([std::process::id()]) } else { HashSet::new() };
    check(store.as_ref(), &ids, &effects, &cut_off).await;
}
