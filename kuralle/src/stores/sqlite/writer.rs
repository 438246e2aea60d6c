//! The group-commit writer: one thread owns the only write connection, drains every queued
//! write (up to `max_batch`), runs them in one `BEGIN IMMEDIATE … COMMIT`, and replies after
//! the commit returned: an acknowledged write is durable. A duplicate key, a lost
//! compare-and-swap or a fenced write fails that write only: the hot writes find every
//! refusal before they change a row (see [`Writes`]), the others run in their own
//! `SAVEPOINT`. The WAL is checkpointed by another thread (`checkpoint.rs`), not inside this
//! thread's commits.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc;

use rusqlite::Connection;
use tokio::sync::oneshot;

use super::checkpoint::Checkpointer;
use super::errors::Mapper;
use super::known::Known;
use super::prepared::Db;
use crate::store::StoreError;

/// How a write fails alone in the batch's shared transaction.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Writes {
    /// The write refuses (fenced, a duplicate key, a lost compare-and-swap…) only before it
    /// changed a row: by reads, or by a statement that changes nothing. It needs no savepoint:
    /// SQLite undoes a failed statement by itself (a constraint failure aborts the statement,
    /// not the transaction; a full disk or an I/O error rolls the whole transaction back). A
    /// savepoint copied every page the write touched into its sub-journal (a 1 KiB `malloc`
    /// per chunk) and cost two statements: a fifth of the writer's time.
    ///
    /// Should such a write still fail after it changed rows (SQLite failing between two of
    /// its statements), `commit_batch` rolls the whole transaction back: the batch's other
    /// writes fail too, retryably, and none of it is half-written.
    Direct,
    /// The write may fail after it changed rows: its own savepoint undoes them. For the rare
    /// writes (deleting, cancelling, renewing many leases), where the cost does not matter.
    InSavepoint,
}

/// A write queued for the writer thread.
pub(super) trait Job: Send {
    /// Whether the write needs a savepoint.
    fn writes(&self) -> Writes;
    /// Runs the write on the writer's connection, inside the batch transaction.
    fn run(&mut self, conn: &Db<'_>) -> Result<(), StoreError>;
    /// Replies once the transaction is settled; `Err` replaces a successful output when the
    /// transaction did not commit.
    fn reply(self: Box<Self>, settled: Result<(), StoreError>);
}

/// A write: its data, the SQL to run over it, and where the job goes once settled.
///
/// The writer thread only borrows `data`, and `f` may capture only `Copy` values, so the
/// writer frees nothing of the caller's: the settled job travels back whole, and the caller's
/// thread frees it. Freed on the writer thread, every write's strings and vectors went to
/// glibc's arena of the thread that allocated them, under that arena's lock, which the Tokio
/// thread allocating beside it often held (about a sixth of the writer's time at 10,000 runs
/// in flight).
pub(super) struct FnJob<T, D, F> {
    pub(super) writes: Writes,
    pub(super) data: D,
    pub(super) f: F,
    /// The write's output, then its settled result.
    pub(super) out: Option<Result<T, StoreError>>,
    pub(super) reply: Option<oneshot::Sender<Box<FnJob<T, D, F>>>>,
}

impl<T, D, F> FnJob<T, D, F> {
    /// The settled result, once the job came back from the writer.
    pub(super) fn settled(self) -> Result<T, StoreError> {
        self.out.unwrap_or_else(|| Err(StoreError::Unavailable("write produced no result".into())))
    }
}

impl<T, D, F> Job for FnJob<T, D, F>
where
    T: Send,
    D: Send,
    F: Fn(&Db<'_>, &D) -> Result<T, StoreError> + Copy + Send,
{
    fn writes(&self) -> Writes {
        self.writes
    }

    fn run(&mut self, conn: &Db<'_>) -> Result<(), StoreError> {
        self.out = Some(Ok((self.f)(conn, &self.data)?));
        Ok(())
    }

    fn reply(mut self: Box<Self>, settled: Result<(), StoreError>) {
        // A transaction that did not commit replaces the output (`settled` tells a job that
        // never produced one).
        if let Err(e) = settled {
            self.out = Some(Err(e));
        }
        if let Some(reply) = self.reply.take() {
            // The caller may have stopped waiting; the write stands either way.
            let _ = reply.send(self);
        }
    }
}

pub(super) fn writer_loop(
    mut conn: Connection,
    queue: mpsc::Receiver<Box<dyn Job>>,
    max_batch: usize,
    errors: Mapper,
    commits: &AtomicU64,
    checkpointer: Option<Checkpointer>,
    kept: &'static [&'static str],
) {
    {
        let db = Db::keeping(&conn, kept);
        let mut batch = Vec::with_capacity(max_batch);
        while let Ok(first) = queue.recv() {
            batch.push(first);
            while batch.len() < max_batch {
                match queue.try_recv() {
                    Ok(job) => batch.push(job),
                    Err(_) => break,
                }
            }
            commit_batch(&db, &mut batch, errors, commits);
            if let Some(checkpointer) = &checkpointer {
                checkpointer.catch_up_if_long(&conn);
            }
        }
        // The kept statements are finalized here, before the connection closes.
    }
    if let Some(checkpointer) = checkpointer {
        checkpointer.stop(&mut conn);
    }
    // Closing the connection checkpoints the WAL if it is the last one.
    if let Err((_, e)) = conn.close() {
        tracing::warn!(error = %e, "closing the SQLite write connection failed");
    }
}

/// Opens a batch's transaction, taking the write lock at once.
pub(super) const BEGIN: &str = "BEGIN IMMEDIATE";
/// Changes when another connection committed since this one last read it (and on a few other
/// occasions, such as another connection's truncating checkpoint, which only cost a re-read;
/// `known.rs`).
pub(super) const DATA_VERSION: &str = "PRAGMA data_version";
/// Ends a batch's transaction; the writer replies to its writes after it returns.
pub(super) const COMMIT: &str = "COMMIT";

/// Runs `batch` in as few transactions as possible (one, unless SQLite aborts a transaction)
/// and replies to every job after its transaction settled.
fn commit_batch(conn: &Db<'_>, batch: &mut Vec<Box<dyn Job>>, errors: Mapper, commits: &AtomicU64) {
    let mut jobs = batch.drain(..);
    let mut next = jobs.next();
    while next.is_some() {
        if let Err(e) = exec(conn, BEGIN) {
            let e = errors.map(e);
            for job in next.into_iter().chain(jobs.by_ref()) {
                job.reply(Err(e.clone()));
            }
            return;
        }
        if let Some(known) = conn.known() {
            // Read holding the write lock: no other connection can commit until this batch has.
            let version = conn.prepared(DATA_VERSION).and_then(|mut stmt| stmt.query_row([], |row| row.get(0)));
            known.begin(version.ok());
        }
        let mut done: Vec<(Box<dyn Job>, Result<(), StoreError>)> = Vec::new();
        let mut aborted = None;
        while let Some(mut job) = next.take() {
            let writes = job.writes();
            let changes = conn.total_changes();
            let result = match writes {
                Writes::Direct => job.run(conn),
                Writes::InSavepoint => run_in_savepoint(conn, job.as_mut(), errors),
            };
            if let Err(e) = &result {
                if conn.is_autocommit() {
                    // SQLite rolled back the whole transaction (full disk, I/O error).
                    aborted = Some(e.clone());
                } else if writes == Writes::Direct && conn.total_changes() != changes {
                    // Half a write, which only the whole transaction can undo.
                    let _ = exec(conn, "ROLLBACK");
                    aborted = Some(StoreError::Unavailable(
                        format!("the write transaction was rolled back: another write in it failed halfway: {e}")
                            .into(),
                    ));
                }
            }
            done.push((job, result));
            if aborted.is_some() {
                next = jobs.next();
                break;
            }
            next = jobs.next();
        }
        if aborted.is_some() {
            forget_all(conn);
        }
        let failed = match aborted {
            Some(e) => Some(e),
            None => match exec(conn, COMMIT) {
                Ok(()) => {
                    commits.fetch_add(1, Ordering::Relaxed);
                    None
                }
                Err(e) => {
                    if !conn.is_autocommit() {
                        let _ = conn.execute_batch("ROLLBACK");
                    }
                    forget_all(conn);
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

fn run_in_savepoint(conn: &Db<'_>, job: &mut dyn Job, errors: Mapper) -> Result<(), StoreError> {
    exec(conn, "SAVEPOINT op").map_err(|e| errors.map(e))?;
    let result = job.run(conn).and_then(|()| exec(conn, "RELEASE op").map_err(|e| errors.map(e)));
    if result.is_err() {
        if !conn.is_autocommit() {
            let _ = exec(conn, "ROLLBACK TO op");
            let _ = exec(conn, "RELEASE op");
        }
        forget_all(conn);
    }
    result
}

/// What the writer learned in a transaction or savepoint that was rolled back may be undone.
fn forget_all(conn: &Db<'_>) {
    conn.learn(Known::forget_all);
}

fn exec(conn: &Db<'_>, sql: &str) -> rusqlite::Result<()> {
    conn.prepared(sql)?.execute([]).map(|_| ())
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::super::checkpoint::{Checkpointer, insert_pages, wal_database};
    use super::*;

    type Sql = fn(&Connection) -> Result<(), StoreError>;
    type Reply = oneshot::Receiver<Box<FnJob<(), Sql, fn(&Db<'_>, &Sql) -> Result<(), StoreError>>>>;

    fn job(writes: Writes, sql: Sql) -> (Box<dyn Job>, Reply) {
        let (reply, receiver) = oneshot::channel();
        let f: fn(&Db<'_>, &Sql) -> Result<(), StoreError> = |conn, sql| sql(conn);
        (Box::new(FnJob { writes, data: sql, f, out: None, reply: Some(reply) }), receiver)
    }

    fn insert(conn: &Connection, n: i64) -> Result<(), StoreError> {
        let errors = Mapper { busy_timeout: Duration::from_secs(1), max_size_bytes: None };
        conn.execute("INSERT INTO t (n) VALUES (?1)", [n]).map(|_| ()).map_err(|e| errors.map(e))
    }

    fn outcome(mut reply: Reply) -> Result<(), StoreError> {
        reply.try_recv().expect("replied").settled()
    }

    /// A write without a savepoint that is refused before it changed a row fails alone; one
    /// that fails after it changed rows takes the batch's transaction down with it (nothing
    /// half-written commits) and the writes after it commit in a new one; a write in a
    /// savepoint fails alone wherever it fails.
    #[test]
    fn a_direct_write_failing_halfway_rolls_the_transaction_back() {
        let conn = Connection::open_in_memory().unwrap();
        conn.execute_batch("CREATE TABLE t (n INTEGER PRIMARY KEY)").unwrap();
        let errors = Mapper { busy_timeout: Duration::from_secs(1), max_size_bytes: None };
        let commits = AtomicU64::new(0);
        let (first, first_reply) = job(Writes::Direct, |conn| insert(conn, 1));
        let (refused, refused_reply) = job(Writes::Direct, |conn| insert(conn, 1));
        let (half, half_reply) = job(Writes::Direct, |conn| {
            insert(conn, 2)?;
            insert(conn, 1)
        });
        let (after, after_reply) = job(Writes::Direct, |conn| insert(conn, 3));
        let (saved, saved_reply) = job(Writes::InSavepoint, |conn| {
            insert(conn, 4)?;
            insert(conn, 3)
        });
        let (last, last_reply) = job(Writes::Direct, |conn| insert(conn, 5));
        let db = Db::keeping(&conn, &[BEGIN, COMMIT]);
        commit_batch(&db, &mut vec![first, refused, half, after, saved, last], errors, &commits);

        let rolled_back = outcome(first_reply).unwrap_err();
        assert!(matches!(&rolled_back, StoreError::Unavailable(m) if m.contains("halfway")), "{rolled_back:?}");
        assert!(rolled_back.is_retryable());
        assert!(matches!(outcome(refused_reply), Err(StoreError::Corrupt(_))), "a constraint failure of its own");
        assert!(matches!(outcome(half_reply), Err(StoreError::Corrupt(_))));
        outcome(after_reply).unwrap();
        assert!(matches!(outcome(saved_reply), Err(StoreError::Corrupt(_))));
        outcome(last_reply).unwrap();
        assert_eq!(commits.load(Ordering::Relaxed), 1);
        assert!(conn.is_autocommit());
        assert_eq!(super::super::column::<i64>(&conn, "SELECT n FROM t ORDER BY n"), [3, 5]);
    }

    type Append = fn(&Db<'_>) -> Result<Vec<u64>, StoreError>;
    type AppendReply =
        oneshot::Receiver<Box<FnJob<Vec<u64>, Append, fn(&Db<'_>, &Append) -> Result<Vec<u64>, StoreError>>>>;

    /// A job given the writer's connection itself, with what it knows of the runs.
    fn known_job(writes: Writes, append: Append) -> (Box<dyn Job>, AppendReply) {
        let (reply, receiver) = oneshot::channel();
        let f: fn(&Db<'_>, &Append) -> Result<Vec<u64>, StoreError> = |conn, append| append(conn);
        (Box::new(FnJob { writes, data: append, f, out: None, reply: Some(reply) }), receiver)
    }

    /// An append to run `r` under its lease, token 1.
    fn append_to_r(conn: &Db<'_>) -> Result<Vec<u64>, StoreError> {
        let errors = Mapper { busy_timeout: Duration::from_secs(1), max_size_bytes: None };
        let step = crate::store::NewStep {
            key: format!("k{}", conn.total_changes()),
            kind: crate::store::StepKind::Tool,
            name: "t".into(),
            epoch: 0,
            started_at_ms: 0,
        };
        super::super::steps::append(conn, errors, "r", 1, &[step])
    }

    /// A transaction or savepoint rolled back takes what the writer learned in it along: an
    /// append whose insert was undone must not leave its ordinal known as taken, or the next
    /// append would leave a gap in the journal. Three ways to be undone: another write of the
    /// batch failing halfway, the write's own savepoint, and a commit that failed (a deferred
    /// foreign key, checked only at `COMMIT`).
    #[test]
    fn a_rolled_back_write_forgets_what_the_writer_learned_in_it() {
        let conn = Connection::open_in_memory().unwrap();
        let errors = Mapper { busy_timeout: Duration::from_secs(1), max_size_bytes: None };
        super::super::schema::configure_writer(&conn, &super::super::SqliteOptions::default(), errors, None).unwrap();
        conn.execute_batch(
            "INSERT INTO runs (run_id, agent_id, status, epoch, version, state, created_at, updated_at)
             VALUES ('r', 'a', 'running', 0, 0, '{}', 0, 0);
             INSERT INTO leases (run_id, owner, token, expires_at, released) VALUES ('r', 'me', 1, 0, 0);
             CREATE TABLE parent (id INTEGER PRIMARY KEY);
             CREATE TABLE child (p INTEGER REFERENCES parent (id) DEFERRABLE INITIALLY DEFERRED);
             PRAGMA foreign_keys = ON;",
        )
        .unwrap();
        let commits = AtomicU64::new(0);
        let db = Db::keeping(&conn, &[BEGIN, DATA_VERSION, COMMIT]);
        let settle = |jobs: Vec<(Box<dyn Job>, AppendReply)>| -> Vec<Result<Vec<u64>, StoreError>> {
            let (mut jobs, replies): (Vec<_>, Vec<_>) = jobs.into_iter().unzip();
            commit_batch(&db, &mut jobs, errors, &commits);
            replies.into_iter().map(|reply| reply.blocking_recv().unwrap().settled()).collect()
        };

        let undone = settle(vec![
            known_job(Writes::Direct, append_to_r),
            known_job(Writes::Direct, |conn| {
                append_to_r(conn)?;
                Err(StoreError::Unavailable("failed after its insert".into()))
            }),
        ]);
        assert!(undone.iter().all(Result::is_err), "rolled back with the batch: {undone:?}");
        assert_eq!(settle(vec![known_job(Writes::Direct, append_to_r)]).remove(0).unwrap(), [0]);

        let undone = settle(vec![known_job(Writes::InSavepoint, |conn| {
            append_to_r(conn)?;
            Err(StoreError::Unavailable("failed after its insert".into()))
        })]);
        assert!(undone[0].is_err());
        assert_eq!(settle(vec![known_job(Writes::Direct, append_to_r)]).remove(0).unwrap(), [1]);

        let undone = settle(vec![known_job(Writes::Direct, |conn| {
            let ordinals = append_to_r(conn)?;
            conn.execute("INSERT INTO child (p) VALUES (7)", []).unwrap();
            Ok(ordinals)
        })]);
        assert!(undone[0].is_err(), "the commit failed");
        assert_eq!(settle(vec![known_job(Writes::Direct, append_to_r)]).remove(0).unwrap(), [2]);
        assert_eq!(super::super::column::<i64>(&conn, "SELECT ordinal FROM steps"), [0, 1, 2]);
    }

    /// Writes queued faster than they commit keep the writer inside a transaction, so only its
    /// own checkpoint between two batches lets the WAL restart: the file stays near the cap
    /// instead of growing with everything written.
    #[test]
    fn a_writer_that_never_pauses_keeps_the_wal_near_its_cap() {
        let (dir, mut conn) = wal_database("writer-wal");
        let errors = Mapper { busy_timeout: Duration::from_secs(5), max_size_bytes: None };
        let cap = 1_000;
        let checkpointer = Checkpointer::start_capped(&dir.0.join("db"), &mut conn, errors, cap).unwrap();

        // 200 writes of 50 pages each, one a transaction: 10,000 frames, ten times the cap.
        let (queue, jobs) = mpsc::channel();
        let mut replies = Vec::new();
        for _ in 0..200 {
            let (write, reply) = job(Writes::Direct, |conn| {
                insert_pages(conn, 50)
                    .map_err(|e| Mapper { busy_timeout: Duration::from_secs(1), max_size_bytes: None }.map(e))
            });
            queue.send(write).unwrap();
            replies.push(reply);
        }
        let commits = std::sync::Arc::new(AtomicU64::new(0));
        let writer = {
            let commits = std::sync::Arc::clone(&commits);
            std::thread::spawn(move || writer_loop(conn, jobs, 1, errors, &commits, Some(checkpointer), &[]))
        };
        for reply in replies {
            reply.blocking_recv().expect("replied").settled().unwrap();
        }
        let wal = std::fs::metadata(dir.0.join("db-wal")).unwrap().len();
        drop(queue);
        writer.join().unwrap();
        assert_eq!(commits.load(Ordering::Relaxed), 200);
        // Frames of 4 KiB and a 24-byte header: the cap, one transaction past it, and room for
        // the frames written while tries found the checkpointer busy. Without the writer's own
        // checkpoint the WAL holds all 10,000.
        assert!(wal < 6 * 1_000 * 4_120, "the WAL grew to {wal} bytes for 10,000 frames written");
    }
}
