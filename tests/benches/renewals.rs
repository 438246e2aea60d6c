//! Lease renewals under load (issue 27): N runs in flight on one runtime with the default lease
//! TTL (30 s, renewed every 10 s), on memory, SQLite and PostgreSQL, each run three one-call
//! turns and an answer with a model that answers after `--latency-ms` (default 4 s, so a run
//! lasts about 16 s and each lease is renewed at least once). A pass-through store counts the
//! leases renewed and the renewal requests the runtime made (`RunStore::renew_leases` carries
//! many leases a request; before it, each lease renewed was a request of its own).
//!
//! `[DATABASE_URL=…] cargo bench -p kuralle-tests --bench renewals -- [--runs 10000]
//! [--latency-ms 4000] [--store memory,sqlite,postgres]` prints a Markdown table: wall time,
//! leases renewed and renewal requests, per second of the wall time and in the busiest
//! second. PostgreSQL is skipped without `DATABASE_URL`; its schema is dropped after.

use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt;
use kuralle::stores::{MemoryStore, SqliteStore};
use kuralle::testing::CountingStore;
use kuralle::{DEFAULT_LEASE_TTL, RunRequest, RunStatus, RunStore};
use kuralle_tests::in_flight::{Turns, runtime};

async fn one(store: &str, runs: usize, latency: Duration) -> Option<String> {
    let dir = tempfile::tempdir().expect("a temp dir");
    let mut guard = None;
    let inner: Arc<dyn RunStore> = match store {
        "memory" => Arc::new(MemoryStore::new()),
        "sqlite" => Arc::new(SqliteStore::open(dir.path().join("renewals.db")).expect("the SQLite store")),
        "postgres" => {
            let (pg, g) = kuralle_tests::postgres::store("the renewals bench").await?;
            guard = Some(g);
            Arc::new(pg)
        }
        other => panic!("--store is memory, sqlite or postgres, not {other}"),
    };
    let counting = CountingStore::new(inner);
    let rt = runtime(Arc::new(counting.clone()), Turns::new(runs, latency));
    // The busiest second: sample the counts every second while the runs run.
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let sampler = {
        let counting = counting.clone();
        tokio::spawn(async move {
            let (mut peak_leases, mut peak_requests) = (0, 0);
            let mut last = counting.counts();
            let mut tick = tokio::time::interval(Duration::from_secs(1));
            tick.tick().await;
            tokio::pin!(stopped);
            loop {
                tokio::select! {
                    _ = &mut stopped => return (peak_leases, peak_requests),
                    _ = tick.tick() => {}
                }
                let now = counting.counts();
                peak_leases = peak_leases.max(now.renewals - last.renewals);
                peak_requests = peak_requests.max(now.renewal_requests - last.renewal_requests);
                last = now;
            }
        })
    };
    let start = Instant::now();
    let mut pending: futures::stream::FuturesUnordered<_> = (0..runs)
        .map(|i| {
            std::future::IntoFuture::into_future(rt.run(RunRequest::new(format!("run {i}")).run_id(format!("run-{i}"))))
        })
        .collect();
    while let Some(out) = pending.next().await {
        assert_eq!(out.expect("the run finishes").status, RunStatus::Finished);
    }
    let wall = start.elapsed().as_secs_f64();
    let _ = stop.send(());
    let (peak_leases, peak_requests) = sampler.await.expect("the sampler");
    let counts = counting.counts();
    drop(guard);
    Some(format!(
        "| {store} | {runs} | {} ms | {wall:.1} s | {} | {} | {:.0} | {:.0} | {peak_leases} | {peak_requests} |",
        latency.as_millis(),
        counts.renewals,
        counts.renewal_requests,
        counts.renewals as f64 / wall,
        counts.renewal_requests as f64 / wall,
    ))
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let value = |flag: &str| args.iter().position(|a| a == flag).and_then(|i| args.get(i + 1)).cloned();
    let runs: usize = value("--runs").map_or(10_000, |v| v.parse().expect("--runs is a number"));
    let latency = Duration::from_millis(value("--latency-ms").map_or(4_000, |v| v.parse().expect("--latency-ms")));
    let stores = value("--store").unwrap_or_else(|| "memory,sqlite,postgres".to_owned());
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    println!(
        "lease renewals with {runs} runs in flight on one runtime (2 worker threads), lease TTL {DEFAULT_LEASE_TTL:?} \
         (renewed every third); leases renewed = the requests one renewal per lease would make"
    );
    println!(
        "| store | runs | model latency | wall | leases renewed | renewal requests | leases renewed/s | renewal requests/s | leases renewed in the busiest second | renewal requests in the busiest second |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|");
    for store in stores.split(',') {
        if let Some(row) = rt.block_on(one(store, runs, latency)) {
            println!("{row}");
        }
    }
}
