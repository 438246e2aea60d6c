//! WAL checkpoints on their own thread and connection, so the writer thread only commits.
//!
//! SQLite's automatic checkpoint runs inside the `COMMIT` that grows the WAL past its threshold:
//! on the one writer thread, every write queued behind that commit waited for the checkpoint's
//! page copies and its two `fsync`s (about a tenth of the writer's CPU at 10,000 runs in flight,
//! and more of its wall time). Here the writer's WAL hook only says "the WAL has grown", and a
//! checkpointer thread runs a `PASSIVE` checkpoint on its own connection, which never takes the
//! write lock: commits go on while it copies. Durability is unchanged: the writer's commits
//! still `fsync` the WAL (`synchronous=FULL`), and the checkpoint `fsync`s the WAL before it
//! copies and the database file after (the checkpointer's connection is `synchronous=FULL` too).

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::mpsc::{self, SyncSender};
use std::thread::JoinHandle;

use rusqlite::{Connection, OpenFlags};

use super::errors::Mapper;
use crate::store::StoreError;

/// WAL pages (4 KiB each) not yet copied into the database after which the writer asks for a
/// checkpoint: SQLite's default threshold is 1,000 pages in the WAL; a longer stretch lets a
/// page written by many commits be copied once.
///
/// Counted from the last checkpoint, not from the WAL's start: under steady load a
/// checkpoint rarely catches up before the next commit, so the WAL is not restarted, and a
/// threshold on its whole length asked for a checkpoint after every commit past the first
/// 4,096 pages. Each of those copied a few commits' pages, so a page rewritten by every commit
/// was copied as often: 33,458 page copies for 41,276 frames at 10,000 runs in flight.
pub(super) const CHECKPOINT_PAGES: i32 = 4096;

/// The checkpointer thread and the writer's handle on it.
pub(super) struct Checkpointer {
    nudge: Option<SyncSender<()>>,
    thread: Option<JoinHandle<()>>,
}

impl Checkpointer {
    /// Opens the checkpointer's connection to `path` and starts its thread, and hooks `writer`
    /// (which then no longer checkpoints by itself) to wake it.
    pub(super) fn start(path: &Path, writer: &mut Connection, errors: Mapper) -> Result<Self, StoreError> {
        let flags = OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_NO_MUTEX;
        let conn = Connection::open_with_flags(path, flags).map_err(|e| errors.at_open(path, e))?;
        conn.busy_timeout(errors.busy_timeout).map_err(|e| errors.map(e))?;
        conn.pragma_update(None, "synchronous", "FULL").map_err(|e| errors.map(e))?;
        // One pending nudge is enough: the checkpoint it starts copies everything committed.
        let (nudge, nudges) = mpsc::sync_channel::<()>(1);
        // The WAL pages the last checkpoint had copied, for the writer's hook.
        let copied = Arc::new(AtomicI32::new(0));
        let hook_copied = Arc::clone(&copied);
        let thread = std::thread::Builder::new()
            .name("kuralle-sqlite-checkpoint".into())
            .spawn(move || checkpoint_loop(conn, nudges, &copied))
            .map_err(|e| StoreError::Unavailable(format!("cannot start the checkpoint thread: {e}").into()))?;
        let hook_nudge = nudge.clone();
        // Replaces SQLite's own checkpointing hook (`wal_autocheckpoint`) on this connection.
        writer
            .wal_hook(Some(move |_: &mut rusqlite::hooks::Wal, pages: std::ffi::c_int| {
                // A nudge already pending, or a stopped thread: nothing more to ask.
                if uncopied(pages, hook_copied.load(Ordering::Relaxed)) >= CHECKPOINT_PAGES {
                    let _ = hook_nudge.try_send(());
                }
                Ok(())
            }))
            .map_err(|e| errors.map(e))?;
        Ok(Self { nudge: Some(nudge), thread: Some(thread) })
    }

    /// Unhooks `writer` and waits for the thread to finish its checkpoint, so that the writer's
    /// connection closes last and checkpoints what is left.
    pub(super) fn stop(mut self, writer: &mut Connection) {
        let _ = writer.wal_hook(None::<fn(&mut rusqlite::hooks::Wal, std::ffi::c_int) -> rusqlite::Result<()>>);
        drop(self.nudge.take());
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// The WAL's pages past those the last checkpoint copied. A WAL shorter than that count was
/// restarted from its beginning after a checkpoint copied all of it: all its pages are new.
fn uncopied(pages: std::ffi::c_int, copied: i32) -> i32 {
    if pages >= copied { pages - copied } else { pages }
}

fn checkpoint_loop(conn: Connection, nudges: mpsc::Receiver<()>, copied: &AtomicI32) {
    while nudges.recv().is_ok() {
        // PASSIVE: copies what no reader still needs, without waiting for readers or the writer.
        let result = conn.query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |row| {
            Ok((row.get::<_, i64>(0)?, row.get::<_, i64>(1)?, row.get::<_, i64>(2)?))
        });
        match result {
            Ok((_, wal_pages, done)) => {
                // -1 when the checkpoint could not run (no WAL): the count stays.
                if let Ok(done @ 0..) = i32::try_from(done) {
                    copied.store(done, Ordering::Relaxed);
                }
                tracing::trace!(wal_pages, copied = done, "checkpointed the SQLite WAL");
            }
            // The WAL only grows until the next checkpoint succeeds; no write is affected.
            Err(e) => tracing::warn!(error = %e, "checkpointing the SQLite WAL failed"),
        }
    }
    if let Err((_, e)) = conn.close() {
        tracing::warn!(error = %e, "closing the SQLite checkpoint connection failed");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A checkpoint is asked for by the pages written since the last one copied, so a WAL that
    /// was never restarted does not ask after every commit; a restarted WAL counts from zero.
    #[test]
    fn the_threshold_counts_pages_since_the_last_checkpoint() {
        assert_eq!(uncopied(4096, 0), 4096);
        assert_eq!(uncopied(4200, 4096), 104, "a commit after a checkpoint that caught up");
        assert!(uncopied(8191, 4096) < CHECKPOINT_PAGES);
        assert!(uncopied(8192, 4096) >= CHECKPOINT_PAGES);
        assert_eq!(uncopied(12, 9000), 12, "the WAL restarted from its beginning");
    }
}
