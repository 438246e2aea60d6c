//! The group-commit writer: one thread owns the only write connection, drains every queued
//! write (up to `max_batch`), runs them in one `BEGIN IMMEDIATE … COMMIT`, and replies after
//! the commit returned: an acknowledged write is durable. A duplicate key, a lost
//! compare-and-swap or a fenced write fails that write only: a write of one statement is
//! atomic by itself, a write of several runs in its own `SAVEPOINT`. The WAL is checkpointed
//! by another thread (`checkpoint.rs`), not inside this thread's commits.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc;

use rusqlite::Connection;
use tokio::sync::oneshot;

use super::checkpoint::Checkpointer;
use super::errors::Mapper;
use crate::store::StoreError;

/// How many statements of a write change the database: this decides whether it needs a
/// savepoint of its own to fail alone.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Writes {
    /// At most one statement writes (after any number of reads). SQLite undoes a failed
    /// statement by itself (a constraint failure aborts the statement, not the transaction;
    /// a full disk or an I/O error rolls the whole transaction back, which `commit_batch`
    /// sees), so no savepoint: a savepoint copied every page the write touched first into its
    /// sub-journal, and cost two more statements.
    One,
    /// Several statements write: a savepoint undoes the earlier ones when a later one fails.
    Many,
}

/// A write queued for the writer thread.
pub(super) trait Job: Send {
    /// Whether the write needs a savepoint.
    fn writes(&self) -> Writes;
    /// Runs the write on the writer's connection, inside the batch transaction.
    fn run(&mut self, conn: &Connection) -> Result<(), StoreError>;
    /// Replies once the transaction is settled; `Err` replaces a successful output when the
    /// transaction did not commit.
    fn reply(self: Box<Self>, settled: Result<(), StoreError>);
}

pub(super) struct FnJob<T, F> {
    pub(super) writes: Writes,
    pub(super) f: Option<F>,
    pub(super) out: Option<T>,
    pub(super) reply: oneshot::Sender<Result<T, StoreError>>,
}

impl<T, F> Job for FnJob<T, F>
where
    T: Send,
    F: FnOnce(&Connection) -> Result<T, StoreError> + Send,
{
    fn writes(&self) -> Writes {
        self.writes
    }

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

pub(super) fn writer_loop(
    mut conn: Connection,
    queue: mpsc::Receiver<Box<dyn Job>>,
    max_batch: usize,
    errors: Mapper,
    commits: &AtomicU64,
    checkpointer: Option<Checkpointer>,
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
    if let Some(checkpointer) = checkpointer {
        checkpointer.stop(&mut conn);
    }
    // Closing the connection checkpoints the WAL if it is the last one.
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
            let result = match job.writes() {
                Writes::One => job.run(conn),
                Writes::Many => run_in_savepoint(conn, job.as_mut(), errors),
            };
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
