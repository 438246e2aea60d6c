//! WAL checkpoints on their own thread and connection, so the writer thread only commits.
//!
//! SQLite's automatic checkpoint runs inside the `COMMIT` that grows the WAL past its threshold:
//! on the one writer thread, every write queued behind that commit waited for the checkpoint's
//! page copies and its two `fsync`s (about a tenth of the writer's CPU at 10,000 runs in flight,
//! and more of its wall time). Here the writer's WAL hook only says "the WAL is long", and a
//! checkpointer thread runs a `PASSIVE` checkpoint on its own connection, which never takes the
//! write lock: commits go on while it copies. Durability is unchanged: the writer's commits
//! still `fsync` the WAL (`synchronous=FULL`), and the checkpoint `fsync`s the WAL before it
//! copies and the database file after (the checkpointer's connection is `synchronous=FULL` too).

use std::path::Path;
use std::sync::mpsc::{self, SyncSender};
use std::thread::JoinHandle;

use rusqlite::{Connection, OpenFlags};

use super::errors::Mapper;
use crate::store::StoreError;

/// WAL pages (4 KiB each) after which the writer asks for a checkpoint: SQLite's default
/// threshold is 1,000; a longer WAL lets a page written by many commits be copied once.
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
        let thread = std::thread::Builder::new()
            .name("kuralle-sqlite-checkpoint".into())
            .spawn(move || checkpoint_loop(conn, nudges))
            .map_err(|e| StoreError::Unavailable(format!("cannot start the checkpoint thread: {e}").into()))?;
        let hook_nudge = nudge.clone();
        // Replaces SQLite's own checkpointing hook (`wal_autocheckpoint`) on this connection.
        writer
            .wal_hook(Some(move |_: &mut rusqlite::hooks::Wal, pages: std::ffi::c_int| {
                // A nudge already pending, or a stopped thread: nothing more to ask.
                if pages >= CHECKPOINT_PAGES {
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

fn checkpoint_loop(conn: Connection, nudges: mpsc::Receiver<()>) {
    while nudges.recv().is_ok() {
        // PASSIVE: copies what no reader still needs, without waiting for readers or the writer.
        let result = conn.query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |row| {
            Ok((row.get::<_, i64>(0)?, row.get::<_, i64>(1)?, row.get::<_, i64>(2)?))
        });
        match result {
            Ok((_, wal_pages, copied)) => tracing::trace!(wal_pages, copied, "checkpointed the SQLite WAL"),
            // The WAL only grows until the next checkpoint succeeds; no write is affected.
            Err(e) => tracing::warn!(error = %e, "checkpointing the SQLite WAL failed"),
        }
    }
    if let Err((_, e)) = conn.close() {
        tracing::warn!(error = %e, "closing the SQLite checkpoint connection failed");
    }
}
