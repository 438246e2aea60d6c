//! `PostgresStore`-specific behaviour against a real server (`DATABASE_URL`; without it each
//! test prints a skip notice and passes): schema creation and migration (racing processes, an
//! older database, a newer one, foreign tables), leases on the database clock, connection
//! failures as retryable errors.

use std::sync::Arc;
use std::time::Duration;

use kuralle::stores::{PostgresOptions, PostgresStore};
use kuralle::{RunStatus, RunStore, StepOutcome, StepStatus, StoreError};
use kuralle_tests::conformance::{run, step};
use kuralle_tests::postgres::{SchemaGuard, connect, database_url, store, unique_schema};
use serde_json::json;

fn options(schema: &str) -> PostgresOptions {
    PostgresOptions { schema: schema.to_owned(), ..PostgresOptions::default() }
}

/// The schema version recorded in `schema`'s version table.
async fn stored_version(client: &tokio_postgres::Client, schema: &str) -> i32 {
    client.query_one(&format!("SELECT version FROM \"{schema}\".kuralle_schema_version"), &[]).await.unwrap().get(0)
}

/// Eight stores connect to one fresh schema at once: the advisory lock lets one migrate while
/// the others wait, and all of them end up working on the same tables.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_connects_migrate_once() {
    let Some(url) = database_url("concurrent_connects_migrate_once") else { return };
    let schema = unique_schema("race");
    let _guard = SchemaGuard { url: url.clone(), schema: schema.clone() };
    let barrier = Arc::new(tokio::sync::Barrier::new(8));
    let tasks: Vec<_> = (0..8)
        .map(|_| {
            let (url, schema, barrier) = (url.clone(), schema.clone(), barrier.clone());
            tokio::spawn(async move {
                barrier.wait().await;
                PostgresStore::connect_with(&url, options(&schema)).await
            })
        })
        .collect();
    let mut stores = Vec::new();
    for task in tasks {
        stores.push(task.await.unwrap().expect("every racing connect succeeds"));
    }
    let lease = stores[0].acquire_lease("run-1", "test", Duration::from_secs(60)).await.unwrap();
    stores[1].create_run(run("run-1", RunStatus::Running, 1), lease.token).await.unwrap();
    for store in &stores {
        assert!(store.get_run("run-1").await.unwrap().is_some(), "all stores share the tables");
    }
    let client = connect(&url).await.unwrap();
    assert_eq!(stored_version(&client, &schema).await, PostgresStore::SCHEMA_VERSION);
}

/// A database left by schema version 1 (runs and journals, no leases) upgrades on connect and
/// keeps its data; the upgraded store grants leases.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn version_1_database_upgrades_and_keeps_data() {
    let Some(url) = database_url("version_1_database_upgrades_and_keeps_data") else { return };
    let schema = unique_schema("v1");
    let _guard = SchemaGuard { url: url.clone(), schema: schema.clone() };
    let client = connect(&url).await.unwrap();
    // Schema version 1 exactly as that release created it.
    client
        .batch_execute(&format!(
            r#"CREATE SCHEMA "{schema}";
            CREATE TABLE "{schema}".kuralle_schema_version (
                id integer PRIMARY KEY CHECK (id = 1), version integer NOT NULL,
                migrated_at timestamptz NOT NULL DEFAULT now());
            INSERT INTO "{schema}".kuralle_schema_version (id, version) VALUES (1, 1);
            CREATE TABLE "{schema}".kuralle_runs (
                run_id text PRIMARY KEY, agent_id text NOT NULL, status text NOT NULL, epoch bigint NOT NULL,
                version bigint NOT NULL, next_ordinal bigint NOT NULL DEFAULT 0, state jsonb NOT NULL,
                created_at bigint NOT NULL, updated_at bigint NOT NULL);
            CREATE TABLE "{schema}".kuralle_steps (
                run_id text NOT NULL REFERENCES "{schema}".kuralle_runs (run_id) ON DELETE CASCADE,
                ordinal bigint NOT NULL, key text NOT NULL, kind text NOT NULL, name text NOT NULL,
                epoch bigint NOT NULL, status text NOT NULL, result jsonb, error jsonb,
                started_at bigint NOT NULL, finished_at bigint,
                PRIMARY KEY (run_id, ordinal), UNIQUE (run_id, key));
            INSERT INTO "{schema}".kuralle_runs VALUES ('old', 'support', 'paused', 2, 5, 1, '{{"turn": 7}}', 1, 2);
            INSERT INTO "{schema}".kuralle_steps VALUES
                ('old', 0, 'k0', 'tool', 'charge', 2, 'finished', '{{"paid": 100}}', NULL, 3, 4);"#
        ))
        .await
        .unwrap();

    let store = PostgresStore::connect_with(&url, options(&schema)).await.unwrap();
    let old = store.get_run("old").await.unwrap().unwrap();
    assert_eq!((old.status, old.epoch, old.version, old.state), (RunStatus::Paused, 2, 5, json!({"turn": 7}).into()));
    let steps = store.steps("old").await.unwrap();
    assert_eq!(steps.len(), 1);
    assert_eq!(
        (steps[0].status, steps[0].result.as_ref().map(kuralle::JsonText::to_value)),
        (StepStatus::Finished, Some(json!({"paid": 100})))
    );
    let lease = store.acquire_lease("old", "worker", Duration::from_secs(30)).await.unwrap();
    assert_eq!(lease.token, 1);
    assert_eq!(store.append_steps("old", lease.token, vec![step("k1")]).await.unwrap(), [1], "the journal continues");

    assert_eq!(stored_version(&client, &schema).await, PostgresStore::SCHEMA_VERSION);
    // Connecting again finds nothing to do.
    PostgresStore::connect_with(&url, options(&schema)).await.unwrap();
}

/// A schema from a newer kuralle, or with tables kuralle did not create, is refused with a
/// typed error and left untouched.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn newer_or_foreign_schema_is_refused() {
    let Some(url) = database_url("newer_or_foreign_schema_is_refused") else { return };
    let client = connect(&url).await.unwrap();

    let newer = unique_schema("newer");
    let _newer_guard = SchemaGuard { url: url.clone(), schema: newer.clone() };
    PostgresStore::connect_with(&url, options(&newer)).await.unwrap();
    client
        .batch_execute(&format!("UPDATE \"{newer}\".kuralle_schema_version SET version = version + 1"))
        .await
        .unwrap();
    let err = PostgresStore::connect_with(&url, options(&newer)).await.unwrap_err();
    assert!(matches!(&err, StoreError::Corrupt(m) if m.contains("newer")), "{err:?}");
    assert!(!err.is_retryable());

    let foreign = unique_schema("foreign");
    let _foreign_guard = SchemaGuard { url: url.clone(), schema: foreign.clone() };
    client
        .batch_execute(&format!(
            "CREATE SCHEMA \"{foreign}\"; CREATE TABLE \"{foreign}\".kuralle_runs (id int); \
             INSERT INTO \"{foreign}\".kuralle_runs VALUES (42)"
        ))
        .await
        .unwrap();
    let err = PostgresStore::connect_with(&url, options(&foreign)).await.unwrap_err();
    assert!(matches!(&err, StoreError::Corrupt(m) if m.contains("kuralle_runs")), "{err:?}");
    let kept: i32 = client.query_one(&format!("SELECT id FROM \"{foreign}\".kuralle_runs"), &[]).await.unwrap().get(0);
    assert_eq!(kept, 42, "the foreign table is untouched");
}

/// A server that does not answer is a retryable `Unavailable`; a malformed URL is not
/// retryable and its text (which may hold a password) is not echoed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unreachable_server_and_bad_url_are_typed() {
    // A loopback port nothing listens on: bind one, then free it.
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let url = format!("postgres://postgres:s3cret@127.0.0.1:{port}/test?connect_timeout=2");
    let err = PostgresStore::connect(&url).await.unwrap_err();
    assert!(err.is_retryable(), "{err:?}");
    assert!(!err.to_string().contains("s3cret"));

    let err = PostgresStore::connect("postgres://u:s3cret@host:notaport/db").await.unwrap_err();
    assert!(matches!(err, StoreError::Corrupt(_)), "{err:?}");
    assert!(!err.is_retryable());
    assert!(!err.to_string().contains("s3cret"));
}

/// Leases on PostgreSQL's own clock: expiry is the server's; tokens only grow (after expiry,
/// after release); renew and release with a stale token are `Fenced`. The store-neutral lease
/// cases (16 concurrent acquirers among them) run on PostgreSQL through the conformance suite.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leases_on_the_database_clock() {
    let Some((store, _guard)) = store("leases_on_the_database_clock").await else { return };
    // Expiry by the server's clock: a short lease lapses, and the next holder gets token 2.
    let short = store.acquire_lease("run-2", "a", Duration::from_millis(50)).await.unwrap();
    let server_now: i64 = {
        let client = connect(&database_url("").unwrap()).await.unwrap();
        client
            .query_one("SELECT (floor(extract(epoch FROM clock_timestamp()) * 1000))::int8", &[])
            .await
            .unwrap()
            .get(0)
    };
    assert!(short.expires_at_ms <= server_now + 50 + 5, "expiry comes from the server's clock");
    tokio::time::sleep(Duration::from_millis(120)).await;
    assert_eq!(store.current_lease("run-2").await.unwrap(), None, "an expired lease is not current");
    let taken = store.acquire_lease("run-2", "b", Duration::from_secs(60)).await.unwrap();
    assert_eq!(taken.token, short.token + 1);
    assert_eq!(
        store.renew_lease(&short, Duration::from_secs(60)).await.unwrap_err(),
        StoreError::Fenced { run_id: "run-2".into(), token: short.token }
    );
    assert_eq!(
        store.release_lease(&short).await.unwrap_err(),
        StoreError::Fenced { run_id: "run-2".into(), token: short.token }
    );

    // The holder renews; release lets another in at once with a higher token.
    let renewed = store.renew_lease(&taken, Duration::from_secs(120)).await.unwrap();
    assert!(renewed.expires_at_ms > taken.expires_at_ms);
    assert_eq!(renewed.token, taken.token);
    store.release_lease(&renewed).await.unwrap();
    assert_eq!(store.current_lease("run-2").await.unwrap(), None);
    let next = store.acquire_lease("run-2", "c", Duration::from_secs(60)).await.unwrap();
    assert_eq!(next.token, taken.token + 1);

    // An expired but not taken-over lease may still be renewed by its holder.
    let lapsing = store.acquire_lease("run-3", "slow", Duration::from_millis(30)).await.unwrap();
    tokio::time::sleep(Duration::from_millis(80)).await;
    let revived = store.renew_lease(&lapsing, Duration::from_secs(60)).await.unwrap();
    assert_eq!(store.current_lease("run-3").await.unwrap(), Some(revived));

    // Deleting a run keeps its lease row: tokens never go down.
    store.create_run(run("run-2", RunStatus::Running, 1), next.token).await.unwrap();
    assert!(store.delete_run("run-2").await.unwrap());
    store.release_lease(&next).await.unwrap();
    assert_eq!(store.acquire_lease("run-2", "d", Duration::from_secs(60)).await.unwrap().token, next.token + 1);
}

/// The server terminates the store's connections (`pg_terminate_backend`): the operation that
/// was using one fails with a retryable `Unavailable` at worst, the pool reconnects, and every
/// acknowledged write is still there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn terminated_connections_are_retryable_and_lose_nothing() {
    let Some(url) = database_url("terminated_connections_are_retryable_and_lose_nothing") else { return };
    let app = unique_schema("term");
    let separator = if url.contains('?') { '&' } else { '?' };
    let tagged = format!("{url}{separator}application_name={app}");
    let _guard = SchemaGuard { url: url.clone(), schema: app.clone() };
    let store = PostgresStore::connect_with(&tagged, options(&app)).await.unwrap();
    let fence = store.acquire_lease("run-1", "test", Duration::from_secs(600)).await.unwrap().token;
    store.create_run(run("run-1", RunStatus::Running, 1), fence).await.unwrap();
    let admin = connect(&url).await.unwrap();

    let mut acknowledged = Vec::new();
    let mut retried = 0;
    for i in 0..20 {
        if i % 5 == 2 {
            let killed = admin
                .query("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = $1", &[&app])
                .await
                .unwrap();
            assert!(!killed.is_empty(), "the store had a connection to terminate");
        }
        let key = format!("k{i}");
        loop {
            match store.append_steps("run-1", fence, vec![step(&key)]).await {
                Ok(ordinals) => {
                    acknowledged.push((key.clone(), ordinals[0]));
                    break;
                }
                Err(e) if e.is_retryable() => retried += 1,
                // The terminated connection may have committed the append before it died.
                Err(StoreError::DuplicateKey { .. }) => {
                    let steps = store.steps("run-1").await.unwrap();
                    let ordinal = steps.iter().find(|s| s.key == key).unwrap().ordinal;
                    acknowledged.push((key.clone(), ordinal));
                    break;
                }
                Err(other) => panic!("unexpected {other:?}"),
            }
            assert!(retried < 20, "the pool does not recover");
        }
    }
    let steps = store.steps("run-1").await.unwrap();
    assert_eq!(steps.len(), 20, "no write lost or doubled");
    for (key, ordinal) in acknowledged {
        assert_eq!(steps[ordinal as usize].key, key);
    }
    store.finish_step("run-1", fence, 0, StepOutcome::Finished(kuralle::JsonText::from(json!("ok"))), 2).await.unwrap();
}

/// `notify_runnable` on one store wakes a `wait_runnable` on another (another process, in
/// production) through `LISTEN/NOTIFY`, long before its poll interval.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn notify_wakes_a_waiting_worker_of_another_store() {
    let Some((waiter, guard)) = store("notify_wakes_a_waiting_worker_of_another_store").await else { return };
    let options = PostgresOptions { schema: guard.schema.clone(), ..PostgresOptions::default() };
    let notifier = PostgresStore::connect_with(&guard.url, options).await.unwrap();
    // The first wait starts the listener (and returns once it listens: hints sent before were
    // lost, so waiters look at once).
    waiter.wait_runnable(Duration::from_secs(5)).await;
    let waiting = tokio::spawn(async move { waiter.wait_runnable(Duration::from_secs(600)).await });
    let started = std::time::Instant::now();
    while !waiting.is_finished() {
        notifier.notify_runnable().await.unwrap();
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(started.elapsed() < Duration::from_secs(60), "no hint arrived");
    }
    waiting.await.unwrap();
}

/// The closing write is one statement: a refused run (a version conflict, a stale token, a
/// missing run) journals nothing, and a written one lands with its last step at the next
/// ordinal and gives the lease up. A key already journaled refuses it whole.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_closing_write_journals_the_last_step_or_nothing() {
    use kuralle::{FinishedStep, NewStep, RunRecord, StepKind};
    let Some((store, _guard)) = store("the_closing_write_journals_the_last_step_or_nothing").await else { return };
    let lease = store.acquire_lease("r", "me", Duration::from_secs(60)).await.unwrap();
    store.create_run(run("r", RunStatus::Running, 1), lease.token).await.unwrap();
    assert_eq!(store.append_steps("r", lease.token, vec![step("a")]).await.unwrap(), [0]);
    let last = |key: &str| FinishedStep {
        step: NewStep { started_at_ms: 7, ..NewStep::new(key, StepKind::Model, "model") },
        outcome: StepOutcome::Finished(json!({"text": "done"}).into()),
        finished_at_ms: 9,
    };
    let mut stale = run("r", RunStatus::Finished, 2);
    stale.version = 3;
    let conflict = StoreError::VersionConflict { run_id: "r".into(), expected: 3, actual: 0 };
    assert_eq!(store.put_run_and_release_after(last("m"), stale, lease.token).await.unwrap_err(), conflict);
    let fenced = StoreError::Fenced { run_id: "r".into(), token: lease.token + 1 };
    let done = RunRecord { updated_at_ms: 2, ..run("r", RunStatus::Finished, 1) };
    assert_eq!(store.put_run_and_release_after(last("m"), done.clone(), lease.token + 1).await.unwrap_err(), fenced);
    let duplicate = StoreError::DuplicateKey { run_id: "r".into(), key: "a".into() };
    assert_eq!(store.put_run_and_release_after(last("a"), done.clone(), lease.token).await.unwrap_err(), duplicate);
    let ghost = store.acquire_lease("ghost", "me", Duration::from_secs(60)).await.unwrap();
    let missing = StoreError::RunNotFound("ghost".into());
    let nobody = run("ghost", RunStatus::Finished, 2);
    assert_eq!(store.put_run_and_release_after(last("m"), nobody, ghost.token).await.unwrap_err(), missing);
    assert_eq!(store.steps("r").await.unwrap().len(), 1, "refused: nothing journaled");
    assert_eq!(store.get_run("r").await.unwrap().unwrap().version, 0, "refused: the run as it was");
    assert_eq!(store.current_lease("r").await.unwrap().map(|l| l.token), Some(lease.token), "refused: still held");

    assert_eq!(store.put_run_and_release_after(last("m"), done.clone(), lease.token).await.unwrap(), (1, true));
    assert_eq!(store.get_run("r").await.unwrap(), Some(RunRecord { version: 1, ..done }));
    let steps = store.steps("r").await.unwrap();
    let closing = &steps[1];
    assert_eq!((closing.ordinal, closing.key.as_str(), closing.status), (1, "m", StepStatus::Finished));
    assert_eq!((closing.started_at_ms, closing.finished_at_ms), (7, Some(9)));
    assert_eq!(closing.result.as_ref().map(|r| r.to_value()), Some(json!({"text": "done"})));
    assert_eq!(store.current_lease("r").await.unwrap(), None);
    // The run's next ordinal moved with it.
    let next = store.acquire_lease("r", "me", Duration::from_secs(60)).await.unwrap();
    assert_eq!(store.append_steps("r", next.token, vec![step("b")]).await.unwrap(), [2]);
}

/// A counting proxy in front of `url`'s server and a connection string through it (TLS off, so
/// the proxy can read the messages), or `None` (after a skip notice) when `url` names no TCP
/// host.
async fn through_a_proxy(url: &str, test: &str) -> Option<(kuralle_tests::fault_proxy::FaultProxy, String)> {
    use kuralle_tests::fault_proxy::FaultProxy;
    let config: tokio_postgres::Config = url.parse().expect("DATABASE_URL parses");
    let host = match config.get_hosts().first() {
        Some(tokio_postgres::config::Host::Tcp(host)) => host.clone(),
        _ => {
            eprintln!("skipping {test}: DATABASE_URL names no TCP host");
            return None;
        }
    };
    let port = config.get_ports().first().copied().unwrap_or(5432);
    // `localhost` may resolve to `::1` first; the server may listen on IPv4 only.
    let addrs: Vec<std::net::SocketAddr> = tokio::net::lookup_host((host.as_str(), port)).await.unwrap().collect();
    let server = *addrs.iter().find(|a| a.is_ipv4()).or(addrs.first()).expect("the server's address");
    let proxy = FaultProxy::start(server).await.unwrap();
    let quoted = |v: &[u8]| format!("'{}'", String::from_utf8_lossy(v).replace('\\', "\\\\").replace('\'', "\\'"));
    // As libpq: the database defaults to the user's name.
    let user = config.get_user().unwrap_or("postgres");
    let mut through = format!(
        "host=127.0.0.1 port={} user={} dbname={} sslmode=disable",
        proxy.addr().port(),
        quoted(user.as_bytes()),
        quoted(config.get_dbname().unwrap_or(user).as_bytes()),
    );
    if let Some(password) = config.get_password() {
        through.push_str(&format!(" password={}", quoted(password)));
    }
    Some((proxy, through))
}

/// What `work` (started only once the count has begun: a run starts when `run` is called, not
/// when its handle is awaited) gives, and how many statements and requests the store sent while
/// it ran, counted at `proxy` (which has seen the store's messages before, so it reads them).
async fn on_the_wire<W: std::future::IntoFuture>(
    proxy: &kuralle_tests::fault_proxy::FaultProxy,
    work: impl FnOnce() -> W,
) -> (W::Output, (u64, u64)) {
    let before = proxy.stats();
    assert!(before.pg_statements > 0, "the proxy sees the store's messages: {before:?}");
    let out = work().await;
    let after = proxy.stats();
    (out, (after.pg_statements - before.pg_statements, after.pg_requests - before.pg_requests))
}

/// A one-call run on PostgreSQL is four statements, each its own request: the lease taken with
/// the run's row, the model's response with the call's intent, the call's outcome, and the
/// answer with the run's end and the lease's release. A run of the caller's id with a turn's
/// input is the same four (it read, then created: six, before 09dc0e3). Counted in the
/// client's messages on the wire (a proxy between the store and the server), after a first run of each kind prepared the statements. Nothing else
/// talks to the server meanwhile: no instance id (no lock connection), no workers (no
/// `LISTEN`), and lease renewals fall due a third of the default TTL after the grant.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_one_call_run_is_four_statements_on_the_wire() {
    use kuralle::testing::{ScriptedModel, Turn};
    // One connection, so the measured runs find every statement the warm-up runs prepared.
    let Some((proxy, store, _guard)) = proxied_store("a_one_call_run_is_four_statements_on_the_wire", "wire", 1).await
    else {
        return;
    };
    let model = ScriptedModel::by_transcript([Turn::tool_calls([("c1", "echo", r#"{"x":1}"#)]), Turn::text("Done.")]);
    let rt = kuralle::Runtime::builder()
        .agent(kuralle::AgentDef::new("a", "x").tool(kuralle_tests::echo_tool("echo")))
        .model(model)
        .store(store)
        .build()
        .unwrap();

    let counted = |request: kuralle::RunRequest| {
        let (rt, proxy) = (&rt, &proxy);
        async move {
            let (out, counts) = on_the_wire(proxy, || rt.run(request)).await;
            let out = out.unwrap();
            assert_eq!((out.status, out.text.as_str()), (RunStatus::Finished, "Done."));
            counts
        }
    };
    counted(kuralle::RunRequest::new("go")).await;
    counted(kuralle::RunRequest::new("go").run_id("first")).await;
    assert_eq!(counted(kuralle::RunRequest::new("go")).await, (4, 4), "a runtime-made id");
    assert_eq!(counted(kuralle::RunRequest::new("go").run_id("second")).await, (4, 4), "a caller's id");
}

/// A submitted run on PostgreSQL is three statements, each its own request: the lease taken
/// with the run's row, the lease released, and the hint to idle workers (five before: the
/// lease, a read of the run, its creation). A run of the caller's id with a turn's input is the
/// same three. Counted on the wire as above, after a first submission of each kind prepared
/// the statements.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_submitted_run_is_three_statements_on_the_wire() {
    use kuralle::testing::ScriptedModel;
    const TEST: &str = "a_submitted_run_is_three_statements_on_the_wire";
    let Some((proxy, store, _guard)) = proxied_store(TEST, "submit", 1).await else { return };
    let rt = kuralle::Runtime::builder()
        .agent(kuralle::AgentDef::new("a", "x"))
        .model(ScriptedModel::new([]))
        .store(store)
        .build()
        .unwrap();
    let counted = |request: kuralle::RunRequest| {
        let (rt, proxy) = (&rt, &proxy);
        async move {
            let (run_id, counts) = on_the_wire(proxy, || rt.submit(request)).await;
            let run_id = run_id.unwrap();
            let run = rt.get_run(&run_id).await.unwrap().expect("the submitted run");
            assert_eq!((run.status, run.agent_id.as_str()), (RunStatus::Running, "a"), "runnable");
            assert_eq!(run.state.to_value()["turn_input"], json!("go"), "the turn's input, for the worker");
            assert_eq!(rt.store().current_lease(&run_id).await.unwrap(), None, "no lease: a worker claims it");
            counts
        }
    };
    counted(kuralle::RunRequest::new("go")).await;
    counted(kuralle::RunRequest::new("go").run_id("first")).await;
    assert_eq!(counted(kuralle::RunRequest::new("go")).await, (3, 3), "a runtime-made id");
    assert_eq!(counted(kuralle::RunRequest::new("go").run_id("second")).await, (3, 3), "a caller's id");
}

/// A store on a fresh schema (its name starting with `prefix`) behind a counting proxy, with
/// `max_connections`. `None` after a skip notice.
async fn proxied_store(
    test: &str,
    prefix: &str,
    max_connections: usize,
) -> Option<(kuralle_tests::fault_proxy::FaultProxy, PostgresStore, SchemaGuard)> {
    let url = database_url(test)?;
    let (proxy, through) = through_a_proxy(&url, test).await?;
    let schema = unique_schema(prefix);
    let guard = SchemaGuard { url, schema: schema.clone() };
    let options = PostgresOptions { schema, max_connections, ..PostgresOptions::default() };
    let store = PostgresStore::connect_with(&through, options).await.unwrap();
    Some((proxy, store, guard))
}

/// A store behind a counting proxy with four connections: one batch of a kind in flight at a
/// time, so the writes sent beside it gather. `None` after a skip notice.
async fn batching_store(test: &str) -> Option<(kuralle_tests::fault_proxy::FaultProxy, PostgresStore, SchemaGuard)> {
    proxied_store(test, "batch", 4).await
}

/// Step outcomes of many runs written at once share statements, and each keeps its own outcome:
/// among 48 runs' outcomes sent together, those whose lease was taken over are fenced, those
/// naming no running step are refused, two outcomes of one step go in different statements (one
/// lands, the other finds the step finished), and every other outcome lands. Fewer statements
/// than outcomes reach the server (counted on the wire by a proxy).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn outcomes_of_many_runs_share_statements_and_keep_their_own_results() {
    use kuralle::Lease;
    const TEST: &str = "outcomes_of_many_runs_share_statements_and_keep_their_own_results";
    let Some((proxy, store, _guard)) = batching_store(TEST).await else { return };
    let ttl = Duration::from_secs(60);
    let mut leases: Vec<Lease> = Vec::new();
    for i in 0..48 {
        let run_id = format!("r{i}");
        let lease = store.acquire_lease(&run_id, "w", ttl).await.unwrap();
        store.create_run(run(&run_id, RunStatus::Running, 1), lease.token).await.unwrap();
        // Run 2 (mod 8) has two calls in flight, whose outcomes come together.
        let intents = if i % 8 == 2 { vec![step("k"), step("k2")] } else { vec![step("k")] };
        store.append_steps(&run_id, lease.token, intents).await.unwrap();
        if i % 8 == 3 {
            // Taken over: this lease's token is stale.
            store.release_lease(&lease).await.unwrap();
            store.acquire_lease(&run_id, "w2", ttl).await.unwrap();
        }
        leases.push(lease);
    }
    let outcome = |i: usize| StepOutcome::Finished(json!({ "run": i }).into());
    // Each run's outcome for its step; run 5 (mod 8) names a step that is not there, run 6 sends
    // two outcomes of its step, run 2 one for each of its two steps (which may share a batch).
    let mut writes: Vec<(usize, u64)> = (0..48).map(|i| (i, if i % 8 == 5 { 7 } else { 0 })).collect();
    writes.extend((0..48).filter(|i| i % 8 == 6).map(|i| (i, 0)));
    writes.extend((0..48).filter(|i| i % 8 == 2).map(|i| (i, 1)));
    let before = proxy.stats().pg_statements;
    let results = futures::future::join_all(writes.iter().map(|&(i, ordinal)| {
        let (store, lease) = (&store, &leases[i]);
        async move { store.finish_step(&lease.run_id, lease.token, ordinal, outcome(i), 2_000).await }
    }))
    .await;
    let statements = proxy.stats().pg_statements - before;
    assert!(statements < writes.len() as u64 / 2, "{} outcomes took {statements} statements", writes.len());

    let mut landed_twice = [0usize; 48];
    for (&(i, ordinal), result) in writes.iter().zip(&results) {
        let run_id = format!("r{i}");
        match i % 8 {
            3 => assert_eq!(result, &Err(StoreError::Fenced { run_id, token: leases[i].token }), "run {i}"),
            5 => assert_eq!(result, &Err(StoreError::StepNotRunning { run_id, ordinal }), "run {i}"),
            6 => match result {
                Ok(()) => landed_twice[i] += 1,
                Err(StoreError::StepNotRunning { run_id: r, ordinal: 0 }) if *r == run_id => {}
                other => panic!("run {i}'s second outcome: {other:?}"),
            },
            _ => assert_eq!(result, &Ok(()), "run {i}"),
        }
    }
    for (i, landed_twice) in landed_twice.into_iter().enumerate() {
        let steps = store.steps(&format!("r{i}")).await.unwrap();
        let landed = !matches!(i % 8, 3 | 5);
        let expected = if landed { StepStatus::Finished } else { StepStatus::Running };
        assert_eq!(steps[0].status, expected, "run {i}");
        if landed {
            assert_eq!(steps[0].result.as_ref().expect("a result"), &json!({ "run": i }), "run {i}");
        }
        if i % 8 == 6 {
            assert_eq!(landed_twice, 1, "run {i}: exactly one of its two outcomes lands");
        }
        if i % 8 == 2 {
            assert_eq!(steps[1].status, StepStatus::Finished, "run {i}'s second step");
        }
    }
}

/// Journal appends of many runs written at once share statements, and each keeps its own
/// outcome: a taken-over lease is fenced, a run that was never created is not found, a key the
/// run already journaled or a key twice in one write is refused (the store then sends the
/// clashing writes alone and the others as a batch again), and every other write gets the next
/// ordinals of its own run.
/// A model response with its calls' intents and plain intents go in the same statements.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn appends_of_many_runs_share_statements_and_keep_their_own_results() {
    use kuralle::{FinishedWithIntents, Lease, NewStep, StepKind};
    const TEST: &str = "appends_of_many_runs_share_statements_and_keep_their_own_results";
    let Some((proxy, store, _guard)) = batching_store(TEST).await else { return };
    let ttl = Duration::from_secs(60);
    let mut leases: Vec<Lease> = Vec::new();
    for i in 0..48 {
        let run_id = format!("r{i}");
        let lease = store.acquire_lease(&run_id, "w", ttl).await.unwrap();
        // Run 7 (mod 8) is never created.
        if i % 8 != 7 {
            store.create_run(run(&run_id, RunStatus::Running, 1), lease.token).await.unwrap();
            assert_eq!(store.append_steps(&run_id, lease.token, vec![step("k0")]).await.unwrap(), vec![0]);
        }
        if i % 8 == 3 {
            store.release_lease(&lease).await.unwrap();
            store.acquire_lease(&run_id, "w2", ttl).await.unwrap();
        }
        leases.push(lease);
    }
    let model = |i: usize| NewStep {
        key: format!("m{i}"),
        kind: StepKind::Model,
        name: "model".into(),
        epoch: 0,
        started_at_ms: 5,
    };
    // Even runs: a model response and two intents; odd runs: two intents, the first key
    // already journaled in run 5 (mod 8), the same key twice in run 9 (mod 16).
    let append = |i: usize| {
        let (store, lease) = (&store, &leases[i]);
        async move {
            let first = if i % 8 == 5 { "k0".to_owned() } else { format!("k{i}-a") };
            let second = if i % 16 == 9 { format!("k{i}-a") } else { format!("k{i}-b") };
            let intents = vec![step(&first), step(&second)];
            if i.is_multiple_of(2) {
                let write = FinishedWithIntents {
                    finished: model(i),
                    outcome: StepOutcome::Finished(json!({ "text": i }).into()),
                    finished_at_ms: 6,
                    intents,
                };
                store.append_finished_with_intents(&lease.run_id, lease.token, write).await
            } else {
                store.append_steps(&lease.run_id, lease.token, intents).await
            }
        }
    };
    let before = proxy.stats().pg_statements;
    let results = futures::future::join_all((0..48).map(append)).await;
    let statements = proxy.stats().pg_statements - before;
    // A batch with a clash costs a read, the clashing writes alone (two statements each) and
    // the rest together again.
    assert!(statements < 32, "48 appends took {statements} statements");

    for (i, result) in results.iter().enumerate() {
        let run_id = format!("r{i}");
        match i % 8 {
            3 => assert_eq!(result, &Err(StoreError::Fenced { run_id, token: leases[i].token }), "run {i}"),
            5 => assert_eq!(result, &Err(StoreError::DuplicateKey { run_id, key: "k0".into() }), "run {i}"),
            7 => assert_eq!(result, &Err(StoreError::RunNotFound(run_id)), "run {i}"),
            1 if i % 16 == 9 => {
                assert_eq!(result, &Err(StoreError::DuplicateKey { run_id, key: format!("k{i}-a") }), "run {i}")
            }
            _ if i % 2 == 0 => assert_eq!(result, &Ok(vec![1, 2, 3]), "run {i}"),
            _ => assert_eq!(result, &Ok(vec![1, 2]), "run {i}"),
        }
        let steps = store.steps(&format!("r{i}")).await.unwrap();
        let keys: Vec<&str> = steps.iter().map(|s| s.key.as_str()).collect();
        let (a, b) = (format!("k{i}-a"), format!("k{i}-b"));
        match (i % 8, i % 2) {
            (7, _) => assert!(keys.is_empty(), "run {i}: {keys:?}"),
            (3 | 5, _) => assert_eq!(keys, ["k0"], "run {i}"),
            (1, _) if i % 16 == 9 => assert_eq!(keys, ["k0"], "run {i}"),
            (_, 0) => {
                assert_eq!(keys, ["k0", format!("m{i}").as_str(), &a, &b], "run {i}");
                assert_eq!((steps[1].status, steps[2].status), (StepStatus::Finished, StepStatus::Running), "run {i}");
                assert_eq!(steps[1].result.as_ref().expect("the response"), &json!({ "text": i }), "run {i}");
                assert_eq!((steps[1].finished_at_ms, steps[2].finished_at_ms), (Some(6), None), "run {i}");
            }
            _ => {
                assert_eq!(keys, ["k0", &a, &b], "run {i}");
                assert!(steps[1..].iter().all(|s| s.status == StepStatus::Running && s.result.is_none()), "run {i}");
            }
        }
    }
}

/// A write the server refuses for its own value (a NUL in a key: PostgreSQL's text cannot hold
/// one) fails alone, with a typed error; the other runs' writes sent with it land.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_the_server_refuses_fails_alone_in_its_batch() {
    const TEST: &str = "a_write_the_server_refuses_fails_alone_in_its_batch";
    let Some(url) = database_url(TEST) else { return };
    let schema = unique_schema("refuse");
    let _guard = SchemaGuard { url: url.clone(), schema: schema.clone() };
    let options = PostgresOptions { schema, max_connections: 4, ..PostgresOptions::default() };
    let store = PostgresStore::connect_with(&url, options).await.unwrap();
    let mut leases = Vec::new();
    for i in 0..16 {
        let run_id = format!("r{i}");
        let lease = store.acquire_lease(&run_id, "w", Duration::from_secs(60)).await.unwrap();
        store.create_run(run(&run_id, RunStatus::Running, 1), lease.token).await.unwrap();
        leases.push(lease);
    }
    let results = futures::future::join_all(leases.iter().enumerate().map(|(i, lease)| {
        let key = if i == 5 { "bad\0key".to_owned() } else { format!("k{i}") };
        store.append_steps(&lease.run_id, lease.token, vec![step(&key)])
    }))
    .await;
    for (i, result) in results.iter().enumerate() {
        if i == 5 {
            assert!(matches!(result, Err(StoreError::LimitExceeded(_))), "{result:?}");
            assert!(store.steps("r5").await.unwrap().is_empty());
        } else {
            assert_eq!(result, &Ok(vec![0]), "run {i}");
        }
    }
}

/// Turns' closes of many runs written at once share statements, and each keeps its own outcome
/// as a close alone would: a taken-over lease is fenced, a stale version is a conflict, a run
/// that was never created is not found, and every other close lands with its last step at its
/// run's next ordinal and its lease released. Then a close whose last step's key its run
/// already journaled is refused among closes that land (the store sends that batch's closes
/// one by one).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn closes_of_many_runs_share_statements_and_keep_their_own_results() {
    use kuralle::{FinishedStep, Lease, NewStep, RunRecord, StepKind};
    const TEST: &str = "closes_of_many_runs_share_statements_and_keep_their_own_results";
    let Some((proxy, store, _guard)) = batching_store(TEST).await else { return };
    let ttl = Duration::from_secs(60);
    let last = |key: &str, i: usize| FinishedStep {
        step: NewStep { started_at_ms: 7, ..NewStep::new(key, StepKind::Model, "model") },
        outcome: StepOutcome::Finished(json!({ "text": format!("done {i}") }).into()),
        finished_at_ms: 9,
    };
    let done = |i: usize| RunRecord {
        updated_at_ms: 2,
        state: json!({ "closed": i }).into(),
        ..run(&format!("r{i}"), RunStatus::Finished, 1)
    };
    let mut leases: Vec<Lease> = Vec::new();
    for i in 0..64 {
        let run_id = format!("r{i}");
        let lease = store.acquire_lease(&run_id, "w", ttl).await.unwrap();
        // Run 4 (mod 8) is never created; the others journaled one, two or three steps, so
        // their closes land at different ordinals.
        if i % 8 != 4 {
            store.create_run(run(&run_id, RunStatus::Running, 1), lease.token).await.unwrap();
            let steps = ["a", "b", "c"].into_iter().take(1 + i % 3).map(step).collect();
            store.append_steps(&run_id, lease.token, steps).await.unwrap();
        }
        if i % 8 == 1 {
            // Taken over: this lease's token is stale.
            store.release_lease(&lease).await.unwrap();
            store.acquire_lease(&run_id, "w2", ttl).await.unwrap();
        }
        leases.push(lease);
    }
    let closing = |i: usize| {
        // Run 2 (mod 8) closes a version it does not hold.
        let record = if i % 8 == 2 { RunRecord { version: 3, ..done(i) } } else { done(i) };
        // In the second half, run 3 (mod 8)'s last step has a key the run already journaled.
        let key = if i >= 32 && i % 8 == 3 { "a" } else { "m" };
        store.put_run_and_release_after(last(key, i), record, leases[i].token)
    };
    // Each message waits a little at the proxy, so the closes queue behind the first batch
    // (the store's one slot for closes) and go in the next: two batches, each with at most one
    // read of why its refused closes were refused. Alone, 32 statements and 8 such reads.
    proxy.set(kuralle_tests::fault_proxy::Mode::Latency(Duration::from_millis(20)));
    let before = proxy.stats().pg_statements;
    let first = futures::future::join_all((0..32).map(closing)).await;
    let statements = proxy.stats().pg_statements - before;
    proxy.set(kuralle_tests::fault_proxy::Mode::Pass);
    assert!(statements <= 4, "32 closes took {statements} statements");
    let second = futures::future::join_all((32..64).map(closing)).await;

    for (i, result) in first.iter().chain(&second).enumerate() {
        let run_id = format!("r{i}");
        let expected = match i % 8 {
            1 => Err(StoreError::Fenced { run_id: run_id.clone(), token: leases[i].token }),
            2 => Err(StoreError::VersionConflict { run_id: run_id.clone(), expected: 3, actual: 0 }),
            3 if i >= 32 => Err(StoreError::DuplicateKey { run_id: run_id.clone(), key: "a".into() }),
            4 => Err(StoreError::RunNotFound(run_id.clone())),
            _ => Ok((1, true)),
        };
        assert_eq!(result, &expected, "run {i}");
        let held = store.current_lease(&run_id).await.unwrap().map(|l| (l.owner, l.token));
        match i % 8 {
            1 => assert_eq!(held, Some(("w2".into(), leases[i].token + 1)), "run {i}: the new holder's"),
            4 => {
                assert_eq!(held, Some(("w".into(), leases[i].token)), "run {i}: still held");
                assert_eq!(store.get_run(&run_id).await.unwrap(), None, "run {i}");
                continue;
            }
            _ if expected.is_ok() => assert_eq!(held, None, "run {i}: released"),
            _ => assert_eq!(held, Some(("w".into(), leases[i].token)), "run {i}: still held"),
        }
        let journaled = 1 + i as u64 % 3;
        let steps = store.steps(&run_id).await.unwrap();
        let row = store.get_run(&run_id).await.unwrap().unwrap();
        if expected.is_ok() {
            assert_eq!(row, RunRecord { version: 1, ..done(i) }, "run {i}");
            let last = steps.last().expect("the closing step");
            assert_eq!(
                (steps.len() as u64, last.ordinal, last.key.as_str()),
                (journaled + 1, journaled, "m"),
                "run {i}"
            );
            assert_eq!(last.result.as_ref().expect("a result"), &json!({ "text": format!("done {i}") }));
            // The run's next ordinal moved with its close.
            let next = store.acquire_lease(&run_id, "w", ttl).await.unwrap();
            let after = store.append_steps(&run_id, next.token, vec![step("after")]).await.unwrap();
            assert_eq!(after, [journaled + 1], "run {i}");
        } else {
            let as_it_was = (row.version, row.status, steps.len() as u64);
            assert_eq!(as_it_was, (0, RunStatus::Running, journaled), "run {i}: as it was");
        }
    }
}
