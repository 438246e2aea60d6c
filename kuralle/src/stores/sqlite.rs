//! `SqliteStore`: the embedded durable store.
//!
//! Layout:
//! - One **writer thread** owns the only write connection. Writes arrive over a channel, each
//!   with a `oneshot` reply. The thread drains every queued write (up to
//!   [`SqliteOptions::max_batch`]), runs them in one `BEGIN IMMEDIATE … COMMIT`, each in its own
//!   `SAVEPOINT` (so a duplicate key or a lost compare-and-swap fails that write only), and
//!   replies after the commit returned: an acknowledged write is durable (`synchronous=FULL`).
//! - Reads use a small pool of read-only connections on `spawn_blocking` (WAL readers never
//!   wait for the writer).

use std::future::Future;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError, mpsc};
use std::thread::JoinHandle;
use std::time::Duration;

use rusqlite::{Connection, ErrorCode, OpenFlags, OptionalExtension, params};
use serde_json::Value;
use tokio::sync::oneshot;

use super::{DEFAULT_MAX_VALUE_BYTES, check_text_size, check_value_size};
use crate::store::{
    NewStep, RunFilter, RunRecord, RunStatus, RunStore, RunSummary, StepKind, StepOutcome, StepRecord, StepStatus,
    StoreError, StoreFuture,
};

/// The kuralle schema version this build reads and writes (kept in table `kuralle_schema`).
const SCHEMA_VERSION: i64 = 1;

const SCHEMA: &str = "
CREATE TABLE kuralle_schema (
    id INTEGER PRIMARY KEY CHECK (id = 1),
    version INTEGER NOT NULL
);
CREATE TABLE runs (
    run_id TEXT PRIMARY KEY NOT NULL,
    agent_id TEXT NOT NULL,
    status TEXT NOT NULL,
    epoch INTEGER NOT NULL,
    version INTEGER NOT NULL,
    next_ordinal INTEGER NOT NULL DEFAULT 0,
    state TEXT NOT NULL,
    created_at INTEGER NOT NULL,
    updated_at INTEGER NOT NULL
);
CREATE INDEX runs_by_updated ON runs (updated_at DESC, run_id);
CREATE INDEX runs_by_status_updated ON runs (status, updated_at DESC, run_id);
CREATE TABLE steps (
    run_id TEXT NOT NULL REFERENCES runs (run_id) ON DELETE CASCADE,
    ordinal INTEGER NOT NULL,
    key TEXT NOT NULL,
    kind TEXT NOT NULL,
    name TEXT NOT NULL,
    epoch INTEGER NOT NULL,
    status TEXT NOT NULL,
    result TEXT,
    error TEXT,
    started_at INTEGER NOT NULL,
    finished_at INTEGER,
    PRIMARY KEY (run_id, ordinal),
    UNIQUE (run_id, key)
);
";

/// Settings of a [`SqliteStore`]; start from [`Default`] and override fields.
///
/// ```
/// use std::time::Duration;
/// use kuralle::stores::SqliteOptions;
///
/// let options = SqliteOptions { busy_timeout: Duration::from_millis(500), ..SqliteOptions::default() };
/// assert_eq!(options.max_batch, 256);
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SqliteOptions {
    /// How long a write waits for a lock held by another process or connection before it fails
    /// with a retryable [`StoreError::Unavailable`]. Default 5 s.
    pub busy_timeout: Duration,
    /// The most writes committed together in one transaction (group commit). Default 256.
    pub max_batch: usize,
    /// The largest accepted JSON value (run state, step result or error), in bytes of JSON
    /// text. Default [`DEFAULT_MAX_VALUE_BYTES`](super::DEFAULT_MAX_VALUE_BYTES).
    pub max_value_bytes: usize,
    /// Caps the database size in pages (`PRAGMA max_page_count`) on the write connection; a
    /// write that needs more fails with a retryable [`StoreError::Unavailable`], as on a full
    /// disk. Default `None` (SQLite's own limit).
    pub max_page_count: Option<u64>,
    /// Idle read connections kept open. Default 4.
    pub read_connections: usize,
}

impl Default for SqliteOptions {
    fn default() -> Self {
        Self {
            busy_timeout: Duration::from_secs(5),
            max_batch: 256,
            max_value_bytes: DEFAULT_MAX_VALUE_BYTES,
            max_page_count: None,
            read_connections: 4,
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
/// Errors are typed: a lock held too long by another process, a read-only file or a full disk
/// give a retryable [`StoreError::Unavailable`]; a file that is not a SQLite database gives
/// [`StoreError::Corrupt`].
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
/// let run = RunRecord {
///     run_id: "run-1".into(),
///     agent_id: "support".into(),
///     status: RunStatus::Running,
///     epoch: 0,
///     version: 0,
///     state: serde_json::json!({"turn": 1}),
///     created_at_ms: 1,
///     updated_at_ms: 1,
/// };
/// store.create_run(run).await?;
/// let step = NewStep { key: "k1".into(), kind: StepKind::Tool, name: "echo".into(), epoch: 0, started_at_ms: 2 };
/// let ordinals = store.append_steps("run-1", vec![step]).await?;
/// store.finish_step("run-1", ordinals[0], StepOutcome::Finished(serde_json::json!("hi")), 3).await?;
/// drop(store);
///
/// // Everything acknowledged is there after reopening.
/// let store = SqliteStore::open(&path)?;
/// let steps = store.steps("run-1").await?;
/// assert_eq!(steps[0].status, StepStatus::Finished);
/// assert_eq!(steps[0].result, Some(serde_json::json!("hi")));
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
    /// if it cannot be opened or initialized right now (permissions, locks, disk full).
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
        let errors = Mapper { busy_timeout: options.busy_timeout };
        let flags = OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_CREATE | OpenFlags::SQLITE_OPEN_NO_MUTEX;
        let conn = Connection::open_with_flags(&path, flags).map_err(|e| errors.at_open(&path, e))?;
        configure_writer(&conn, &options, errors, Some(&path))?;
        let readers =
            ReaderPool { path: path.clone(), idle: Mutex::new(Vec::new()), max_idle: options.read_connections, errors };
        // Fail now, not at the first read, if the file cannot be read.
        readers.with(|_| Ok(()))?;
        Ok(Self::start(conn, Some(path), options, errors, Some(readers)))
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
        let errors = Mapper { busy_timeout: options.busy_timeout };
        let conn = Connection::open_in_memory().map_err(|e| errors.map(e))?;
        configure_writer(&conn, &options, errors, None)?;
        Ok(Self::start(conn, None, options, errors, None))
    }

    fn start(
        conn: Connection,
        path: Option<PathBuf>,
        options: SqliteOptions,
        errors: Mapper,
        readers: Option<ReaderPool>,
    ) -> Self {
        let (writes, queue) = mpsc::channel::<Box<dyn Job>>();
        let commits = Arc::new(AtomicU64::new(0));
        let writer = {
            let commits = commits.clone();
            let max_batch = options.max_batch.max(1);
            std::thread::Builder::new()
                .name("kuralle-sqlite-writer".into())
                .spawn(move || writer_loop(conn, queue, max_batch, errors, &commits))
        };
        // Without a writer thread every write fails with `Unavailable`.
        let writer = writer.ok();
        let writes = writer.as_ref().map(|_| writes);
        Self { inner: Arc::new(Inner { path, options, errors, writes, writer, readers, commits }) }
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

    /// Queues a write for the writer thread; resolves after its transaction committed.
    fn write<T, F>(&self, f: F) -> impl Future<Output = Result<T, StoreError>> + Send + 'static
    where
        T: Send + 'static,
        F: FnOnce(&Connection) -> Result<T, StoreError> + Send + 'static,
    {
        let inner = self.inner.clone();
        async move {
            let (reply, result) = oneshot::channel();
            let job: Box<dyn Job> = Box::new(FnJob { f: Some(f), out: None, reply });
            let stopped = || StoreError::Unavailable("the SQLite writer thread is not running".into());
            inner.writes.as_ref().ok_or_else(stopped)?.send(job).map_err(|_| stopped())?;
            // Drop our handle before waiting: if this is the last one, the writer may stop.
            drop(inner);
            result.await.map_err(|_| stopped())?
        }
    }

    /// Runs a read on a pooled read connection, off the async threads when in a Tokio runtime.
    fn read<T, F>(&self, f: F) -> StoreFuture<'_, T>
    where
        T: Send + 'static,
        F: FnOnce(&Connection) -> Result<T, StoreError> + Send + 'static,
    {
        if self.inner.readers.is_none() {
            return Box::pin(self.write(f));
        }
        let inner = self.inner.clone();
        Box::pin(async move {
            let run = move || match &inner.readers {
                Some(readers) => readers.with(f),
                None => Err(StoreError::Unavailable("no read connections".into())),
            };
            match tokio::runtime::Handle::try_current() {
                Ok(handle) => handle
                    .spawn_blocking(run)
                    .await
                    .map_err(|e| StoreError::Unavailable(format!("read task failed: {e}")))?,
                Err(_) => run(),
            }
        })
    }
}

impl RunStore for SqliteStore {
    fn create_run(&self, run: RunRecord) -> StoreFuture<'_, ()> {
        let prepared = prepare_run(&run, self.inner.options.max_value_bytes);
        let errors = self.inner.errors;
        Box::pin(async move {
            let (epoch, version, state) = prepared?;
            self.write(move |conn| {
                let inserted = conn
                    .prepare_cached(
                        "INSERT INTO runs (run_id, agent_id, status, epoch, version, next_ordinal, state, created_at, updated_at)
                         VALUES (?1, ?2, ?3, ?4, ?5, 0, ?6, ?7, ?8) ON CONFLICT (run_id) DO NOTHING",
                    )
                    .and_then(|mut stmt| {
                        stmt.execute(params![
                            run.run_id,
                            run.agent_id,
                            run.status.as_str(),
                            epoch,
                            version,
                            state,
                            run.created_at_ms,
                            run.updated_at_ms
                        ])
                    })
                    .map_err(|e| errors.map(e))?;
                if inserted == 0 {
                    return Err(StoreError::RunExists(run.run_id));
                }
                Ok(())
            })
            .await
        })
    }

    fn get_run<'a>(&'a self, run_id: &'a str) -> StoreFuture<'a, Option<RunRecord>> {
        let run_id = run_id.to_owned();
        let errors = self.inner.errors;
        self.read(move |conn| {
            conn.prepare_cached(
                "SELECT run_id, agent_id, status, epoch, version, state, created_at, updated_at
                 FROM runs WHERE run_id = ?1",
            )
            .and_then(|mut stmt| {
                stmt.query_row([&run_id], |row| {
                    Ok((
                        row.get::<_, String>(0)?,
                        row.get::<_, String>(1)?,
                        row.get::<_, String>(2)?,
                        row.get::<_, i64>(3)?,
                        row.get::<_, i64>(4)?,
                        row.get::<_, String>(5)?,
                        row.get::<_, i64>(6)?,
                        row.get::<_, i64>(7)?,
                    ))
                })
                .optional()
            })
            .map_err(|e| errors.map(e))?
            .map(|(run_id, agent_id, status, epoch, version, state, created_at_ms, updated_at_ms)| {
                Ok(RunRecord {
                    status: parse_run_status(&status)?,
                    epoch: to_u64("runs.epoch", epoch)?,
                    version: to_u64("runs.version", version)?,
                    state: parse_json("runs.state", &state)?,
                    run_id,
                    agent_id,
                    created_at_ms,
                    updated_at_ms,
                })
            })
            .transpose()
        })
    }

    fn put_run(&self, run: RunRecord) -> StoreFuture<'_, u64> {
        let prepared = prepare_run(&run, self.inner.options.max_value_bytes);
        let errors = self.inner.errors;
        Box::pin(async move {
            let (epoch, version, state) = prepared?;
            let next = version
                .checked_add(1)
                .ok_or_else(|| StoreError::LimitExceeded(format!("run `{}` version overflow", run.run_id)))?;
            self.write(move |conn| {
                let updated = conn
                    .prepare_cached(
                        "UPDATE runs SET agent_id = ?1, status = ?2, epoch = ?3, version = ?4, state = ?5, updated_at = ?6
                         WHERE run_id = ?7 AND version = ?8",
                    )
                    .and_then(|mut stmt| {
                        stmt.execute(params![
                            run.agent_id,
                            run.status.as_str(),
                            epoch,
                            next,
                            state,
                            run.updated_at_ms,
                            run.run_id,
                            version
                        ])
                    })
                    .map_err(|e| errors.map(e))?;
                if updated == 1 {
                    return to_u64("runs.version", next);
                }
                match stored_version(conn, &run.run_id, errors)? {
                    None => Err(StoreError::RunNotFound(run.run_id)),
                    Some(actual) => Err(StoreError::VersionConflict { run_id: run.run_id, expected: run.version, actual }),
                }
            })
            .await
        })
    }

    fn list_runs(&self, filter: RunFilter) -> StoreFuture<'_, Vec<RunSummary>> {
        let errors = self.inner.errors;
        let limit = filter.limit.map_or(-1, |limit| i64::try_from(limit).unwrap_or(i64::MAX));
        self.read(move |conn| {
            let map_row = |row: &rusqlite::Row<'_>| {
                Ok((
                    row.get::<_, String>(0)?,
                    row.get::<_, String>(1)?,
                    row.get::<_, String>(2)?,
                    row.get::<_, i64>(3)?,
                ))
            };
            let rows = match filter.status {
                Some(status) => conn
                    .prepare_cached(
                        "SELECT run_id, agent_id, status, updated_at FROM runs WHERE status = ?1
                         ORDER BY updated_at DESC, run_id ASC LIMIT ?2",
                    )
                    .and_then(|mut stmt| stmt.query_map(params![status.as_str(), limit], map_row)?.collect()),
                None => conn
                    .prepare_cached(
                        "SELECT run_id, agent_id, status, updated_at FROM runs
                         ORDER BY updated_at DESC, run_id ASC LIMIT ?1",
                    )
                    .and_then(|mut stmt| stmt.query_map(params![limit], map_row)?.collect()),
            };
            let rows: Vec<(String, String, String, i64)> = rows.map_err(|e| errors.map(e))?;
            rows.into_iter()
                .map(|(run_id, agent_id, status, updated_at_ms)| {
                    Ok(RunSummary { run_id, agent_id, status: parse_run_status(&status)?, updated_at_ms })
                })
                .collect()
        })
    }

    fn delete_run<'a>(&'a self, run_id: &'a str) -> StoreFuture<'a, bool> {
        let run_id = run_id.to_owned();
        let errors = self.inner.errors;
        Box::pin(self.write(move |conn| {
            let deleted = conn
                .prepare_cached("DELETE FROM steps WHERE run_id = ?1")
                .and_then(|mut stmt| stmt.execute([&run_id]))
                .and_then(|_| conn.prepare_cached("DELETE FROM runs WHERE run_id = ?1"))
                .and_then(|mut stmt| stmt.execute([&run_id]))
                .map_err(|e| errors.map(e))?;
            Ok(deleted > 0)
        }))
    }

    fn append_steps<'a>(&'a self, run_id: &'a str, steps: Vec<NewStep>) -> StoreFuture<'a, Vec<u64>> {
        let run_id = run_id.to_owned();
        let errors = self.inner.errors;
        Box::pin(async move {
            let epochs = steps.iter().map(|step| to_i64("step epoch", step.epoch)).collect::<Result<Vec<_>, _>>()?;
            self.write(move |conn| append(conn, errors, &run_id, steps, &epochs)).await
        })
    }

    fn finish_step<'a>(
        &'a self,
        run_id: &'a str,
        ordinal: u64,
        outcome: StepOutcome,
        finished_at_ms: i64,
    ) -> StoreFuture<'a, ()> {
        let run_id = run_id.to_owned();
        let errors = self.inner.errors;
        let max = self.inner.options.max_value_bytes;
        Box::pin(async move {
            let (status, result, error) = match &outcome {
                StepOutcome::Finished(value) => {
                    let text = to_json("step result", value, max)?;
                    (StepStatus::Finished, Some(text), None)
                }
                StepOutcome::Failed(value) => {
                    let text = to_json("step error", value, max)?;
                    (StepStatus::Failed, None, Some(text))
                }
            };
            // An ordinal beyond SQLite's integers names no step.
            let stored_ordinal = i64::try_from(ordinal).unwrap_or(-1);
            self.write(move |conn| {
                let updated = conn
                    .prepare_cached(
                        "UPDATE steps SET status = ?1, result = ?2, error = ?3, finished_at = ?4
                         WHERE run_id = ?5 AND ordinal = ?6 AND status = 'running'",
                    )
                    .and_then(|mut stmt| {
                        stmt.execute(params![status.as_str(), result, error, finished_at_ms, run_id, stored_ordinal])
                    })
                    .map_err(|e| errors.map(e))?;
                if updated == 1 {
                    return Ok(());
                }
                match stored_version(conn, &run_id, errors)? {
                    None => Err(StoreError::RunNotFound(run_id)),
                    Some(_) => Err(StoreError::StepNotRunning { run_id, ordinal }),
                }
            })
            .await
        })
    }

    fn steps<'a>(&'a self, run_id: &'a str) -> StoreFuture<'a, Vec<StepRecord>> {
        let run_id = run_id.to_owned();
        let errors = self.inner.errors;
        self.read(move |conn| {
            let mut stmt = conn
                .prepare_cached(
                    "SELECT ordinal, key, kind, name, epoch, status, result, error, started_at, finished_at
                     FROM steps WHERE run_id = ?1 ORDER BY ordinal",
                )
                .map_err(|e| errors.map(e))?;
            let rows = stmt
                .query_map([&run_id], |row| {
                    Ok(RawStep {
                        ordinal: row.get(0)?,
                        key: row.get(1)?,
                        kind: row.get(2)?,
                        name: row.get(3)?,
                        epoch: row.get(4)?,
                        status: row.get(5)?,
                        result: row.get(6)?,
                        error: row.get(7)?,
                        started_at_ms: row.get(8)?,
                        finished_at_ms: row.get(9)?,
                    })
                })
                .map_err(|e| errors.map(e))?;
            let mut steps = Vec::new();
            for row in rows {
                steps.push(row.map_err(|e| errors.map(e))?.into_record()?);
            }
            Ok(steps)
        })
    }
}

/// Reserves the next ordinals and inserts the intents; runs inside the writer's savepoint, so
/// a failure leaves neither the ordinals nor any row behind.
fn append(
    conn: &Connection,
    errors: Mapper,
    run_id: &str,
    steps: Vec<NewStep>,
    epochs: &[i64],
) -> Result<Vec<u64>, StoreError> {
    let count = i64::try_from(steps.len()).map_err(|_| StoreError::LimitExceeded("too many steps".into()))?;
    let first: Option<i64> = conn
        .prepare_cached(
            "UPDATE runs SET next_ordinal = next_ordinal + ?1 WHERE run_id = ?2 RETURNING next_ordinal - ?1",
        )
        .and_then(|mut stmt| stmt.query_row(params![count, run_id], |row| row.get(0)).optional())
        .map_err(|e| errors.map(e))?;
    let Some(first) = first else {
        return Err(StoreError::RunNotFound(run_id.to_owned()));
    };
    let mut insert = conn
        .prepare_cached(
            "INSERT INTO steps (run_id, ordinal, key, kind, name, epoch, status, started_at)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, 'running', ?7)",
        )
        .map_err(|e| errors.map(e))?;
    let mut ordinals = Vec::with_capacity(steps.len());
    for ((ordinal, step), epoch) in (first..).zip(steps).zip(epochs) {
        let inserted = insert.execute(params![
            run_id,
            ordinal,
            step.key,
            step.kind.as_str(),
            step.name,
            epoch,
            step.started_at_ms
        ]);
        match inserted {
            Ok(_) => ordinals.push(to_u64("runs.next_ordinal", ordinal)?),
            Err(rusqlite::Error::SqliteFailure(e, _)) if e.extended_code == rusqlite::ffi::SQLITE_CONSTRAINT_UNIQUE => {
                return Err(StoreError::DuplicateKey { run_id: run_id.to_owned(), key: step.key });
            }
            Err(rusqlite::Error::SqliteFailure(e, _))
                if e.extended_code == rusqlite::ffi::SQLITE_CONSTRAINT_PRIMARYKEY =>
            {
                return Err(StoreError::Corrupt(format!(
                    "run `{run_id}`: ordinal {ordinal} is already taken although runs.next_ordinal points at it"
                )));
            }
            Err(e) => return Err(errors.map(e)),
        }
    }
    Ok(ordinals)
}

fn stored_version(conn: &Connection, run_id: &str, errors: Mapper) -> Result<Option<u64>, StoreError> {
    let version: Option<i64> = conn
        .prepare_cached("SELECT version FROM runs WHERE run_id = ?1")
        .and_then(|mut stmt| stmt.query_row([run_id], |row| row.get(0)).optional())
        .map_err(|e| errors.map(e))?;
    version.map(|v| to_u64("runs.version", v)).transpose()
}

struct RawStep {
    ordinal: i64,
    key: String,
    kind: String,
    name: String,
    epoch: i64,
    status: String,
    result: Option<String>,
    error: Option<String>,
    started_at_ms: i64,
    finished_at_ms: Option<i64>,
}

impl RawStep {
    fn into_record(self) -> Result<StepRecord, StoreError> {
        Ok(StepRecord {
            ordinal: to_u64("steps.ordinal", self.ordinal)?,
            kind: StepKind::parse(&self.kind)
                .ok_or_else(|| StoreError::Corrupt(format!("unknown step kind `{}`", self.kind)))?,
            status: StepStatus::parse(&self.status)
                .ok_or_else(|| StoreError::Corrupt(format!("unknown step status `{}`", self.status)))?,
            epoch: to_u64("steps.epoch", self.epoch)?,
            result: self.result.as_deref().map(|text| parse_json("steps.result", text)).transpose()?,
            error: self.error.as_deref().map(|text| parse_json("steps.error", text)).transpose()?,
            key: self.key,
            name: self.name,
            started_at_ms: self.started_at_ms,
            finished_at_ms: self.finished_at_ms,
        })
    }
}

/// Converts what a run row needs before it is queued: `(epoch, version, state JSON)`.
fn prepare_run(run: &RunRecord, max_value_bytes: usize) -> Result<(i64, i64, String), StoreError> {
    Ok((
        to_i64("run epoch", run.epoch)?,
        to_i64("run version", run.version)?,
        to_json("run state", &run.state, max_value_bytes)?,
    ))
}

fn to_json(what: &str, value: &Value, max: usize) -> Result<String, StoreError> {
    check_value_size(what, value, max)?;
    let text = serde_json::to_string(value)
        .map_err(|e| StoreError::LimitExceeded(format!("{what} cannot be serialized: {e}")))?;
    check_text_size(what, &text, max)?;
    Ok(text)
}

fn parse_json(column: &str, text: &str) -> Result<Value, StoreError> {
    serde_json::from_str(text).map_err(|e| StoreError::Corrupt(format!("{column} holds invalid JSON: {e}")))
}

fn parse_run_status(text: &str) -> Result<RunStatus, StoreError> {
    RunStatus::parse(text).ok_or_else(|| StoreError::Corrupt(format!("unknown run status `{text}`")))
}

fn to_i64(what: &str, value: u64) -> Result<i64, StoreError> {
    i64::try_from(value).map_err(|_| StoreError::LimitExceeded(format!("{what} {value} exceeds {}", i64::MAX)))
}

fn to_u64(column: &str, value: i64) -> Result<u64, StoreError> {
    u64::try_from(value).map_err(|_| StoreError::Corrupt(format!("{column} holds a negative value {value}")))
}

/// Maps SQLite errors to typed store errors.
#[derive(Debug, Clone, Copy)]
struct Mapper {
    busy_timeout: Duration,
}

impl Mapper {
    fn map(self, error: rusqlite::Error) -> StoreError {
        let rusqlite::Error::SqliteFailure(failure, message) = &error else {
            return StoreError::Corrupt(format!("unexpected data in the store: {error}"));
        };
        let detail = message.clone().unwrap_or_else(|| failure.to_string());
        match failure.code {
            ErrorCode::DatabaseBusy | ErrorCode::DatabaseLocked => StoreError::Unavailable(format!(
                "database is locked by another process or connection; gave up after busy_timeout ({} ms): {detail}",
                self.busy_timeout.as_millis()
            )),
            ErrorCode::ReadOnly => StoreError::Unavailable(format!("database is read-only: {detail}")),
            ErrorCode::DiskFull => StoreError::Unavailable(format!("database or disk is full: {detail}")),
            ErrorCode::SystemIoFailure => StoreError::Unavailable(format!("disk I/O error: {detail}")),
            ErrorCode::CannotOpen => StoreError::Unavailable(format!("cannot open the database file: {detail}")),
            ErrorCode::PermissionDenied => StoreError::Unavailable(format!("permission denied: {detail}")),
            ErrorCode::OutOfMemory => StoreError::Unavailable(format!("out of memory: {detail}")),
            ErrorCode::FileLockingProtocolFailed => StoreError::Unavailable(format!("file locking failed: {detail}")),
            ErrorCode::NotADatabase => StoreError::Corrupt(format!("the file is not a SQLite database: {detail}")),
            ErrorCode::DatabaseCorrupt => StoreError::Corrupt(format!("the database file is malformed: {detail}")),
            ErrorCode::TooBig => StoreError::LimitExceeded(format!("value too large for SQLite: {detail}")),
            _ => StoreError::Corrupt(format!("unexpected SQLite error (is the kuralle schema intact?): {detail}")),
        }
    }

    fn at_open(self, path: &Path, error: rusqlite::Error) -> StoreError {
        match self.map(error) {
            StoreError::Corrupt(message) => StoreError::Corrupt(format!("{}: {message}", path.display())),
            StoreError::Unavailable(message) => StoreError::Unavailable(format!("{}: {message}", path.display())),
            other => other,
        }
    }
}

/// Sets the pragmas of the write connection and checks or creates the schema.
fn configure_writer(
    conn: &Connection,
    options: &SqliteOptions,
    errors: Mapper,
    path: Option<&Path>,
) -> Result<(), StoreError> {
    let fail = |e: rusqlite::Error| match path {
        Some(path) => errors.at_open(path, e),
        None => errors.map(e),
    };
    conn.busy_timeout(options.busy_timeout).map_err(fail)?;
    // Reading the header first turns "not a database" into a clear error before any pragma.
    let tables: Vec<String> = conn
        .prepare("SELECT name FROM sqlite_master WHERE type = 'table' AND name IN ('kuralle_schema', 'runs', 'steps')")
        .and_then(|mut stmt| stmt.query_map([], |row| row.get(0))?.collect())
        .map_err(fail)?;
    if path.is_some() {
        let mode: String = conn.query_row("PRAGMA journal_mode = WAL", [], |row| row.get(0)).map_err(fail)?;
        if !mode.eq_ignore_ascii_case("wal") {
            return Err(StoreError::Unavailable(format!(
                "could not switch the database to WAL mode (mode is `{mode}`)"
            )));
        }
    }
    conn.pragma_update(None, "synchronous", "FULL").map_err(fail)?;
    conn.pragma_update(None, "foreign_keys", "ON").map_err(fail)?;
    if tables.iter().any(|table| table == "kuralle_schema") {
        check_schema_version(conn, fail)?;
    } else {
        create_schema(conn, fail)?;
    }
    if let Some(pages) = options.max_page_count {
        let pages = i64::try_from(pages).unwrap_or(i64::MAX);
        conn.query_row(&format!("PRAGMA max_page_count = {pages}"), [], |_| Ok(())).map_err(fail)?;
    }
    Ok(())
}

fn check_schema_version(conn: &Connection, fail: impl Fn(rusqlite::Error) -> StoreError) -> Result<(), StoreError> {
    let version: Option<i64> = conn
        .query_row("SELECT version FROM kuralle_schema WHERE id = 1", [], |row| row.get(0))
        .optional()
        .map_err(fail)?;
    match version {
        Some(SCHEMA_VERSION) => Ok(()),
        Some(version) if version > SCHEMA_VERSION => Err(StoreError::Corrupt(format!(
            "the database has kuralle schema version {version}, newer than the version {SCHEMA_VERSION} this \
             kuralle supports; upgrade kuralle to open it"
        ))),
        Some(version) => Err(StoreError::Corrupt(format!(
            "the database has kuralle schema version {version}, which this kuralle cannot migrate \
             (it supports version {SCHEMA_VERSION})"
        ))),
        None => Err(StoreError::Corrupt("table `kuralle_schema` exists but holds no version".into())),
    }
}

fn create_schema(conn: &Connection, fail: impl Fn(rusqlite::Error) -> StoreError + Copy) -> Result<(), StoreError> {
    conn.execute_batch("BEGIN IMMEDIATE").map_err(fail)?;
    let created = (|| {
        // Another process may have created it between our check and our lock.
        let tables: Vec<String> = conn
            .prepare(
                "SELECT name FROM sqlite_master WHERE type = 'table' AND name IN ('kuralle_schema', 'runs', 'steps')",
            )
            .and_then(|mut stmt| stmt.query_map([], |row| row.get(0))?.collect())
            .map_err(fail)?;
        if tables.iter().any(|table| table == "kuralle_schema") {
            return check_schema_version(conn, fail);
        }
        if let Some(table) = tables.first() {
            return Err(StoreError::Corrupt(format!(
                "the database has a table `{table}` that is not kuralle's (no `kuralle_schema` table); \
                 use another file for the kuralle store"
            )));
        }
        conn.execute_batch(SCHEMA).map_err(fail)?;
        conn.execute("INSERT INTO kuralle_schema (id, version) VALUES (1, ?1)", [SCHEMA_VERSION]).map_err(fail)?;
        Ok(())
    })();
    match created {
        Ok(()) => conn.execute_batch("COMMIT").map_err(fail),
        Err(e) => {
            let _ = conn.execute_batch("ROLLBACK");
            Err(e)
        }
    }
}

/// Idle read-only connections.
struct ReaderPool {
    path: PathBuf,
    idle: Mutex<Vec<Connection>>,
    max_idle: usize,
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
        Ok(conn)
    }
}

/// A write queued for the writer thread.
trait Job: Send {
    /// Runs the write on the writer's connection, inside the batch transaction.
    fn run(&mut self, conn: &Connection) -> Result<(), StoreError>;
    /// Replies once the transaction is settled; `Err` replaces a successful output when the
    /// transaction did not commit.
    fn reply(self: Box<Self>, settled: Result<(), StoreError>);
}

struct FnJob<T, F> {
    f: Option<F>,
    out: Option<T>,
    reply: oneshot::Sender<Result<T, StoreError>>,
}

impl<T, F> Job for FnJob<T, F>
where
    T: Send,
    F: FnOnce(&Connection) -> Result<T, StoreError> + Send,
{
    fn run(&mut self, conn: &Connection) -> Result<(), StoreError> {
        let f = self.f.take().ok_or_else(|| StoreError::Unavailable("write ran twice".into()))?;
        self.out = Some(f(conn)?);
        Ok(())
    }

    fn reply(self: Box<Self>, settled: Result<(), StoreError>) {
        let result = match (settled, self.out) {
            (Ok(()), Some(out)) => Ok(out),
            (Ok(()), None) => Err(StoreError::Unavailable("write produced no result".into())),
            (Err(e), _) => Err(e),
        };
        // The caller may have stopped waiting; the write stands either way.
        let _ = self.reply.send(result);
    }
}

fn writer_loop(
    conn: Connection,
    queue: mpsc::Receiver<Box<dyn Job>>,
    max_batch: usize,
    errors: Mapper,
    commits: &AtomicU64,
) {
    let mut batch = Vec::with_capacity(max_batch);
    while let Ok(first) = queue.recv() {
        batch.push(first);
        while batch.len() < max_batch {
            match queue.try_recv() {
                Ok(job) => batch.push(job),
                Err(_) => break,
            }
        }
        commit_batch(&conn, &mut batch, errors, commits);
    }
    // Dropping the connection checkpoints the WAL if it is the last one.
    if let Err((_, e)) = conn.close() {
        tracing::warn!(error = %e, "closing the SQLite write connection failed");
    }
}

/// Runs `batch` in as few transactions as possible (one, unless SQLite aborts a transaction)
/// and replies to every job after its transaction settled.
fn commit_batch(conn: &Connection, batch: &mut Vec<Box<dyn Job>>, errors: Mapper, commits: &AtomicU64) {
    let mut jobs = batch.drain(..);
    let mut next = jobs.next();
    while next.is_some() {
        if let Err(e) = exec(conn, "BEGIN IMMEDIATE") {
            let e = errors.map(e);
            for job in next.into_iter().chain(jobs.by_ref()) {
                job.reply(Err(e.clone()));
            }
            return;
        }
        let mut done: Vec<(Box<dyn Job>, Result<(), StoreError>)> = Vec::new();
        let mut aborted = None;
        while let Some(mut job) = next.take() {
            let result = run_in_savepoint(conn, job.as_mut(), errors);
            // SQLite rolls back the whole transaction on some errors (full disk, I/O error).
            if let Err(e) = &result
                && conn.is_autocommit()
            {
                aborted = Some(e.clone());
            }
            done.push((job, result));
            if aborted.is_some() {
                next = jobs.next();
                break;
            }
            next = jobs.next();
        }
        let failed = match aborted {
            Some(e) => Some(e),
            None => match exec(conn, "COMMIT") {
                Ok(()) => {
                    commits.fetch_add(1, Ordering::Relaxed);
                    None
                }
                Err(e) => {
                    if !conn.is_autocommit() {
                        let _ = conn.execute_batch("ROLLBACK");
                    }
                    Some(errors.map(e))
                }
            },
        };
        for (job, result) in done {
            let settled = match (&failed, result) {
                (Some(e), Ok(())) => Err(e.clone()),
                (_, result) => result,
            };
            job.reply(settled);
        }
    }
}

fn run_in_savepoint(conn: &Connection, job: &mut dyn Job, errors: Mapper) -> Result<(), StoreError> {
    exec(conn, "SAVEPOINT op").map_err(|e| errors.map(e))?;
    let result = job.run(conn).and_then(|()| exec(conn, "RELEASE op").map_err(|e| errors.map(e)));
    if result.is_err() && !conn.is_autocommit() {
        let _ = exec(conn, "ROLLBACK TO op");
        let _ = exec(conn, "RELEASE op");
    }
    result
}

fn exec(conn: &Connection, sql: &str) -> rusqlite::Result<()> {
    conn.prepare_cached(sql)?.execute([]).map(|_| ())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn failure(code: i32) -> rusqlite::Error {
        rusqlite::Error::SqliteFailure(rusqlite::ffi::Error::new(code), None)
    }

    #[test]
    fn sqlite_errors_map_to_typed_store_errors() {
        let errors = Mapper { busy_timeout: Duration::from_millis(300) };
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
        assert!(matches!(errors.map(failure(rusqlite::ffi::SQLITE_NOTADB)), StoreError::Corrupt(_)));
        assert!(matches!(errors.map(failure(rusqlite::ffi::SQLITE_CORRUPT)), StoreError::Corrupt(_)));
        assert!(matches!(errors.map(failure(rusqlite::ffi::SQLITE_TOOBIG)), StoreError::LimitExceeded(_)));
    }

    #[test]
    fn in_memory_store_round_trips() {
        let store = SqliteStore::in_memory().unwrap();
        futures::executor::block_on(async {
            let run = RunRecord {
                run_id: "r".into(),
                agent_id: "a".into(),
                status: RunStatus::Running,
                epoch: 0,
                version: 0,
                state: serde_json::json!({"x": 1}),
                created_at_ms: 1,
                updated_at_ms: 1,
            };
            store.create_run(run.clone()).await.unwrap();
            assert_eq!(store.get_run("r").await.unwrap(), Some(run));
            let step = NewStep { key: "k".into(), kind: StepKind::Now, name: "now".into(), epoch: 0, started_at_ms: 2 };
            assert_eq!(store.append_steps("r", vec![step]).await.unwrap(), [0]);
            assert_eq!(store.steps("r").await.unwrap().len(), 1);
        });
    }
}
