//! `SqliteStore`: the embedded durable store.
//!
//! Layout (one idea per file):
//! - `writer.rs`: one **writer thread** owns the only write connection and commits every
//!   queued write together (group commit); an acknowledged write is durable
//!   (`synchronous=FULL`).
//! - `checkpoint.rs`: the WAL is checkpointed on a thread of its own, not inside commits.
//! - `runs.rs`, `steps.rs`, `leases.rs`: the SQL of the `RunStore` contract, one file per
//!   table, including the fence check that runs in each write's own transaction.
//! - `prepared.rs`: the connection those run on, which on the writer keeps the hot statements
//!   prepared; `known.rs`: what the writer knows of a run between its writes (its lease's
//!   token, its key in the file and next ordinal) while no other connection commits.
//! - `schema.rs`: the schema, its migrations, and the write connection's pragmas.
//! - `codec.rs`: rows ↔ records; `errors.rs`: SQLite errors → typed store errors.
//! - Here: the store handle, its options, and the pool of read-only connections (WAL readers
//!   never wait for the writer), used on `spawn_blocking`.

mod checkpoint;
mod codec;
mod errors;
mod instance;
mod known;
mod leases;
mod prepared;
mod runs;
mod schema;
mod steps;
mod writer;

use std::future::Future;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError, mpsc};
use std::thread::JoinHandle;
use std::time::Duration;

use rusqlite::{Connection, OpenFlags};
use tokio::sync::oneshot;

use self::checkpoint::Checkpointer;
use self::codec::prepare_run;
use self::errors::Mapper;
use self::prepared::Db;
use self::schema::configure_writer;
use self::writer::{FnJob, Job, Writes, writer_loop};
use super::{DEFAULT_MAX_VALUE_BYTES, check_len};
use crate::store::{
    FinishedStep, FinishedWithIntents, InstanceLock, Lease, NewStep, Registry, RunFilter, RunRecord, RunStore,
    RunSummary, StepOutcome, StepRecord, StoreError, StoreFuture,
};

/// The statements the writer keeps prepared (see [`Db`]): those of every write a run makes
/// (its start, its journal, its close), a lease's renewal, and the batch's transaction. Any
/// other statement comes from rusqlite's cache (among them the savepoint that a batch of
/// renewals runs in: one per batch, not per run).
const KEPT: &[&str] = &[
    steps::NEXT_ORDINAL,
    steps::INSERT_STEP,
    steps::KEY_TAKEN,
    steps::FINISH_STEP,
    steps::FINISH_STEP_KNOWN_FENCE,
    runs::RUN_EXISTS,
    runs::INSERT_RUN,
    runs::UPDATE_RUN,
    runs::UPDATE_RUN_KNOWN_FENCE,
    runs::GET_RUN,
    leases::FENCE,
    leases::ACQUIRE,
    leases::LEASE_ROW,
    leases::RENEW,
    leases::RELEASE,
    writer::BEGIN,
    writer::DATA_VERSION,
    writer::COMMIT,
];

/// Settings of a [`SqliteStore`]; start from [`Default`] and override fields.
///
/// ```
/// use std::time::Duration;
/// use kuralle::stores::SqliteOptions;
///
/// let options = SqliteOptions { busy_timeout: Duration::from_millis(500), ..SqliteOptions::default() };
/// assert_eq!(options.max_batch, 2048);
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SqliteOptions {
    /// How long a write waits for a lock held by another process or connection before it fails
    /// with a retryable [`StoreError::Unavailable`]. Default 5 s.
    pub busy_timeout: Duration,
    /// The most writes committed together in one transaction (group commit). Default 2048:
    /// each commit waits for one `fsync` (milliseconds on many disks), so under a backlog the
    /// batch, not the SQL, sets the throughput; an idle store commits each write alone.
    pub max_batch: usize,
    /// The largest accepted JSON value (run state, step result or error), in bytes of JSON
    /// text. Default [`DEFAULT_MAX_VALUE_BYTES`](super::DEFAULT_MAX_VALUE_BYTES).
    pub max_value_bytes: usize,
    /// Caps the size of the database file, in bytes (rounded down to whole pages, at least
    /// one; SQLite's `PRAGMA max_page_count` on the write connection), for example to keep a
    /// journal from filling a shared disk. A write that needs more room fails with a
    /// retryable [`StoreError::StorageFull`], exactly as on a full disk: it is not made,
    /// nothing acknowledged is lost, and the runs it stopped stay resumable once there is room
    /// (reopen with a larger limit, or delete finished runs). A limit below the file's current
    /// size holds it at its current size. The write-ahead log (`-wal` file) comes on top: it
    /// holds recent commits until a checkpoint copies them into the file. Default `None`
    /// (SQLite's own limit, and the disk's).
    pub max_size_bytes: Option<u64>,
    /// Time the writer waits inside each transaction before committing it, as a slow disk's
    /// `fsync` would: for fault tests of how runs behave on slow storage (leases, group
    /// commit). Default zero; leave it there outside tests.
    pub commit_delay: Duration,
    /// Read connections: at most this many reads run at once (each on a blocking thread), and
    /// their connections stay open for the next reads. Default 4.
    pub read_connections: usize,
    /// Bytes of database pages the write connection keeps in memory (SQLite's `cache_size`),
    /// rounded down to whole KiB (below a KiB, SQLite keeps its minimum of a few pages; the
    /// read connections keep SQLite's own 2 MiB each). Default 8 MiB: with thousands of runs
    /// in flight the pages their writes touch no longer fit SQLite's own 2 MiB, and every write
    /// re-read some from the OS. At 10,000 runs in flight, 16 MiB measured within the noise of
    /// 8, with runs named by the runtime or at random (UUID v4), and held about 1.3 KiB a run
    /// more at the process's peak; 4 MiB cost random ids about an eighth of the wall
    /// (`docs/operations.md`, "SQLite's page cache").
    pub page_cache_bytes: u64,
}

/// [`SqliteOptions::page_cache_bytes`]'s default.
const DEFAULT_PAGE_CACHE_BYTES: u64 = 8 << 20;

impl Default for SqliteOptions {
    fn default() -> Self {
        Self {
            busy_timeout: Duration::from_secs(5),
            max_batch: 2048,
            max_value_bytes: DEFAULT_MAX_VALUE_BYTES,
            max_size_bytes: None,
            commit_delay: Duration::ZERO,
            read_connections: 4,
            page_cache_bytes: DEFAULT_PAGE_CACHE_BYTES,
        }
    }
}

/// The embedded durable [`RunStore`]: a SQLite database file in WAL mode with
/// `synchronous=FULL`, written by one thread that commits concurrent writes together.
///
/// An acknowledged write survives a process crash and a power loss (if the device honours
/// flushes). Other processes may read the file while the store runs (a CLI inspecting a live
/// run). Clones share the same writer thread; the thread stops, after finishing every queued
/// write, when the last clone is dropped.
///
/// Errors are typed: a lock held too long by another process or a read-only file give a
/// retryable [`StoreError::Unavailable`]; a full disk, or a database at
/// [`SqliteOptions::max_size_bytes`], a retryable [`StoreError::StorageFull`]; a file that
/// is not a SQLite database gives [`StoreError::Corrupt`].
///
/// ```
/// use kuralle::stores::SqliteStore;
/// use kuralle::{NewStep, RunRecord, RunStatus, RunStore, StepKind, StepOutcome, StepStatus};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), kuralle::StoreError> {
/// let dir = std::env::temp_dir().join(format!("kuralle-doc-{}", std::process::id()));
/// std::fs::create_dir_all(&dir).unwrap();
/// let path = dir.join("runs.db");
///
/// let store = SqliteStore::open(&path)?;
/// let lease = store.acquire_lease("run-1", "me", std::time::Duration::from_secs(30)).await?;
/// let run = RunRecord {
///     run_id: "run-1".into(),
///     agent_id: "support".into(),
///     status: RunStatus::Running,
///     epoch: 0,
///     version: 0,
///     state: serde_json::json!({"turn": 1}).into(),
///     created_at_ms: 1,
///     updated_at_ms: 1,
/// };
/// store.create_run(run, lease.token).await?;
/// let step = NewStep { key: "k1".into(), kind: StepKind::Tool, name: "echo".into(), epoch: 0, started_at_ms: 2 };
/// let ordinals = store.append_steps("run-1", lease.token, vec![step]).await?;
/// store.finish_step("run-1", lease.token, ordinals[0], StepOutcome::Finished(kuralle::JsonText::from(serde_json::json!("hi"))), 3).await?;
/// drop(store);
///
/// // Everything acknowledged is there after reopening.
/// let store = SqliteStore::open(&path)?;
/// let steps = store.steps("run-1").await?;
/// assert_eq!(steps[0].status, StepStatus::Finished);
/// assert_eq!(steps[0].result.as_ref().expect("finished"), &serde_json::json!("hi"));
/// # drop(store);
/// # std::fs::remove_dir_all(&dir).unwrap();
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct SqliteStore {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for SqliteStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SqliteStore")
            .field("path", &self.inner.path)
            .field("options", &self.inner.options)
            .field("commits", &self.commit_count())
            .finish()
    }
}

struct Inner {
    path: Option<PathBuf>,
    options: SqliteOptions,
    errors: Mapper,
    writes: Option<mpsc::Sender<Box<dyn Job>>>,
    writer: Option<JoinHandle<()>>,
    /// `None` for an in-memory database: reads go through the writer's connection.
    readers: Option<ReaderPool>,
    commits: Arc<AtomicU64>,
    /// Instance ids held on an in-memory database (a file's are OS file locks).
    instances: Registry,
}

impl Drop for Inner {
    fn drop(&mut self) {
        // Readers close first so that the writer's connection is the last one and checkpoints.
        drop(self.readers.take());
        // Closing the channel lets the writer finish the queued writes and exit.
        drop(self.writes.take());
        if let Some(writer) = self.writer.take() {
            let _ = writer.join();
        }
    }
}

impl SqliteStore {
    /// Opens (creating if needed) the store at `path` with [`SqliteOptions::default`].
    ///
    /// ```
    /// let path = std::env::temp_dir().join(format!("kuralle-open-{}.db", std::process::id()));
    /// let store = kuralle::stores::SqliteStore::open(&path)?;
    /// # drop(store);
    /// # for suffix in ["", "-wal", "-shm"] { let _ = std::fs::remove_file(format!("{}{suffix}", path.display())); }
    /// # Ok::<(), kuralle::StoreError>(())
    /// ```
    ///
    /// # Errors
    /// [`StoreError::Corrupt`] if the file is not a SQLite database, holds tables named `runs` or
    /// `steps` that are not kuralle's, or a newer kuralle schema; [`StoreError::Unavailable`]
    /// if it cannot be opened or initialized right now (permissions, locks);
    /// [`StoreError::StorageFull`] if the disk is full.
    pub fn open(path: impl AsRef<Path>) -> Result<Self, StoreError> {
        Self::open_with(path, SqliteOptions::default())
    }

    /// Opens (creating if needed) the store at `path` with `options`.
    ///
    /// ```
    /// use std::time::Duration;
    /// use kuralle::stores::{SqliteOptions, SqliteStore};
    ///
    /// let path = std::env::temp_dir().join(format!("kuralle-open-with-{}.db", std::process::id()));
    /// let options = SqliteOptions { busy_timeout: Duration::from_secs(1), max_batch: 64, ..Default::default() };
    /// let store = SqliteStore::open_with(&path, options)?;
    /// # drop(store);
    /// # for suffix in ["", "-wal", "-shm"] { let _ = std::fs::remove_file(format!("{}{suffix}", path.display())); }
    /// # Ok::<(), kuralle::StoreError>(())
    /// ```
    ///
    /// # Errors
    /// As [`open`](Self::open).
    pub fn open_with(path: impl AsRef<Path>, options: SqliteOptions) -> Result<Self, StoreError> {
        let path = path.as_ref().to_path_buf();
        let errors = Mapper { busy_timeout: options.busy_timeout, max_size_bytes: options.max_size_bytes };
        create_private(&path);
        let flags = OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_CREATE | OpenFlags::SQLITE_OPEN_NO_MUTEX;
        let mut conn = Connection::open_with_flags(&path, flags).map_err(|e| errors.at_open(&path, e))?;
        configure_writer(&conn, &options, errors, Some(&path))?;
        if !options.commit_delay.is_zero() {
            // The hook runs inside COMMIT, on the writer thread, with the write lock held: the
            // same place a slow `fsync` costs its time.
            let delay = options.commit_delay;
            conn.commit_hook(Some(move || {
                std::thread::sleep(delay);
                false
            }))
            .map_err(|e| errors.at_open(&path, e))?;
        }
        let checkpointer = Checkpointer::start(&path, &mut conn, errors)?;
        let readers = ReaderPool {
            path: path.clone(),
            idle: Mutex::new(Vec::new()),
            max_idle: options.read_connections.max(1),
            permits: Arc::new(tokio::sync::Semaphore::new(options.read_connections.max(1))),
            errors,
        };
        // Fail now, not at the first read, if the file cannot be read.
        readers.with(|_| Ok(()))?;
        Ok(Self::start(conn, Some(path), options, errors, Some(readers), Some(checkpointer)))
    }

    /// A store in a private in-memory database: nothing survives the store. Reads and writes
    /// share the writer thread.
    ///
    /// ```
    /// let store = kuralle::stores::SqliteStore::in_memory()?;
    /// # drop(store);
    /// # Ok::<(), kuralle::StoreError>(())
    /// ```
    ///
    /// # Errors
    /// [`StoreError::Unavailable`] if SQLite cannot allocate the database.
    pub fn in_memory() -> Result<Self, StoreError> {
        let options = SqliteOptions::default();
        let errors = Mapper { busy_timeout: options.busy_timeout, max_size_bytes: options.max_size_bytes };
        let conn = Connection::open_in_memory().map_err(|e| errors.map(e))?;
        configure_writer(&conn, &options, errors, None)?;
        Ok(Self::start(conn, None, options, errors, None, None))
    }

    fn start(
        conn: Connection,
        path: Option<PathBuf>,
        options: SqliteOptions,
        errors: Mapper,
        readers: Option<ReaderPool>,
        checkpointer: Option<Checkpointer>,
    ) -> Self {
        let (writes, queue) = mpsc::channel::<Box<dyn Job>>();
        let commits = Arc::new(AtomicU64::new(0));
        let writer = {
            let commits = commits.clone();
            let max_batch = options.max_batch.max(1);
            // Linux keeps a thread's first 15 bytes as its name (`top -H`, `perf`, `/proc`):
            // this one and the checkpointer's must differ there.
            std::thread::Builder::new()
                .name("kuralle-writer".into())
                .spawn(move || writer_loop(conn, queue, max_batch, errors, &commits, checkpointer, KEPT))
        };
        // Without a writer thread every write fails with `Unavailable`.
        let writer = writer.ok();
        let writes = writer.as_ref().map(|_| writes);
        Self {
            inner: Arc::new(Inner {
                path,
                options,
                errors,
                writes,
                writer,
                readers,
                commits,
                instances: Registry::default(),
            }),
        }
    }

    /// How many write transactions the writer thread has committed. Concurrent writes share
    /// commits, so under load this grows much slower than the number of writes.
    ///
    /// ```
    /// let store = kuralle::stores::SqliteStore::in_memory()?;
    /// assert_eq!(store.commit_count(), 0);
    /// # Ok::<(), kuralle::StoreError>(())
    /// ```
    pub fn commit_count(&self) -> u64 {
        self.inner.commits.load(Ordering::Relaxed)
    }

    /// Queues a write of `data` by `f` for the writer thread; resolves after its transaction
    /// committed. The job comes back settled, and `data` is freed here, not on the writer
    /// (see [`FnJob`]).
    fn write<T, D, F>(
        &self,
        writes: Writes,
        data: D,
        f: F,
    ) -> impl Future<Output = Result<T, StoreError>> + Send + 'static
    where
        T: Send + 'static,
        D: Send + 'static,
        F: Fn(&Db<'_>, &D) -> Result<T, StoreError> + Copy + Send + 'static,
    {
        let inner = self.inner.clone();
        async move {
            let (reply, settled) = oneshot::channel();
            let job: Box<dyn Job> = Box::new(FnJob { writes, data, f, out: None, reply: Some(reply) });
            let stopped = || StoreError::Unavailable("the SQLite writer thread is not running".into());
            inner.writes.as_ref().ok_or_else(stopped)?.send(job).map_err(|_| stopped())?;
            // Drop our handle before waiting: if this is the last one, the writer may stop.
            drop(inner);
            settled.await.map_err(|_| stopped())?.settled()
        }
    }

    /// Runs a read on a pooled read connection, off the async threads when in a Tokio runtime.
    fn read<T, F>(&self, f: F) -> StoreFuture<'_, T>
    where
        T: Send + 'static,
        F: FnOnce(&Db<'_>) -> Result<T, StoreError> + Send + 'static,
    {
        if self.inner.readers.is_none() {
            // A read changes nothing: no savepoint. Only an in-memory store reads on its
            // writer, which then frees what the read captured.
            let read = std::cell::Cell::new(Some(f));
            return Box::pin(self.write(Writes::Direct, read, |conn, read| match read.take() {
                Some(f) => f(conn),
                None => Err(StoreError::Unavailable("read ran twice".into())),
            }));
        }
        let inner = self.inner.clone();
        Box::pin(async move {
            // At most `read_connections` reads at once: without the bound, 10,000 runs starting
            // together each got a blocking thread that opened (and then closed) a connection.
            let permit = match &inner.readers {
                Some(readers) => readers.permits.clone().acquire_owned().await.ok(),
                None => None,
            };
            let run = move || {
                let _permit = permit;
                match &inner.readers {
                    Some(readers) => readers.with(|conn| f(&Db::new(conn))),
                    None => Err(StoreError::Unavailable("no read connections".into())),
                }
            };
            match tokio::runtime::Handle::try_current() {
                Ok(handle) => handle
                    .spawn_blocking(run)
                    .await
                    .map_err(|e| StoreError::Unavailable(format!("read task failed: {e}").into()))?,
                Err(_) => run(),
            }
        })
    }
}

/// Run `run_id` read in the job that has just taken its lease: the read's own result, which
/// [`read_under`](crate::store::read_under) turns into a released lease when it failed; but
/// when SQLite rolled the whole transaction back (an I/O error, a full disk), the lease went
/// with it, and the writer must see the job fail.
fn read_under_new_lease(
    conn: &Db<'_>,
    errors: Mapper,
    run_id: &str,
) -> Result<Result<Option<RunRecord>, StoreError>, StoreError> {
    match runs::get_run(conn, errors, run_id) {
        Err(e) if conn.is_autocommit() => Err(e),
        read => Ok(read),
    }
}

/// Checks an outcome's size on the caller's thread, so the writer only runs SQL.
fn prepare_outcome(outcome: StepOutcome, max: usize) -> Result<steps::PreparedOutcome, StoreError> {
    match outcome {
        // Stored as the runtime wrote it: the text is checked by its length, never re-serialized.
        StepOutcome::Finished(text) => {
            check_len("step result", text.len(), max).map(|()| ("finished", Some(text), None))
        }
        StepOutcome::Failed(text) => check_len("step error", text.len(), max).map(|()| ("failed", None, Some(text))),
    }
}

/// A lease duration in whole milliseconds, as the SQL adds it to the store's clock.
fn ttl_ms(ttl: Duration) -> i64 {
    i64::try_from(ttl.as_millis()).unwrap_or(i64::MAX / 2)
}

impl RunStore for SqliteStore {
    fn create_run(&self, run: RunRecord, fence: u64) -> StoreFuture<'_, ()> {
        let prepared = prepare_run(&run, self.inner.options.max_value_bytes);
        let errors = self.inner.errors;
        Box::pin(self.write(Writes::Direct, (run, prepared), move |conn, (run, prepared)| {
            runs::insert_run(conn, errors, run, fence, prepared.as_ref().map_err(Clone::clone)?)
        }))
    }

    fn get_run<'a>(&'a self, run_id: &'a str) -> StoreFuture<'a, Option<RunRecord>> {
        let run_id = run_id.to_owned();
        let errors = self.inner.errors;
        self.read(move |conn| runs::get_run(conn, errors, &run_id))
    }

    fn put_run(&self, run: RunRecord, fence: u64) -> StoreFuture<'_, u64> {
        let prepared = prepare_run(&run, self.inner.options.max_value_bytes);
        let errors = self.inner.errors;
        Box::pin(self.write(Writes::Direct, (run, prepared), move |conn, (run, prepared)| {
            runs::update_run(conn, errors, run, fence, prepared.as_ref().map_err(Clone::clone)?)
        }))
    }

    /// One write job: the run's row, then the lease released (a run's end was two jobs and
    /// two replies). Only the run's write can be refused, and before it changed anything.
    fn put_run_and_release(&self, run: RunRecord, fence: u64) -> StoreFuture<'_, (u64, bool)> {
        let prepared = prepare_run(&run, self.inner.options.max_value_bytes);
        let errors = self.inner.errors;
        Box::pin(self.write(Writes::Direct, (run, prepared), move |conn, (run, prepared)| {
            runs::update_run_and_release(conn, errors, run, fence, prepared.as_ref().map_err(Clone::clone)?)
        }))
    }

    /// One job: the run's row, the last step appended finished, the lease released. The row
    /// goes first: only it can be refused in the ordinary course (a version conflict, a lost
    /// fence), and then nothing is changed yet. The step's insert, after it, fails only for a
    /// key already journaled, which the runtime never sends to a store that does both in one
    /// transaction; should a caller, the batch's transaction is rolled back (`Writes::Direct`).
    fn put_run_and_release_after(
        &self,
        last: FinishedStep,
        run: RunRecord,
        fence: u64,
    ) -> StoreFuture<'_, (u64, bool)> {
        let FinishedStep { step, outcome, finished_at_ms } = last;
        let max = self.inner.options.max_value_bytes;
        let prepared = prepare_run(&run, max);
        let outcome = prepare_outcome(outcome, max);
        let errors = self.inner.errors;
        let data = (run, prepared, step, outcome);
        Box::pin(self.write(Writes::Direct, data, move |conn, (run, prepared, step, outcome)| {
            let prepared = prepared.as_ref().map_err(Clone::clone)?;
            // Before the run's row changes, as the write's other refusals are.
            let rows = steps::Rows::new(Some(step), &[]);
            rows.check_epochs()?;
            let outcome = outcome.as_ref().map_err(Clone::clone)?;
            let version = runs::update_run(conn, errors, run, fence, prepared)?;
            let at = steps::next_ordinal(conn, errors, &run.run_id, fence)?;
            steps::insert(conn, errors, &run.run_id, at, rows, Some((outcome, finished_at_ms)))?;
            leases::release(conn, errors, &run.run_id, fence)?;
            Ok((version, true))
        }))
    }

    fn list_runs(&self, filter: RunFilter) -> StoreFuture<'_, Vec<RunSummary>> {
        let errors = self.inner.errors;
        self.read(move |conn| runs::list_runs(conn, errors, &filter))
    }

    fn delete_run<'a>(&'a self, run_id: &'a str) -> StoreFuture<'a, bool> {
        let run_id = run_id.to_owned();
        let errors = self.inner.errors;
        Box::pin(self.write(Writes::InSavepoint, run_id, move |conn, run_id| runs::delete_run(conn, errors, run_id)))
    }

    fn append_steps<'a>(&'a self, run_id: &'a str, fence: u64, steps: Vec<NewStep>) -> StoreFuture<'a, Vec<u64>> {
        let run_id = run_id.to_owned();
        let errors = self.inner.errors;
        Box::pin(self.write(Writes::Direct, (run_id, steps), move |conn, (run_id, steps)| {
            steps::append(conn, errors, run_id, fence, steps)
        }))
    }

    fn finish_step<'a>(
        &'a self,
        run_id: &'a str,
        fence: u64,
        ordinal: u64,
        outcome: StepOutcome,
        finished_at_ms: i64,
    ) -> StoreFuture<'a, ()> {
        let run_id = run_id.to_owned();
        let errors = self.inner.errors;
        let max = self.inner.options.max_value_bytes;
        let prepared = prepare_outcome(outcome, max);
        Box::pin(self.write(Writes::Direct, (run_id, prepared), move |conn, (run_id, prepared)| {
            let prepared = prepared.as_ref().map_err(Clone::clone)?;
            steps::finish(conn, errors, run_id, fence, ordinal, prepared, finished_at_ms)
        }))
    }

    fn append_finished_with_intents<'a>(
        &'a self,
        run_id: &'a str,
        fence: u64,
        write: FinishedWithIntents,
    ) -> StoreFuture<'a, Vec<u64>> {
        let FinishedWithIntents { finished, outcome, finished_at_ms, intents } = write;
        let run_id = run_id.to_owned();
        let errors = self.inner.errors;
        let max = self.inner.options.max_value_bytes;
        let prepared = prepare_outcome(outcome, max);
        // One job, so the response and its calls' intents land together or not at all. The
        // response is inserted finished: it was inserted running and then updated, a second
        // write of the same row.
        let data = (run_id, finished, intents, prepared);
        Box::pin(self.write(Writes::Direct, data, move |conn, (run_id, finished, intents, prepared)| {
            let rows = steps::Rows::new(Some(finished), intents);
            rows.check_epochs()?;
            let outcome = prepared.as_ref().map_err(Clone::clone)?;
            let at = steps::next_ordinal(conn, errors, run_id, fence)?;
            steps::insert(conn, errors, run_id, at, rows, Some((outcome, finished_at_ms)))
        }))
    }

    fn cancel_run<'a>(&'a self, run_id: &'a str) -> StoreFuture<'a, Option<crate::store::RunStatus>> {
        let run_id = run_id.to_owned();
        let errors = self.inner.errors;
        Box::pin(self.write(Writes::InSavepoint, run_id, move |conn, run_id| runs::cancel_run(conn, errors, run_id)))
    }

    fn steps<'a>(&'a self, run_id: &'a str) -> StoreFuture<'a, Vec<StepRecord>> {
        let run_id = run_id.to_owned();
        let errors = self.inner.errors;
        self.read(move |conn| steps::steps(conn, errors, &run_id))
    }

    fn acquire_lease<'a>(&'a self, run_id: &'a str, owner: &'a str, ttl: Duration) -> StoreFuture<'a, Lease> {
        let (run_id, owner) = (run_id.to_owned(), owner.to_owned());
        let errors = self.inner.errors;
        Box::pin(self.write(Writes::Direct, (run_id, owner), move |conn, (run_id, owner)| {
            leases::acquire(conn, errors, run_id, owner, ttl_ms(ttl))
        }))
    }

    /// One job on the writer thread: the lease taken, then the run read on the writer's
    /// connection in the same transaction. A read that fails leaves the lease to commit, and
    /// the lease is then given back, as the default does; only a failure that made SQLite roll
    /// the transaction back fails the job (the lease is gone with it).
    fn acquire_lease_and_get_run<'a>(
        &'a self,
        run_id: &'a str,
        owner: &'a str,
        ttl: Duration,
    ) -> StoreFuture<'a, (Lease, Option<RunRecord>)> {
        let data = (run_id.to_owned(), owner.to_owned());
        let errors = self.inner.errors;
        Box::pin(async move {
            let (lease, read) = self
                .write(Writes::Direct, data, move |conn, (run_id, owner)| {
                    let lease = leases::acquire(conn, errors, run_id, owner, ttl_ms(ttl))?;
                    Ok((lease, read_under_new_lease(conn, errors, run_id)?))
                })
                .await?;
            crate::store::read_under(self, lease, read).await
        })
    }

    /// One job: the lease taken, then the row inserted unless the run exists (a read first, so
    /// an existing run changes nothing and needs no savepoint), else the run read, as
    /// `acquire_lease_and_get_run` reads it.
    fn acquire_lease_and_create_run<'a>(
        &'a self,
        new: RunRecord,
        owner: &'a str,
        ttl: Duration,
    ) -> StoreFuture<'a, (Lease, Option<RunRecord>)> {
        let prepared = prepare_run(&new, self.inner.options.max_value_bytes);
        let data = (new, prepared, owner.to_owned());
        let errors = self.inner.errors;
        Box::pin(async move {
            let (lease, read) = self
                .write(Writes::Direct, data, move |conn, (new, prepared, owner)| {
                    // Refused before the lease is taken: a run too large to store.
                    let prepared = prepared.as_ref().map_err(Clone::clone)?;
                    let lease = leases::acquire(conn, errors, &new.run_id, owner, ttl_ms(ttl))?;
                    if let Some(run_key) = runs::insert_row(conn, errors, new, prepared)? {
                        steps::created(conn, &new.run_id, run_key, lease.token);
                        return Ok((lease, Ok(None)));
                    }
                    Ok((lease, read_under_new_lease(conn, errors, &new.run_id)?))
                })
                .await?;
            crate::store::read_under(self, lease, read).await
        })
    }

    fn renew_lease<'a>(&'a self, lease: &'a Lease, ttl: Duration) -> StoreFuture<'a, Lease> {
        let lease = lease.clone();
        let errors = self.inner.errors;
        Box::pin(self.write(Writes::Direct, lease, move |conn, lease| leases::renew(conn, errors, lease, ttl_ms(ttl))))
    }

    fn renew_leases<'a>(
        &'a self,
        leases: &'a [Lease],
        ttl: Duration,
    ) -> StoreFuture<'a, Vec<Result<Lease, StoreError>>> {
        // One write job: one savepoint in the writer's shared transaction, one reply.
        let leases = leases.to_vec();
        let errors = self.inner.errors;
        Box::pin(self.write(Writes::InSavepoint, leases, move |conn, leases| {
            leases::renew_many(conn, errors, leases, ttl_ms(ttl))
        }))
    }

    /// The first poll of a `finish_step` queues its job for the writer thread, which commits
    /// it and leaves the answer in the job's channel.
    fn finishes_without_polling(&self) -> bool {
        true
    }

    fn release_lease<'a>(&'a self, lease: &'a Lease) -> StoreFuture<'a, ()> {
        let (run_id, token) = (lease.run_id.clone(), lease.token);
        let errors = self.inner.errors;
        Box::pin(self.write(Writes::Direct, run_id, move |conn, run_id| leases::release(conn, errors, run_id, token)))
    }

    fn current_lease<'a>(&'a self, run_id: &'a str) -> StoreFuture<'a, Option<Lease>> {
        let run_id = run_id.to_owned();
        let errors = self.inner.errors;
        self.read(move |conn| leases::current_lease(conn, errors, &run_id))
    }

    /// An OS file lock on `<db file>.instance-<hex of the id>.lock`, held while the returned
    /// lock lives (the kernel drops it when the process dies); the in-process registry for an
    /// in-memory database. The file lock is advisory and, on network file systems, only as
    /// reliable as their locking: keep the database on a local disk.
    fn lock_instance<'a>(&'a self, instance_id: &'a str) -> StoreFuture<'a, Option<Box<dyn InstanceLock>>> {
        Box::pin(async move {
            let lock: Box<dyn InstanceLock> = Box::new(self.lock_instance_now(instance_id)?);
            Ok(Some(lock))
        })
    }
}

/// Read-only connections, at most `permits` in use at once, each kept for the next read.
struct ReaderPool {
    path: PathBuf,
    idle: Mutex<Vec<Connection>>,
    max_idle: usize,
    /// One per read connection; a read waits for one before it takes a blocking thread.
    permits: Arc<tokio::sync::Semaphore>,
    errors: Mapper,
}

impl ReaderPool {
    fn with<T>(&self, f: impl FnOnce(&Connection) -> Result<T, StoreError>) -> Result<T, StoreError> {
        let idle = self.idle.lock().unwrap_or_else(PoisonError::into_inner).pop();
        let conn = match idle {
            Some(conn) => conn,
            None => self.connect()?,
        };
        let result = f(&conn);
        let mut idle = self.idle.lock().unwrap_or_else(PoisonError::into_inner);
        if idle.len() < self.max_idle {
            idle.push(conn);
        }
        result
    }

    fn connect(&self) -> Result<Connection, StoreError> {
        let flags = OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX;
        let conn = Connection::open_with_flags(&self.path, flags).map_err(|e| self.errors.at_open(&self.path, e))?;
        conn.busy_timeout(self.errors.busy_timeout).map_err(|e| self.errors.map(e))?;
        conn.set_prepared_statement_cache_capacity(schema::STATEMENT_CACHE);
        schema::stable_plans(&conn).map_err(|e| self.errors.map(e))?;
        Ok(conn)
    }
}

/// Creates a new database file readable by its owner only: the journal holds tool arguments
/// and results, secrets included (resume needs them). SQLite gives the `-wal` and `-shm` files
/// it creates beside it the same mode. An existing file keeps its mode, and a failure here is
/// left to SQLite's open, which reports it with the path.
fn create_private(path: &Path) {
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        let _ = std::fs::OpenOptions::new().write(true).create_new(true).mode(0o600).open(path);
    }
    #[cfg(not(unix))]
    let _ = path;
}

/// The first column of every row `sql` returns, for tests that look at the tables.
#[cfg(test)]
fn column<T: rusqlite::types::FromSql>(conn: &Connection, sql: &str) -> Vec<T> {
    let mut stmt = conn.prepare(sql).expect("the test's query prepares");
    let rows = stmt.query_map([], |row| row.get(0)).expect("the test's query runs");
    rows.collect::<Result<_, _>>().expect("the test's rows read")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::{RunStatus, StepKind};

    fn failure(code: i32) -> rusqlite::Error {
        rusqlite::Error::SqliteFailure(rusqlite::ffi::Error::new(code), None)
    }

    #[test]
    fn sqlite_errors_map_to_typed_store_errors() {
        let errors = Mapper { busy_timeout: Duration::from_millis(300), max_size_bytes: None };
        for code in [
            rusqlite::ffi::SQLITE_BUSY,
            rusqlite::ffi::SQLITE_LOCKED,
            rusqlite::ffi::SQLITE_READONLY,
            rusqlite::ffi::SQLITE_FULL,
            rusqlite::ffi::SQLITE_IOERR,
            rusqlite::ffi::SQLITE_CANTOPEN,
        ] {
            let mapped = errors.map(failure(code));
            assert!(mapped.is_retryable(), "code {code} → {mapped}");
        }
        let busy = errors.map(failure(rusqlite::ffi::SQLITE_BUSY)).to_string();
        assert!(busy.contains("locked by another process") && busy.contains("300 ms"), "{busy}");
        let snapshot = errors.map(failure(rusqlite::ffi::SQLITE_BUSY_SNAPSHOT)).to_string();
        assert!(snapshot.contains("extended code 517"), "{snapshot}");
        assert!(matches!(errors.map(failure(rusqlite::ffi::SQLITE_NOTADB)), StoreError::Corrupt(_)));
        assert!(matches!(errors.map(failure(rusqlite::ffi::SQLITE_CORRUPT)), StoreError::Corrupt(_)));
        assert!(matches!(errors.map(failure(rusqlite::ffi::SQLITE_TOOBIG)), StoreError::LimitExceeded(_)));
        let full = errors.map(failure(rusqlite::ffi::SQLITE_FULL));
        assert!(matches!(&full, StoreError::StorageFull(m) if m.contains("free disk space")), "{full}");
        let capped = Mapper { max_size_bytes: Some(4096), ..errors }.map(failure(rusqlite::ffi::SQLITE_FULL));
        assert!(capped.to_string().contains("raise SqliteOptions::max_size_bytes"), "{capped}");
    }

    fn record(run_id: &str) -> RunRecord {
        RunRecord {
            run_id: run_id.into(),
            agent_id: "a".into(),
            status: RunStatus::Running,
            epoch: 0,
            version: 0,
            state: serde_json::json!({"x": 1}).into(),
            created_at_ms: 1,
            updated_at_ms: 1,
        }
    }

    fn intent(key: &str) -> NewStep {
        NewStep { key: key.into(), kind: StepKind::Tool, name: "t".into(), epoch: 0, started_at_ms: 2 }
    }

    fn response(intents: &[&str]) -> FinishedWithIntents {
        FinishedWithIntents {
            finished: NewStep {
                key: "m".into(),
                kind: StepKind::Model,
                name: "model".into(),
                epoch: 0,
                started_at_ms: 2,
            },
            outcome: StepOutcome::Finished(serde_json::json!("response").into()),
            finished_at_ms: 3,
            intents: intents.iter().map(|key| intent(key)).collect(),
        }
    }

    /// The run `r`, created under a fresh lease of owner `me`; returns the lease.
    async fn created(store: &SqliteStore) -> Lease {
        let lease = store.acquire_lease("r", "me", Duration::from_secs(60)).await.unwrap();
        store.create_run(record("r"), lease.token).await.unwrap();
        lease
    }

    fn finished(value: i64) -> StepOutcome {
        StepOutcome::Finished(serde_json::json!(value).into())
    }

    /// The writes whose fence check is now part of their one statement (or of the read before
    /// it) refuse a stale token with `Fenced`, and write nothing.
    #[test]
    fn a_fenced_write_of_one_statement_is_refused_and_writes_nothing() {
        let store = SqliteStore::in_memory().unwrap();
        futures::executor::block_on(async {
            let lease = created(&store).await;
            assert_eq!(store.append_steps("r", lease.token, vec![intent("a")]).await.unwrap(), [0]);
            let stale = lease.token + 1;
            let fenced = StoreError::Fenced { run_id: "r".into(), token: stale };
            let mut changed = record("r");
            changed.state = serde_json::json!({"x": 2}).into();
            assert_eq!(store.put_run(changed.clone(), stale).await.unwrap_err(), fenced);
            assert_eq!(store.put_run_and_release(changed, stale).await.unwrap_err(), fenced);
            assert_eq!(store.finish_step("r", stale, 0, finished(1), 3).await.unwrap_err(), fenced);
            assert_eq!(store.append_steps("r", stale, vec![intent("b")]).await.unwrap_err(), fenced);
            assert_eq!(store.append_steps("r", stale, vec![intent("b"), intent("c")]).await.unwrap_err(), fenced);
            assert_eq!(store.append_finished_with_intents("r", stale, response(&[])).await.unwrap_err(), fenced);
            assert_eq!(store.append_finished_with_intents("r", stale, response(&["b"])).await.unwrap_err(), fenced);
            // A token beyond SQLite's integers is no lease's either.
            let huge = StoreError::Fenced { run_id: "r".into(), token: u64::MAX };
            assert_eq!(store.finish_step("r", u64::MAX, 0, finished(1), 3).await.unwrap_err(), huge);
            assert_eq!(store.put_run(record("r"), u64::MAX).await.unwrap_err(), huge);
            assert_eq!(store.append_steps("r", u64::MAX, vec![intent("b")]).await.unwrap_err(), huge);
            // A lease of another run does not fence this one in.
            let other = store.acquire_lease("other", "me", Duration::from_secs(60)).await.unwrap();
            assert_ne!(other.token, stale);

            assert_eq!(store.get_run("r").await.unwrap(), Some(record("r")));
            let steps = store.steps("r").await.unwrap();
            assert_eq!(steps.len(), 1);
            assert_eq!(steps[0].status, crate::store::StepStatus::Running);
            assert_eq!(store.current_lease("r").await.unwrap(), Some(lease.clone()));

            // A released lease fences its own token.
            store.release_lease(&lease).await.unwrap();
            let released = StoreError::Fenced { run_id: "r".into(), token: lease.token };
            assert_eq!(store.finish_step("r", lease.token, 0, finished(1), 3).await.unwrap_err(), released);
            assert_eq!(store.put_run(record("r"), lease.token).await.unwrap_err(), released);
            assert_eq!(store.release_lease(&lease).await.unwrap_err(), released);
        });
    }

    /// An epoch beyond SQLite's integers refuses its write with `LimitExceeded` before a row
    /// changes, wherever its step is in the write (the finished step, or a later intent), and
    /// before the fence is checked.
    #[test]
    fn an_epoch_beyond_sqlites_integers_refuses_the_whole_write() {
        let store = SqliteStore::in_memory().unwrap();
        futures::executor::block_on(async {
            let lease = created(&store).await;
            let huge = |mut step: NewStep| {
                step.epoch = u64::MAX;
                step
            };
            let refused =
                |e: StoreError| assert!(matches!(&e, StoreError::LimitExceeded(m) if m.contains("step epoch")), "{e}");
            refused(store.append_steps("r", lease.token, vec![intent("a"), huge(intent("b"))]).await.unwrap_err());
            let mut first = response(&["a"]);
            first.finished = huge(first.finished);
            refused(store.append_finished_with_intents("r", lease.token, first).await.unwrap_err());
            let mut later = response(&["a", "b"]);
            later.intents[1] = huge(intent("b"));
            refused(store.append_finished_with_intents("r", lease.token, later).await.unwrap_err());
            let last = FinishedStep { step: huge(intent("m")), outcome: finished(1), finished_at_ms: 3 };
            refused(store.put_run_and_release_after(last, record("r"), lease.token).await.unwrap_err());
            // Before the fence, as PostgreSQL answers too.
            let stale = lease.token + 1;
            refused(store.append_steps("r", stale, vec![huge(intent("a"))]).await.unwrap_err());
            let mut fenced = response(&["a"]);
            fenced.intents[0] = huge(intent("a"));
            refused(store.append_finished_with_intents("r", stale, fenced).await.unwrap_err());
            // Nothing of any of them landed, and the run and its lease are as they were.
            assert!(store.steps("r").await.unwrap().is_empty());
            assert_eq!(store.get_run("r").await.unwrap(), Some(record("r")));
            assert_eq!(store.current_lease("r").await.unwrap(), Some(lease.clone()));
            assert_eq!(store.append_steps("r", lease.token, vec![intent("a"), intent("b")]).await.unwrap(), [0, 1]);
        });
    }

    /// A response whose calls' intents repeat its own key, or each other's, is refused with
    /// `DuplicateKey` for the key whose insert would have failed first, and writes nothing.
    #[test]
    fn a_write_that_repeats_a_key_of_its_own_writes_nothing() {
        let store = SqliteStore::in_memory().unwrap();
        futures::executor::block_on(async {
            let lease = created(&store).await;
            let duplicate = |key: &str| StoreError::DuplicateKey { run_id: "r".into(), key: key.into() };
            let write = |keys: &[&str]| store.append_finished_with_intents("r", lease.token, response(keys));
            assert_eq!(write(&["m"]).await.unwrap_err(), duplicate("m"));
            assert_eq!(write(&["a", "b", "a"]).await.unwrap_err(), duplicate("a"));
            assert!(store.steps("r").await.unwrap().is_empty());
            assert_eq!(write(&["a"]).await.unwrap(), [0, 1]);
            // Now journaled, the response's own key refuses the next write at its first insert.
            assert_eq!(write(&["b"]).await.unwrap_err(), duplicate("m"));
            assert_eq!(store.steps("r").await.unwrap().len(), 2);
        });
    }

    /// When the one statement changed nothing, reads tell why, in the order the separate fence
    /// check gave: fenced first, then the run missing, then the write's own refusal.
    #[test]
    fn a_write_that_changed_nothing_gets_the_same_typed_error() {
        let store = SqliteStore::in_memory().unwrap();
        futures::executor::block_on(async {
            let lease = created(&store).await;
            assert_eq!(store.append_steps("r", lease.token, vec![intent("a")]).await.unwrap(), [0]);
            store.finish_step("r", lease.token, 0, finished(1), 3).await.unwrap();
            let not_running = |ordinal| StoreError::StepNotRunning { run_id: "r".into(), ordinal };
            assert_eq!(store.finish_step("r", lease.token, 0, finished(2), 4).await.unwrap_err(), not_running(0));
            assert_eq!(store.finish_step("r", lease.token, 7, finished(2), 4).await.unwrap_err(), not_running(7));
            assert_eq!(
                store.finish_step("r", lease.token, u64::MAX, finished(2), 4).await.unwrap_err(),
                not_running(u64::MAX)
            );
            let duplicate = StoreError::DuplicateKey { run_id: "r".into(), key: "a".into() };
            assert_eq!(store.append_steps("r", lease.token, vec![intent("a")]).await.unwrap_err(), duplicate);
            assert_eq!(
                store.append_steps("r", lease.token, vec![intent("b"), intent("a")]).await.unwrap_err(),
                duplicate
            );
            assert_eq!(
                store.append_finished_with_intents("r", lease.token, response(&["a"])).await.unwrap_err(),
                duplicate
            );
            // The step whose insert would fail first is named, whichever check finds it.
            let steps = vec![intent("a"), intent("q"), intent("q")];
            assert_eq!(store.append_steps("r", lease.token, steps).await.unwrap_err(), duplicate);
            let steps = vec![intent("a"), intent("q")];
            assert_eq!(store.append_steps("r", lease.token, steps).await.unwrap_err(), duplicate);
            let repeated = StoreError::DuplicateKey { run_id: "r".into(), key: "q".into() };
            let steps = vec![intent("p"), intent("q"), intent("q")];
            assert_eq!(store.append_steps("r", lease.token, steps).await.unwrap_err(), repeated);
            let mut stale = record("r");
            stale.version = 3;
            let conflict = StoreError::VersionConflict { run_id: "r".into(), expected: 3, actual: 0 };
            assert_eq!(store.put_run(stale.clone(), lease.token).await.unwrap_err(), conflict);
            assert_eq!(store.put_run_and_release(stale, lease.token).await.unwrap_err(), conflict);
            assert_eq!(store.current_lease("r").await.unwrap(), Some(lease.clone()), "a refused write keeps the lease");
            let exists = StoreError::RunExists("r".into());
            assert_eq!(store.create_run(record("r"), lease.token).await.unwrap_err(), exists);
            // Nothing of the refused writes is there: the finished step and no other.
            let steps = store.steps("r").await.unwrap();
            assert_eq!(steps.len(), 1);
            assert_eq!(steps[0].result.as_ref().map(crate::json::JsonText::to_value), Some(serde_json::json!(1)));

            // A lease without its run: the fence holds, the run is missing.
            let ghost = store.acquire_lease("ghost", "me", Duration::from_secs(60)).await.unwrap();
            let missing = StoreError::RunNotFound("ghost".into());
            assert_eq!(store.put_run(record("ghost"), ghost.token).await.unwrap_err(), missing);
            assert_eq!(store.put_run_and_release(record("ghost"), ghost.token).await.unwrap_err(), missing);
            assert_eq!(store.finish_step("ghost", ghost.token, 0, finished(1), 3).await.unwrap_err(), missing);
            assert_eq!(store.append_steps("ghost", ghost.token, vec![intent("a")]).await.unwrap_err(), missing);
            assert_eq!(
                store.append_finished_with_intents("ghost", ghost.token, response(&["a"])).await.unwrap_err(),
                missing
            );
            // …and fenced comes first.
            let fenced = StoreError::Fenced { run_id: "ghost".into(), token: ghost.token + 1 };
            assert_eq!(store.put_run(record("ghost"), ghost.token + 1).await.unwrap_err(), fenced);
            assert_eq!(store.finish_step("ghost", ghost.token + 1, 0, finished(1), 3).await.unwrap_err(), fenced);
            assert_eq!(store.append_steps("ghost", ghost.token + 1, vec![intent("a")]).await.unwrap_err(), fenced);
            assert_eq!(store.current_lease("ghost").await.unwrap(), Some(ghost));
        });
    }

    /// The closing write is one transaction: a refused run (a version conflict, a stale token, a
    /// missing run) journals nothing, and a written one lands with its last step and gives the
    /// lease up.
    #[test]
    fn the_closing_write_journals_the_last_step_or_nothing() {
        let store = SqliteStore::in_memory().unwrap();
        futures::executor::block_on(async {
            let lease = created(&store).await;
            assert_eq!(store.append_finished_with_intents("r", lease.token, response(&["a"])).await.unwrap(), [0, 1]);
            store.finish_step("r", lease.token, 1, finished(1), 3).await.unwrap();
            let last = || {
                let response = response(&[]);
                crate::store::FinishedStep {
                    step: NewStep { key: "m2".into(), ..response.finished },
                    outcome: response.outcome,
                    finished_at_ms: 9,
                }
            };
            let mut stale = record("r");
            stale.version = 3;
            let conflict = StoreError::VersionConflict { run_id: "r".into(), expected: 3, actual: 0 };
            assert_eq!(store.put_run_and_release_after(last(), stale, lease.token).await.unwrap_err(), conflict);
            let fenced = StoreError::Fenced { run_id: "r".into(), token: lease.token + 1 };
            assert_eq!(
                store.put_run_and_release_after(last(), record("r"), lease.token + 1).await.unwrap_err(),
                fenced
            );
            let ghost = store.acquire_lease("ghost", "me", Duration::from_secs(60)).await.unwrap();
            let missing = StoreError::RunNotFound("ghost".into());
            assert_eq!(
                store.put_run_and_release_after(last(), record("ghost"), ghost.token).await.unwrap_err(),
                missing
            );
            assert_eq!(store.steps("r").await.unwrap().len(), 2, "refused: nothing journaled");
            assert_eq!(store.steps("ghost").await.unwrap().len(), 0);
            assert_eq!(store.current_lease("r").await.unwrap(), Some(lease.clone()), "refused: the lease kept");

            let commits = store.commit_count();
            let mut done = record("r");
            done.status = RunStatus::Finished;
            assert_eq!(store.put_run_and_release_after(last(), done.clone(), lease.token).await.unwrap(), (1, true));
            assert_eq!(store.commit_count(), commits + 1, "one commit");
            assert_eq!(store.get_run("r").await.unwrap(), Some(RunRecord { version: 1, ..done }));
            let steps = store.steps("r").await.unwrap();
            let last_step = &steps[2];
            use crate::store::StepStatus::Finished;
            assert_eq!((last_step.ordinal, last_step.key.as_str(), last_step.status), (2, "m2", Finished));
            assert_eq!(last_step.finished_at_ms, Some(9));
            assert_eq!(store.current_lease("r").await.unwrap(), None);
        });
    }

    /// A response journaled with its intents is inserted finished (not inserted running and
    /// then updated); its intents follow it; the run's last write gives the lease up with it.
    #[test]
    fn a_response_lands_finished_and_the_last_write_releases_the_lease() {
        let store = SqliteStore::in_memory().unwrap();
        futures::executor::block_on(async {
            let lease = created(&store).await;
            assert_eq!(
                store.append_finished_with_intents("r", lease.token, response(&["a", "b"])).await.unwrap(),
                [0, 1, 2]
            );
            let mut last = response(&[]);
            last.finished.key = "m2".into();
            last.outcome = StepOutcome::Failed(serde_json::json!({"error": "x"}).into());
            assert_eq!(store.append_finished_with_intents("r", lease.token, last).await.unwrap(), [3]);
            let steps = store.steps("r").await.unwrap();
            let statuses: Vec<_> = steps.iter().map(|s| (s.ordinal, s.key.as_str(), s.status)).collect();
            use crate::store::StepStatus::{Failed, Finished, Running};
            assert_eq!(statuses, [(0, "m", Finished), (1, "a", Running), (2, "b", Running), (3, "m2", Failed)]);
            assert_eq!(
                steps[0].result.as_ref().map(crate::json::JsonText::to_value),
                Some(serde_json::json!("response"))
            );
            assert_eq!((steps[0].error.as_ref(), steps[0].finished_at_ms), (None, Some(3)));
            assert_eq!(
                steps[3].error.as_ref().map(crate::json::JsonText::to_value),
                Some(serde_json::json!({"error": "x"}))
            );
            assert_eq!(steps[3].result, None);

            let mut done = record("r");
            done.status = RunStatus::Finished;
            assert_eq!(store.put_run_and_release(done.clone(), lease.token).await.unwrap(), (1, true));
            assert_eq!(store.get_run("r").await.unwrap(), Some(RunRecord { version: 1, ..done }));
            assert_eq!(store.current_lease("r").await.unwrap(), None);
            let fenced = StoreError::Fenced { run_id: "r".into(), token: lease.token };
            assert_eq!(store.release_lease(&lease).await.unwrap_err(), fenced);
            assert_eq!(store.acquire_lease("r", "b", Duration::from_secs(60)).await.unwrap().token, lease.token + 1);
        });
    }

    /// What the writer knows of a run (its lease holding, its next ordinal) is forgotten when
    /// another connection commits: a second store on the same file cancels the run (which
    /// releases its lease), and the first store's writes under the lease it knew are fenced;
    /// the same store deletes a run, and the first store's append finds it gone.
    #[test]
    fn another_connections_commit_makes_the_writer_read_again() {
        let (dir, _) = checkpoint::wal_database("known");
        let path = dir.0.join("kuralle.db");
        let first = SqliteStore::open(&path).unwrap();
        let second = SqliteStore::open(&path).unwrap();
        futures::executor::block_on(async {
            let lease = created(&first).await;
            assert_eq!(first.append_steps("r", lease.token, vec![intent("a")]).await.unwrap(), [0]);
            first.finish_step("r", lease.token, 0, finished(1), 3).await.unwrap();
            let version = first.put_run(record("r"), lease.token).await.unwrap();
            assert_eq!(first.append_steps("r", lease.token, vec![intent("b")]).await.unwrap(), [1]);

            assert_eq!(second.cancel_run("r").await.unwrap(), Some(RunStatus::Running));
            let fenced = StoreError::Fenced { run_id: "r".into(), token: lease.token };
            assert_eq!(first.finish_step("r", lease.token, 1, finished(2), 4).await.unwrap_err(), fenced);
            assert_eq!(first.append_steps("r", lease.token, vec![intent("c")]).await.unwrap_err(), fenced);
            let mut next = record("r");
            next.version = version;
            assert_eq!(first.put_run(next, lease.token).await.unwrap_err(), fenced);
            assert_eq!(first.steps("r").await.unwrap().len(), 2);

            // A run of the first store, deleted by the second: its lease row stays unreleased.
            let lease = first.acquire_lease("d", "me", Duration::from_secs(60)).await.unwrap();
            first.create_run(record("d"), lease.token).await.unwrap();
            assert_eq!(first.append_steps("d", lease.token, vec![intent("a")]).await.unwrap(), [0]);
            assert!(second.delete_run("d").await.unwrap());
            assert_eq!(
                first.append_steps("d", lease.token, vec![intent("b")]).await.unwrap_err(),
                StoreError::RunNotFound("d".into())
            );
            assert!(first.steps("d").await.unwrap().is_empty());
        });
    }

    /// The writer forgets a run whose lease it changes other than by a journal write: a run it
    /// cancels, and the leases of an instance it takes back.
    #[test]
    fn the_writer_forgets_a_run_it_cancels_or_takes_back() {
        let store = SqliteStore::in_memory().unwrap();
        futures::executor::block_on(async {
            let lease = created(&store).await;
            assert_eq!(store.append_steps("r", lease.token, vec![intent("a")]).await.unwrap(), [0]);
            assert_eq!(store.cancel_run("r").await.unwrap(), Some(RunStatus::Running));
            let fenced = StoreError::Fenced { run_id: "r".into(), token: lease.token };
            assert_eq!(store.finish_step("r", lease.token, 0, finished(1), 3).await.unwrap_err(), fenced);
            assert_eq!(store.append_steps("r", lease.token, vec![intent("b")]).await.unwrap_err(), fenced);

            let lease = store.acquire_lease("t", "i/1", Duration::from_secs(60)).await.unwrap();
            store.create_run(record("t"), lease.token).await.unwrap();
            assert_eq!(store.append_steps("t", lease.token, vec![intent("a")]).await.unwrap(), [0]);
            let instance = store.lock_instance("i").await.unwrap().expect("SQLite locks instances");
            assert_eq!(instance.take_back().await.unwrap(), ["t"]);
            let fenced = StoreError::Fenced { run_id: "t".into(), token: lease.token };
            assert_eq!(store.append_steps("t", lease.token, vec![intent("b")]).await.unwrap_err(), fenced);
            assert_eq!(store.steps("t").await.unwrap().len(), 1);
        });
    }

    /// A run the writer has just created appends from ordinal 0 without reading its journal:
    /// created by its lease request, or under a lease taken before.
    #[test]
    fn a_created_runs_first_append_is_ordinal_zero() {
        let store = SqliteStore::in_memory().unwrap();
        futures::executor::block_on(async {
            let (lease, there) =
                store.acquire_lease_and_create_run(record("n"), "me", Duration::from_secs(60)).await.unwrap();
            assert_eq!(there, None);
            assert_eq!(store.append_steps("n", lease.token, vec![intent("a")]).await.unwrap(), [0]);
            let lease = created(&store).await;
            assert_eq!(store.append_finished_with_intents("r", lease.token, response(&["b"])).await.unwrap(), [0, 1]);
            assert_eq!(store.steps("r").await.unwrap().iter().map(|s| s.ordinal).collect::<Vec<_>>(), [0, 1]);
        });
    }

    #[test]
    fn in_memory_store_round_trips() {
        let store = SqliteStore::in_memory().unwrap();
        futures::executor::block_on(async {
            let run = record("r");
            let lease = store.acquire_lease("r", "me", Duration::from_secs(60)).await.unwrap();
            store.create_run(run.clone(), lease.token).await.unwrap();
            assert_eq!(store.get_run("r").await.unwrap(), Some(run));
            let step = NewStep { key: "k".into(), kind: StepKind::Now, name: "now".into(), epoch: 0, started_at_ms: 2 };
            assert_eq!(store.append_steps("r", lease.token, vec![step]).await.unwrap(), [0]);
            assert_eq!(store.steps("r").await.unwrap().len(), 1);
            assert_eq!(store.current_lease("r").await.unwrap(), Some(lease.clone()));
            store.release_lease(&lease).await.unwrap();
            assert_eq!(store.current_lease("r").await.unwrap(), None);
        });
    }
}
