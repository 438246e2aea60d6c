//! Network faults between workers and PostgreSQL under load (issue 27): in-process workers on
//! a private server ([`kuralle_tests::private_pg`]), some of them reaching it through a
//! [`FaultProxy`].
//!
//! - **Partition.** Three workers, one behind the proxy, drive a few hundred runs with a 2 s
//!   lease TTL. Mid-load, while that worker has calls running, the proxy blackholes it for
//!   twice the TTL, then heals. Its runs must be taken over and finish, its late writes must be
//!   fenced (its turns end [`LeaseLost`](kuralle::RunError::LeaseLost), counted in
//!   [`ServeReport::lost`]), no call may run twice at the same time, and every invariant of
//!   [`kuralle_tests::invariants`] must hold. Then the other two stop and it alone must drive
//!   new runs: it came back on its own.
//! - **Resets.** Two workers, both behind the proxy, drive runs while the proxy resets every
//!   connection (and refuses new ones for a moment) a few times. Every run must finish, on
//!   connections the workers opened again by themselves, with the same invariants.
//!
//! ```text
//! cargo test -p kuralle-tests --test partition -- --nocapture
//! ```
//!
//! Without initdb on PATH the tests print a skip notice and pass.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use kuralle::testing::{ScriptedModel, Turn};
use kuralle::{AgentDef, RunFilter, RunRequest, RunStatus, RunStore, Runtime, StepKind, StepStatus, WorkerOptions};
use kuralle_tests::FnTool;
use kuralle_tests::fault_proxy::{FaultProxy, Mode};
use kuralle_tests::invariants::{Invariants, Journals, Ledger, now_ms};
use kuralle_tests::postgres::{store_at, unique_schema};
use kuralle_tests::private_pg::PrivatePostgres;
use kuralle_tests::serving::Serving;
use serde_json::json;

const LEASE_TTL: Duration = Duration::from_secs(2);

/// Which worker executed calls of which runs, with the instant of each start.
type Seen = Arc<Mutex<Vec<(&'static str, String, i64)>>>;

/// Calls a worker is running right now.
type Busy = Arc<AtomicUsize>;

/// A runtime for worker `name`: agent `pay` calls `step`, then `ship` (at most once) beside
/// another `step`, then answers. Every execution goes to `ledger` (and who ran it to `seen`).
fn runtime(name: &'static str, store: Arc<dyn RunStore>, ledger: &Ledger, seen: &Seen, busy: &Busy) -> Runtime {
    let tool = |tool: &'static str| {
        let (ledger, seen, busy) = (ledger.clone(), Arc::clone(seen), Arc::clone(busy));
        FnTool::new(tool, move |args, ctx| {
            let running = ledger.enter(ctx.run_id(), tool, ctx.call_id(), ctx.idempotency_key());
            seen.lock().unwrap().push((name, ctx.run_id().to_owned(), now_ms()));
            busy.fetch_add(1, Ordering::SeqCst);
            let busy = Arc::clone(&busy);
            async move {
                // Some tens of ms: long enough that a fault lands while calls run.
                tokio::time::sleep(Duration::from_millis(30)).await;
                busy.fetch_sub(1, Ordering::SeqCst);
                drop(running);
                Ok(json!({"done": args["n"]}))
            }
        })
    };
    let model = ScriptedModel::by_transcript([
        Turn::tool_calls([("c1", "step", r#"{"n":1}"#)]),
        Turn::tool_calls([("c2", "ship", r#"{"n":2}"#), ("c3", "step", r#"{"n":3}"#)]),
        Turn::text("done"),
    ]);
    Runtime::builder()
        .agent(AgentDef::new("pay", "Pay, then ship.").tool(tool("step")).tool(tool("ship").at_most_once()))
        .model(model)
        .store_arc(store)
        .lease_ttl(LEASE_TTL)
        .build()
        .expect("the runtime builds")
}

async fn finished_ids(store: &dyn RunStore) -> BTreeSet<String> {
    let filter = RunFilter { status: Some(RunStatus::Finished), ..RunFilter::default() };
    store.list_runs(filter).await.expect("the store answers").into_iter().map(|r| r.run_id).collect()
}

async fn finished(store: &dyn RunStore) -> usize {
    let filter = RunFilter { status: Some(RunStatus::Finished), ..RunFilter::default() };
    store.list_runs(filter).await.map_or(0, |runs| runs.len())
}

/// Waits until `n` runs have finished, or fails after `limit` with `what`.
async fn until_finished(store: &dyn RunStore, n: usize, limit: Duration, what: &str, server: &PrivatePostgres) {
    let deadline = Instant::now() + limit;
    while finished(store).await < n {
        assert!(Instant::now() < deadline, "{what}: {} of {n} runs finished\n{}", finished(store).await, server.log());
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn server(test: &str) -> Option<PrivatePostgres> {
    match PrivatePostgres::builder().prefix("kuralle-pg-partition-").start() {
        Ok(server) => Some(server),
        Err(reason) => {
            eprintln!("skipping {test}: {reason}");
            None
        }
    }
}

/// Beyond the invariants: the only calls that may fail are `ship` calls the runtime could not
/// prove unrun (their intent written, the connection lost before the outcome), recorded
/// indeterminate rather than run again.
fn only_indeterminate_ships_failed(journals: &Journals) {
    for (run_id, entry) in &journals.runs {
        let (_, steps) = entry.as_ref().expect("no run lost");
        for step in steps.iter().filter(|s| s.kind == StepKind::Tool && s.status == StepStatus::Failed) {
            assert_eq!(step.name, "ship", "{run_id}: only at-most-once calls may fail: {step:?}");
            assert_eq!(step.error.as_ref().unwrap().to_value()["kind"], "indeterminate", "{run_id}: {step:?}");
        }
    }
}

fn through(proxy: &FaultProxy) -> String {
    format!("postgres://postgres@{}/postgres", proxy.addr())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_partitioned_past_its_lease_is_taken_over_and_fenced() {
    const RUNS: usize = 240;
    const MORE: usize = 20;
    let _ = tracing_subscriber::fmt().with_max_level(tracing::Level::WARN).with_test_writer().try_init();
    let Some(server) = server("a_worker_partitioned_past_its_lease_is_taken_over_and_fenced") else { return };
    let proxy = FaultProxy::start(([127, 0, 0, 1], server.port()).into()).await.unwrap();
    let schema = unique_schema("partition");
    let (ledger, seen) = (Ledger::default(), Seen::default());
    let direct = store_at(&server.url(), &schema).await;
    let (a, b) = (
        runtime("a", Arc::clone(&direct), &ledger, &seen, &Busy::default()),
        runtime("b", store_at(&server.url(), &schema).await, &ledger, &seen, &Busy::default()),
    );
    let p_busy = Busy::default();
    let p = runtime("p", store_at(&through(&proxy), &schema).await, &ledger, &seen, &p_busy);
    for i in 0..RUNS {
        a.submit(RunRequest::new("go").run_id(format!("r{i:03}"))).await.expect("the run is submitted");
    }

    let started = Instant::now();
    let (wa, wb, wp) = (
        Serving::start(&a, worker_options()),
        Serving::start(&b, worker_options()),
        Serving::start(&p, worker_options()),
    );
    // Partition once a fifth of the runs are done and the proxied worker has calls running.
    loop {
        if p_busy.load(Ordering::SeqCst) > 0 && finished(direct.as_ref()).await >= RUNS / 5 {
            break;
        }
        assert!(started.elapsed() < Duration::from_secs(30), "the runs do not get going on the proxied worker");
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    let partitioned_at = now_ms();
    proxy.set(Mode::Blackhole);
    // Writes sent before the partition settle (committed or held): what finished by now
    // finished by the partitioned worker's hand or another's, but not after this.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let p_runs: BTreeSet<String> =
        seen.lock().unwrap().iter().filter(|(w, ..)| *w == "p").map(|(_, run, _)| run.clone()).collect();
    let in_flight: BTreeSet<String> = p_runs.difference(&finished_ids(direct.as_ref()).await).cloned().collect();
    tokio::time::sleep(LEASE_TTL * 2).await;
    // The partitioned worker cannot have finished any of these: whichever finished, another
    // worker took over.
    let taken_over: BTreeSet<String> = in_flight.intersection(&finished_ids(direct.as_ref()).await).cloned().collect();
    proxy.set(Mode::Pass);
    let healed_at = now_ms();

    until_finished(direct.as_ref(), RUNS, Duration::from_secs(40), "after the heal", &server).await;
    let all_done_at = now_ms();
    let (ra, rb) = (wa.stop().await, wb.stop().await);

    // Alone now: only the healed worker can drive these.
    for i in 0..MORE {
        a.submit(RunRequest::new("go").run_id(format!("s{i:03}"))).await.expect("the run is submitted");
    }
    until_finished(direct.as_ref(), RUNS + MORE, Duration::from_secs(20), "the healed worker alone", &server).await;
    let rp = wp.stop().await;

    let seen = seen.lock().unwrap().clone();
    let mut per_worker: BTreeMap<&str, usize> = BTreeMap::new();
    for (w, ..) in &seen {
        *per_worker.entry(w).or_default() += 1;
    }
    let ids = (0..RUNS).map(|i| format!("r{i:03}")).chain((0..MORE).map(|i| format!("s{i:03}")));
    let journals = Journals::load(direct.as_ref(), ids).await.unwrap();
    let report = Invariants::new().at_most_once("ship").check(&journals, &ledger.executions());
    println!(
        "partition: {RUNS} runs on 3 workers (lease TTL {LEASE_TTL:?}), one blackholed for {:.2} s with {} runs in flight \
         ({} in all had started there); {} of them finished by the others during the partition; its turns fenced (lease lost): {}; every run finished {:.2} s \
         after the heal; then {MORE} runs on the healed worker alone; executions per worker {per_worker:?}; \
         reports a {ra:?}, b {rb:?}, p {rp:?}; proxy {:?}; invariants: {report}",
        (healed_at - partitioned_at) as f64 / 1000.0,
        in_flight.len(),
        p_runs.len(),
        taken_over.len(),
        rp.lost,
        (all_done_at - healed_at) as f64 / 1000.0,
        proxy.stats(),
    );
    report.assert_holds();
    only_indeterminate_ships_failed(&journals);
    assert!(!taken_over.is_empty(), "no run of the partitioned worker was taken over");
    assert!(rp.lost > 0, "the partitioned worker's turns were not fenced: {rp:?}");
    assert!(
        seen.iter().filter(|(w, run, _)| *w == "p" && run.starts_with('s')).count() >= MORE,
        "the healed worker did not drive the runs submitted after the others stopped"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn workers_whose_connections_are_reset_mid_load_reconnect_and_finish_every_run() {
    const RUNS: usize = 200;
    const RESETS: usize = 3;
    let _ = tracing_subscriber::fmt().with_max_level(tracing::Level::WARN).with_test_writer().try_init();
    let Some(server) = server("workers_whose_connections_are_reset_mid_load_reconnect_and_finish_every_run") else {
        return;
    };
    let proxy = FaultProxy::start(([127, 0, 0, 1], server.port()).into()).await.unwrap();
    let schema = unique_schema("resets");
    let (ledger, seen) = (Ledger::default(), Seen::default());
    // The test reads the store directly; the workers only through the proxy.
    let direct = store_at(&server.url(), &schema).await;
    let a = runtime("a", store_at(&through(&proxy), &schema).await, &ledger, &seen, &Busy::default());
    let b = runtime("b", store_at(&through(&proxy), &schema).await, &ledger, &seen, &Busy::default());
    for i in 0..RUNS {
        a.submit(RunRequest::new("go").run_id(format!("r{i:03}"))).await.expect("the run is submitted");
    }

    let started = Instant::now();
    let workers = [Serving::start(&a, worker_options()), Serving::start(&b, worker_options())];
    let mut resets_at = Vec::new();
    for n in 1..=RESETS {
        // Each reset lands a little further into the load, while calls run.
        while finished(direct.as_ref()).await < RUNS * n / (RESETS + 2)
            || ledger.executions().iter().all(|e| e.end.is_some())
        {
            assert!(started.elapsed() < Duration::from_secs(40), "the runs do not get going");
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        proxy.set(Mode::Reset);
        resets_at.push((finished(direct.as_ref()).await, now_ms()));
        // Refused for a moment: reconnection attempts fail too.
        tokio::time::sleep(Duration::from_millis(300)).await;
        proxy.set(Mode::Pass);
    }
    let healed_at = now_ms();
    until_finished(direct.as_ref(), RUNS, Duration::from_secs(40), "after the resets", &server).await;
    let all_done_at = now_ms();
    let mut reports = Vec::new();
    for worker in workers {
        reports.push(worker.stop().await);
    }

    let journals = Journals::load(direct.as_ref(), (0..RUNS).map(|i| format!("r{i:03}"))).await.unwrap();
    let report = Invariants::new().at_most_once("ship").check(&journals, &ledger.executions());
    println!(
        "resets: {RUNS} runs on 2 workers behind the proxy; {RESETS} resets (runs finished, ms) {resets_at:?}; \
         proxy {:?}; every run finished {:.2} s after the last heal; reports {reports:?}; invariants: {report}",
        proxy.stats(),
        (all_done_at - healed_at) as f64 / 1000.0,
    );
    report.assert_holds();
    only_indeterminate_ships_failed(&journals);
    assert!(proxy.stats().reset > 0, "no connection was reset");
    assert!(proxy.stats().accepted > 2, "the workers never opened a new connection: {:?}", proxy.stats());
}

fn worker_options() -> WorkerOptions {
    WorkerOptions {
        max_concurrent_runs: 8,
        poll_interval: Duration::from_millis(50),
        shutdown_grace: Duration::from_secs(5),
        ..WorkerOptions::default()
    }
}
