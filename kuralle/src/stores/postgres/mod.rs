//! `PostgresStore`: the store for many workers on many machines.
//!
//! - [`schema`]: tables and migrations (run on connect, safe to race).
//! - [`sql`]: the statements; every write of a run checks the run's fencing token in the same
//!   statement, under a share lock on the lease row.
//! - [`runs`], [`steps`], [`leases`], [`queue`]: the operations.
//! - [`batch`]: the journal's writes of many runs gathered into one statement; [`close`]: a
//!   turn's close (run row, last step, lease released), alone or batched too.
//! - [`notify`]: `LISTEN/NOTIFY` wake-up hints for idle workers.
//! - [`codec`]: JSON values as JSONB, losslessly; [`errors`]: typed errors.
//! - [`tls`]: the URL's `sslmode` / `sslrootcert` on rustls, and [`PostgresTls`].

mod batch;
mod close;
mod codec;
mod errors;
mod instance;
mod leases;
mod notify;
mod queue;
mod runs;
mod schema;
mod sql;
mod steps;
mod tls;

use std::sync::Arc;
use std::time::Duration;

use deadpool_postgres::{Manager, ManagerConfig, Object, Pool, RecyclingMethod};
use tokio_postgres_rustls::MakeRustlsConnect;

use self::sql::Sql;
pub use self::tls::PostgresTls;
use super::DEFAULT_MAX_VALUE_BYTES;
use crate::store::StoreError;

/// Settings of a [`PostgresStore`]; start from [`Default`] and override fields.
///
/// ```
/// use kuralle::stores::PostgresOptions;
///
/// let options = PostgresOptions { schema: "tenant_a".into(), ..PostgresOptions::default() };
/// assert_eq!(options.max_connections, 16);
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PostgresOptions {
    /// The PostgreSQL schema that holds kuralle's tables (created if missing). Default
    /// `"public"`. Stores on different schemas of one database are independent.
    pub schema: String,
    /// The most pooled connections. Default 16.
    pub max_connections: usize,
    /// How long an operation waits for a pooled connection (or to open one) before it fails
    /// with a retryable [`StoreError::Unavailable`]. Default 10 s.
    pub connect_timeout: Duration,
    /// The largest accepted JSON value (run state, step result or error), in bytes of JSON
    /// text. Default [`DEFAULT_MAX_VALUE_BYTES`](super::DEFAULT_MAX_VALUE_BYTES).
    pub max_value_bytes: usize,
    /// TLS settings the URL cannot carry: root certificates, or a whole rustls configuration.
    /// Default [`PostgresTls::FromUrl`]: the URL's `sslmode` and `sslrootcert` decide (see
    /// [`PostgresTls`]).
    pub tls: PostgresTls,
}

impl Default for PostgresOptions {
    fn default() -> Self {
        Self {
            schema: "public".into(),
            max_connections: 16,
            connect_timeout: Duration::from_secs(10),
            max_value_bytes: DEFAULT_MAX_VALUE_BYTES,
            tls: PostgresTls::FromUrl,
        }
    }
}

/// The [`RunStore`](crate::RunStore) for many workers on many machines: runs, journals and
/// leases in PostgreSQL.
///
/// A write commits in one statement (`synchronous_commit` as the server is configured; the
/// default is durable). The journal's writes of many runs that are waiting at the same time
/// (appends, calls' outcomes, turns' closes) share a statement and its commit: each still
/// carries its own run's fencing token and gets its own outcome (see `docs/operations.md`,
/// "PostgreSQL: many runs' writes in one statement"). Writes that belong to a run carry the
/// run's fencing token and are checked in the same statement; lease expiry is computed and
/// compared with the **database's** clock, never the client's. Values are JSONB. A lost
/// connection, a terminated backend or a server that is down give a retryable
/// [`StoreError::Unavailable`]; the pool replaces broken connections by itself. A refused TLS
/// handshake ([`StoreError::Tls`]) or connection ([`StoreError::AccessDenied`]) is not
/// retryable, in `connect` as later.
///
/// It also keeps the work queue of [`Runtime::serve`](crate::Runtime::serve): claiming runnable
/// runs is one statement (`FOR UPDATE SKIP LOCKED` on the lease rows) that grants their leases,
/// so workers on many machines claim disjoint runs without waiting on each other. Idle workers
/// wake on `LISTEN/NOTIFY` hints and poll as well; `LISTEN` needs a direct connection or
/// session-mode pooling (behind a transaction-mode pooler such as pgbouncer with
/// `pool_mode = transaction` the hints do not arrive, and workers rely on polling).
///
/// Clones share one connection pool.
///
/// ```no_run
/// use kuralle::stores::PostgresStore;
/// use kuralle::RunStore;
///
/// # async fn demo() -> Result<(), kuralle::StoreError> {
/// let store = PostgresStore::connect("postgres://postgres@127.0.0.1:5432/test").await?;
/// let lease = store.acquire_lease("run-1", "worker-a", std::time::Duration::from_secs(30)).await?;
/// assert!(lease.token >= 1);
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct PostgresStore {
    inner: Arc<Inner>,
}

struct Inner {
    pool: Pool,
    sql: Sql,
    options: PostgresOptions,
    /// For the `LISTEN` connection, which is not pooled.
    config: tokio_postgres::Config,
    tls: MakeRustlsConnect,
    listener: notify::Listener,
    /// Step outcomes waiting to be sent, many runs' in one statement.
    finishes: batch::Queue<steps::Finish>,
    /// Journal appends waiting to be sent, many runs' in one statement.
    appends: batch::Queue<steps::Append>,
    /// Turns' closes waiting to be sent, many runs' in one statement.
    closes: batch::Queue<close::Close>,
}

impl std::fmt::Debug for PostgresStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let status = self.inner.pool.status();
        f.debug_struct("PostgresStore")
            .field("options", &self.inner.options)
            .field("connections", &status.size)
            .finish_non_exhaustive()
    }
}

impl PostgresStore {
    /// Connects to `url` (for example `postgres://user@host:5432/db`) with
    /// [`PostgresOptions::default`], creating or migrating the schema.
    ///
    /// TLS follows the URL's `sslmode` as libpq does (`disable`, `prefer` — the default —,
    /// `require`, `verify-ca`, `verify-full`), with `sslrootcert=PATH` (a PEM file) or else the
    /// platform's root certificates to verify the server: see [`PostgresTls`]. libpq's
    /// `key=value` connection strings are read too.
    ///
    /// ```no_run
    /// # async fn demo() -> Result<(), kuralle::StoreError> {
    /// let url = std::env::var("DATABASE_URL").unwrap_or_else(|_| "postgres://postgres@127.0.0.1/test".into());
    /// let store = kuralle::stores::PostgresStore::connect(&url).await?;
    /// # let _ = store;
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    /// [`StoreError::Unavailable`] if the server cannot be reached now;
    /// [`StoreError::Tls`] if TLS fails in a way retrying cannot fix (the server's certificate
    /// is not trusted or not for this host, the server has no TLS under `require`, the
    /// `sslrootcert` cannot be read); [`StoreError::AccessDenied`] if the server refuses the
    /// connection (authentication, `pg_hba.conf`); [`StoreError::Corrupt`] if `url` is not a
    /// PostgreSQL URL, or the schema holds tables kuralle did not create or a newer kuralle
    /// schema.
    pub async fn connect(url: &str) -> Result<Self, StoreError> {
        Self::connect_with(url, PostgresOptions::default()).await
    }

    /// Connects to `url` with `options`, creating or migrating the schema
    /// [`PostgresOptions::schema`].
    ///
    /// ```no_run
    /// use kuralle::stores::{PostgresOptions, PostgresStore};
    ///
    /// # async fn demo() -> Result<(), kuralle::StoreError> {
    /// let options = PostgresOptions { schema: "agents".into(), max_connections: 4, ..Default::default() };
    /// let store = PostgresStore::connect_with("postgres://postgres@127.0.0.1/test", options).await?;
    /// # let _ = store;
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    /// As [`connect`](Self::connect).
    pub async fn connect_with(url: &str, options: PostgresOptions) -> Result<Self, StoreError> {
        // The URL may hold a password: it is never echoed.
        let settings = tls::parse(url)?;
        let tls = tls::connector(&settings, &options.tls)?;
        let config = settings.config;
        let manager = Manager::from_config(
            config.clone(),
            tls.clone(),
            ManagerConfig { recycling_method: RecyclingMethod::Fast },
        );
        let pool = Pool::builder(manager)
            .max_size(options.max_connections.max(1))
            .wait_timeout(Some(options.connect_timeout))
            .create_timeout(Some(options.connect_timeout))
            .runtime(deadpool_postgres::Runtime::Tokio1)
            .build()
            .map_err(|e| StoreError::Corrupt(format!("cannot build the PostgreSQL pool: {e}").into()))?;
        let sql = Sql::new(&schema::quote_ident(&options.schema));
        // A quarter of the pool per kind of batched write leaves the rest to reads, leases and
        // the runs' rows.
        let slots = options.max_connections / 4;
        let store = Self {
            inner: Arc::new(Inner {
                pool,
                sql,
                options,
                config,
                tls,
                listener: notify::Listener::default(),
                finishes: batch::Queue::new(slots),
                appends: batch::Queue::new(slots),
                // A run closes once where it appends and finishes three times each: closes
                // gather into batches with fewer slots, and each slot in flight holds a
                // connection (four, sending a refused batch's writes one by one) the turns'
                // writes and reads could use.
                closes: batch::Queue::new(slots / 2),
            }),
        };
        let mut client = store.client().await.map_err(|fail| fail.error)?;
        schema::migrate(&mut client, &store.inner.options.schema).await?;
        Ok(store)
    }

    /// The kuralle schema version this build creates and reads (migrations are applied on
    /// connect).
    ///
    /// ```
    /// assert!(kuralle::stores::PostgresStore::SCHEMA_VERSION >= 3);
    /// ```
    pub const SCHEMA_VERSION: i32 = schema::SCHEMA_VERSION;

    /// The options the store was connected with.
    ///
    /// ```no_run
    /// # async fn demo(store: kuralle::stores::PostgresStore) {
    /// assert_eq!(store.options().schema, "public");
    /// # }
    /// ```
    pub fn options(&self) -> &PostgresOptions {
        &self.inner.options
    }

    async fn client(&self) -> Result<Object, errors::Fail> {
        self.inner.pool.get().await.map_err(errors::Fail::pool)
    }
}

impl crate::store::RunStore for PostgresStore {
    fn create_run(&self, run: crate::store::RunRecord, fence: u64) -> crate::store::StoreFuture<'_, ()> {
        Box::pin(async move { self.create_run_fenced(&run, Some(fence)).await })
    }

    fn get_run<'a>(&'a self, run_id: &'a str) -> crate::store::StoreFuture<'a, Option<crate::store::RunRecord>> {
        Box::pin(self.get_run_row(run_id))
    }

    fn put_run(&self, run: crate::store::RunRecord, fence: u64) -> crate::store::StoreFuture<'_, u64> {
        Box::pin(async move { self.put_run_fenced(&run, Some(fence)).await })
    }

    /// One statement: the run written, then the lease released (one commit).
    fn put_run_and_release(
        &self,
        run: crate::store::RunRecord,
        fence: u64,
    ) -> crate::store::StoreFuture<'_, (u64, bool)> {
        Box::pin(async move { self.put_run_statement(&run, Some(fence), true).await })
    }

    /// One statement: the run written with its last step at the next ordinal, then the lease
    /// released (one commit); a refused run journals nothing.
    fn put_run_and_release_after(
        &self,
        last: crate::store::FinishedStep,
        run: crate::store::RunRecord,
        fence: u64,
    ) -> crate::store::StoreFuture<'_, (u64, bool)> {
        Box::pin(self.put_run_release_after(last, run, fence))
    }

    fn list_runs(
        &self,
        filter: crate::store::RunFilter,
    ) -> crate::store::StoreFuture<'_, Vec<crate::store::RunSummary>> {
        Box::pin(async move { self.list_run_rows(&filter).await })
    }

    fn delete_run<'a>(&'a self, run_id: &'a str) -> crate::store::StoreFuture<'a, bool> {
        Box::pin(self.delete_run_row(run_id))
    }

    fn append_steps<'a>(
        &'a self,
        run_id: &'a str,
        fence: u64,
        steps: Vec<crate::store::NewStep>,
    ) -> crate::store::StoreFuture<'a, Vec<u64>> {
        Box::pin(async move { self.append_fenced(run_id, Some(fence), steps).await })
    }

    fn append_finished_with_intents<'a>(
        &'a self,
        run_id: &'a str,
        fence: u64,
        write: crate::store::FinishedWithIntents,
    ) -> crate::store::StoreFuture<'a, Vec<u64>> {
        Box::pin(async move { self.append_finished_fenced(run_id, Some(fence), write).await })
    }

    fn finish_step<'a>(
        &'a self,
        run_id: &'a str,
        fence: u64,
        ordinal: u64,
        outcome: crate::store::StepOutcome,
        finished_at_ms: i64,
    ) -> crate::store::StoreFuture<'a, ()> {
        Box::pin(async move { self.finish_fenced(run_id, Some(fence), ordinal, &outcome, finished_at_ms).await })
    }

    fn cancel_run<'a>(&'a self, run_id: &'a str) -> crate::store::StoreFuture<'a, Option<crate::store::RunStatus>> {
        Box::pin(self.cancel_run_row(run_id))
    }

    fn steps<'a>(&'a self, run_id: &'a str) -> crate::store::StoreFuture<'a, Vec<crate::store::StepRecord>> {
        Box::pin(self.step_rows(run_id))
    }

    fn acquire_lease<'a>(
        &'a self,
        run_id: &'a str,
        owner: &'a str,
        ttl: Duration,
    ) -> crate::store::StoreFuture<'a, crate::store::Lease> {
        Box::pin(self.acquire(run_id, owner, ttl))
    }

    /// One statement when the run is not there: the lease taken, the run created under it.
    fn acquire_lease_and_create_run<'a>(
        &'a self,
        new: crate::store::RunRecord,
        owner: &'a str,
        ttl: Duration,
    ) -> crate::store::StoreFuture<'a, (crate::store::Lease, Option<crate::store::RunRecord>)> {
        Box::pin(async move { self.acquire_creating(&new, owner, ttl).await })
    }

    fn renew_lease<'a>(
        &'a self,
        lease: &'a crate::store::Lease,
        ttl: Duration,
    ) -> crate::store::StoreFuture<'a, crate::store::Lease> {
        Box::pin(self.renew(lease, ttl))
    }

    fn renew_leases<'a>(
        &'a self,
        leases: &'a [crate::store::Lease],
        ttl: Duration,
    ) -> crate::store::StoreFuture<'a, Vec<Result<crate::store::Lease, StoreError>>> {
        Box::pin(self.renew_many(leases, ttl))
    }

    fn release_lease<'a>(&'a self, lease: &'a crate::store::Lease) -> crate::store::StoreFuture<'a, ()> {
        Box::pin(self.release(lease))
    }

    fn current_lease<'a>(&'a self, run_id: &'a str) -> crate::store::StoreFuture<'a, Option<crate::store::Lease>> {
        Box::pin(self.current(run_id))
    }

    fn claim_runnable<'a>(
        &'a self,
        owner: &'a str,
        ttl: Duration,
        limit: usize,
    ) -> crate::store::StoreFuture<'a, Vec<crate::store::Lease>> {
        Box::pin(self.claim(owner, ttl, limit))
    }

    /// A session advisory lock on a connection of its own (see the module `instance` for the
    /// key), held while the returned lock lives; the lock reports itself lost when that
    /// connection dies or stops answering pings (every 5 s).
    fn lock_instance<'a>(
        &'a self,
        instance_id: &'a str,
    ) -> crate::store::StoreFuture<'a, Option<Box<dyn crate::store::InstanceLock>>> {
        Box::pin(async move {
            let lock: Box<dyn crate::store::InstanceLock> = Box::new(self.lock_instance_session(instance_id).await?);
            Ok(Some(lock))
        })
    }

    fn notify_runnable(&self) -> crate::store::StoreFuture<'_, ()> {
        Box::pin(self.notify_hint())
    }

    fn wait_runnable(&self, poll: Duration) -> futures::future::BoxFuture<'_, ()> {
        Box::pin(self.wait_hint(poll))
    }
}
