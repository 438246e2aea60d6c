//! WAL checkpoints on their own thread and connection, so the writer thread only commits (but
//! for one, between two batches, when steady load has made the WAL long: see [`WAL_CAP`]).
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
use std::sync::mpsc::{self, RecvTimeoutError, SyncSender};
use std::thread::JoinHandle;
use std::time::Duration;

use rusqlite::{Connection, OpenFlags};

use super::errors::Mapper;
use crate::store::StoreError;

/// WAL frames (a 4 KiB page each) written since the last checkpoint after which the writer
/// asks for one: SQLite's default threshold is 1,000 frames in the WAL; a longer stretch lets a
/// page written by many commits be copied once.
///
/// Counted from the last checkpoint, not from the WAL's start: under steady load a checkpoint
/// rarely catches up before the next commit, so the WAL is not restarted, and a threshold on
/// its whole length asked for a checkpoint after every commit past the first 4,096 frames. Each
/// of those copied a few commits' pages, so a page rewritten by every commit was copied as
/// often: 33,458 page copies for 41,276 frames at 10,000 runs in flight.
pub(super) const CHECKPOINT_PAGES: i32 = 4096;

/// How long after its last nudge the checkpointer copies frames left uncopied anyway. The first
/// frames left uncopied after a checkpoint nudge it, so below the threshold it copies about
/// every 100 ms under load, and what is left 100 ms into a pause. A checkpoint that catches up
/// lets the writer restart the WAL from its beginning at its next transaction; without this,
/// the frames a burst left behind stayed until the next 4,096, and under moderate load (a
/// commit landing during each threshold checkpoint) the WAL never caught up and grew for the
/// life of the store.
const CATCH_UP: Duration = Duration::from_millis(100);

/// WAL frames past which the writer checkpoints the WAL itself: 32,768 (128 MiB). Under steady
/// load the writer is always inside a transaction, so the checkpointer's checkpoints never find
/// the WAL wholly copied at the start of one, the only moment the writer restarts it, and the
/// file grew for as long as the load lasted (a test wrote 107,000 frames, 418 MiB, in five
/// seconds without one restart). Between two batches no transaction of the writer's is open,
/// so a `PASSIVE` checkpoint on its own connection copies everything, and the next batch
/// writes from the WAL's beginning. Past the cap, the checkpointer leaves the copying to the
/// writer while commits keep nudging it (its checkpoint would hold the lock the writer's
/// needs), and copies what is left 100 ms after the last nudge. `PASSIVE` never waits: a
/// reader that began while frames were uncopied only puts the restart off, and the writer tries
/// again an eighth of the cap later. The writer's checkpoint holds every write back while it
/// runs, so from a threshold short of the cap the checkpointer copies after every commit and
/// leaves it only the last few: 3–5 ms once per 128 MiB of WAL in the steady-commits test
/// (94–99 ms when it found the last threshold's 3,972 frames), instead of a file that fills
/// the disk.
const WAL_CAP: i32 = 8 * CHECKPOINT_PAGES;

/// What the writer's hook and the checkpointer share.
#[derive(Debug)]
struct Progress {
    /// Frames in the WAL after the writer's last commit.
    frames: AtomicI32,
    /// Frames the last checkpoint had copied (SQLite counts from the WAL's start).
    copied: AtomicI32,
    /// [`WAL_CAP`], or a test's.
    cap: i32,
}

// Sequentially consistent: the hook and the checkpointer each write one count and read the
// other, and one of them must see the other's write, or a checkpointer that found nothing to
// copy could wait for a nudge that the hook, reading an older count, did not send.
impl Progress {
    fn new(cap: i32) -> Self {
        Self { frames: AtomicI32::new(0), copied: AtomicI32::new(0), cap }
    }

    /// From this many frames on, a threshold short of the cap, every commit wakes the
    /// checkpointer, so that the writer's own checkpoint at the cap, which holds every write
    /// back, finds only the last commits to copy.
    fn near_cap(&self) -> i32 {
        self.cap.saturating_sub(CHECKPOINT_PAGES)
    }

    fn uncopied(&self) -> i32 {
        uncopied(self.frames.load(Ordering::SeqCst), self.copied.load(Ordering::SeqCst))
    }

    /// Records the WAL's length after a commit; whether the checkpointer should wake: at the
    /// threshold, or when frames are left uncopied where there were none, so that it copies
    /// them 100 ms later (a nudge below the threshold only starts its wait).
    fn committed(&self, frames: i32) -> bool {
        let before = self.frames.swap(frames, Ordering::SeqCst);
        let copied = self.copied.load(Ordering::SeqCst);
        if frames <= before {
            // A commit writes at least one frame (SQLite calls the hook only then), so a WAL no
            // longer than before restarted from its beginning: none of it is copied. Unless a
            // checkpoint of the new WAL has counted meanwhile.
            let _ = self.copied.compare_exchange(copied, 0, Ordering::SeqCst, Ordering::SeqCst);
            return true;
        }
        let now = uncopied(frames, copied);
        now >= CHECKPOINT_PAGES || (now > 0 && uncopied(before, copied) == 0) || frames >= self.near_cap()
    }

    fn copied(&self, done: i64) {
        // -1 when the checkpoint could not run (no WAL, or another checkpoint running): the
        // count stays.
        if let Ok(done @ 0..) = i32::try_from(done) {
            self.copied.store(done, Ordering::SeqCst);
        }
    }
}

/// The checkpointer thread and the writer's handle on it.
pub(super) struct Checkpointer {
    nudge: Option<SyncSender<()>>,
    thread: Option<JoinHandle<()>>,
    progress: Arc<Progress>,
    /// The WAL's length when the writer last checkpointed it (0 before it ever did): a reader
    /// that keeps the WAL from restarting would otherwise have the writer copy and `fsync`
    /// after every batch, so it tries again only an eighth of the cap later.
    tried_at: AtomicI32,
}

impl Checkpointer {
    /// Opens the checkpointer's connection to `path` and starts its thread, and hooks `writer`
    /// (which then no longer checkpoints by itself) to wake it.
    pub(super) fn start(path: &Path, writer: &mut Connection, errors: Mapper) -> Result<Self, StoreError> {
        Self::start_capped(path, writer, errors, WAL_CAP)
    }

    /// [`start`](Self::start), with the writer checkpointing past `cap` frames.
    pub(super) fn start_capped(
        path: &Path,
        writer: &mut Connection,
        errors: Mapper,
        cap: i32,
    ) -> Result<Self, StoreError> {
        let flags = OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_NO_MUTEX;
        let conn = Connection::open_with_flags(path, flags).map_err(|e| errors.at_open(path, e))?;
        conn.busy_timeout(errors.busy_timeout).map_err(|e| errors.map(e))?;
        conn.pragma_update(None, "synchronous", "FULL").map_err(|e| errors.map(e))?;
        // One pending nudge is enough: the checkpoint it starts copies everything committed.
        let (nudge, nudges) = mpsc::sync_channel::<()>(1);
        let progress = Arc::new(Progress::new(cap));
        let thread = {
            let progress = Arc::clone(&progress);
            std::thread::Builder::new()
                .name("kuralle-checkpt".into())
                .spawn(move || checkpoint_loop(conn, nudges, &progress))
                .map_err(|e| StoreError::Unavailable(format!("cannot start the checkpoint thread: {e}").into()))?
        };
        let (hook_nudge, hook_progress) = (nudge.clone(), Arc::clone(&progress));
        // Replaces SQLite's own checkpointing hook (`wal_autocheckpoint`) on this connection.
        writer
            .wal_hook(Some(move |_: &mut rusqlite::hooks::Wal, frames: std::ffi::c_int| {
                // A nudge already pending, or a stopped thread: nothing more to ask.
                if hook_progress.committed(frames) {
                    let _ = hook_nudge.try_send(());
                }
                Ok(())
            }))
            .map_err(|e| errors.map(e))?;
        Ok(Self { nudge: Some(nudge), thread: Some(thread), progress, tried_at: AtomicI32::new(0) })
    }

    /// Copies the whole WAL once it is longer than the cap, so that it restarts (see
    /// [`WAL_CAP`]). Called by the writer thread between batches, with its own connection.
    pub(super) fn catch_up_if_long(&self, writer: &Connection) {
        let (frames, cap) = (self.progress.frames.load(Ordering::SeqCst), self.progress.cap);
        if frames < cap {
            // Only a restart brings the WAL back under the cap: the last try is done with.
            self.tried_at.store(0, Ordering::Relaxed);
            return;
        }
        let tried_at = self.tried_at.load(Ordering::Relaxed);
        if tried_at != 0 && (tried_at..tried_at.saturating_add(cap / 8)).contains(&frames) {
            return;
        }
        self.tried_at.store(frames, Ordering::Relaxed);
        match checkpoint(writer) {
            Ok((busy, _, copied)) => {
                if busy != 0 {
                    // The checkpointer was copying, and it stops past the cap: try again after
                    // the next batch. (A reader only keeps a try from restarting the WAL.)
                    self.tried_at.store(0, Ordering::Relaxed);
                }
                self.progress.copied(copied);
                tracing::debug!(frames, busy, copied, "checkpointed the long SQLite WAL");
            }
            Err(e) => tracing::warn!(error = %e, frames, "checkpointing the long SQLite WAL failed"),
        }
    }

    /// Frames in the WAL after the writer's last commit: small again once the WAL restarted.
    #[cfg(test)]
    fn wal_frames(&self) -> i32 {
        self.progress.frames.load(Ordering::SeqCst)
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

/// The WAL's frames past those the last checkpoint copied. A WAL shorter than that count was
/// restarted from its beginning after a checkpoint copied all of it: all its frames are new.
fn uncopied(frames: std::ffi::c_int, copied: i32) -> i32 {
    if frames >= copied { frames - copied } else { frames }
}

/// A `PASSIVE` checkpoint: copies what no reader still needs, without waiting for readers or
/// the writer. Returns whether another checkpoint held the lock (1 or 0), the WAL's frames and
/// the frames copied (-1 each when it could not run).
fn checkpoint(conn: &Connection) -> rusqlite::Result<(i64, i64, i64)> {
    conn.query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |row| Ok((row.get(0)?, row.get(1)?, row.get(2)?)))
}

fn checkpoint_loop(conn: Connection, nudges: mpsc::Receiver<()>, progress: &Progress) {
    // A failing checkpoint is retried every 100 ms: one warning until one succeeds.
    let mut failing = false;
    loop {
        let woken = if progress.uncopied() > 0 {
            nudges.recv_timeout(CATCH_UP)
        } else {
            nudges.recv().map_err(|_| RecvTimeoutError::Disconnected)
        };
        let frames = progress.frames.load(Ordering::SeqCst);
        match woken {
            // Past the cap the writer checkpoints between its batches, so that the WAL restarts;
            // a checkpoint here would hold the lock its checkpoint needs.
            Ok(()) if frames >= progress.cap => continue,
            // Near the cap every commit is copied at once: see `Progress::near_cap`.
            Ok(()) if frames >= progress.near_cap() => {}
            // Below the threshold: the first frames since the WAL was all copied (copy them
            // 100 ms on), or a nudge queued while the last checkpoint ran, which copied them.
            Ok(()) if progress.uncopied() < CHECKPOINT_PAGES => continue,
            Ok(()) => {}
            // 100 ms since the last nudge, frames left: copy them, so the WAL can restart.
            Err(RecvTimeoutError::Timeout) => {}
            Err(RecvTimeoutError::Disconnected) => break,
        }
        match checkpoint(&conn) {
            Ok((_, wal_frames, done)) => {
                progress.copied(done);
                if std::mem::take(&mut failing) {
                    tracing::info!(wal_frames, copied = done, "checkpointing the SQLite WAL works again");
                }
                tracing::trace!(wal_frames, copied = done, "checkpointed the SQLite WAL");
            }
            // The WAL only grows until the next checkpoint succeeds; no write is affected.
            Err(e) if !std::mem::replace(&mut failing, true) => {
                tracing::warn!(error = %e, "checkpointing the SQLite WAL failed")
            }
            Err(e) => tracing::debug!(error = %e, "checkpointing the SQLite WAL failed again"),
        }
    }
    if let Err((_, e)) = conn.close() {
        tracing::warn!(error = %e, "closing the SQLite checkpoint connection failed");
    }
}

/// A test's directory, removed when the test ends, passed or failed.
#[cfg(test)]
pub(super) struct TestDir(pub(super) std::path::PathBuf);

#[cfg(test)]
impl Drop for TestDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Inserts `pages` rows of a page each (4,000 bytes) into `t` of [`wal_database`].
#[cfg(test)]
pub(super) fn insert_pages(conn: &Connection, pages: usize) -> rusqlite::Result<()> {
    for _ in 0..pages {
        conn.execute("INSERT INTO t (x) VALUES (zeroblob(4000))", [])?;
    }
    Ok(())
}

/// A fresh WAL database `db` with a table `t (x BLOB)`, in directory `name` of the temporary
/// directory (cleared first: a run killed with the same process id may have left it).
#[cfg(test)]
pub(super) fn wal_database(name: &str) -> (TestDir, Connection) {
    let dir = std::env::temp_dir().join(format!("kuralle-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let conn = Connection::open(dir.join("db")).unwrap();
    conn.busy_timeout(Duration::from_secs(5)).unwrap();
    let mode: String = conn.query_row("PRAGMA journal_mode = WAL", [], |row| row.get(0)).unwrap();
    assert_eq!(mode, "wal");
    conn.execute_batch("CREATE TABLE t (x BLOB)").unwrap();
    (TestDir(dir), conn)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `pages` rows of a page each in one transaction.
    fn commit_pages(conn: &Connection, pages: usize) {
        let tx = conn.unchecked_transaction().unwrap();
        insert_pages(&tx, pages).unwrap();
        tx.commit().unwrap();
    }

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

    /// The hook wakes the checkpointer at the threshold, and when a commit leaves frames
    /// uncopied where there were none (so that a pause copies them), not at every commit.
    #[test]
    fn a_commit_wakes_the_checkpointer_at_the_threshold_or_the_first_uncopied_frames() {
        let progress = Progress::new(WAL_CAP);
        assert!(progress.committed(10), "the first frames");
        assert!(!progress.committed(20), "frames were already waiting");
        progress.copied(20);
        assert!(progress.committed(30), "the first frames since the last checkpoint");
        assert!(!progress.committed(4000));
        assert!(progress.committed(20 + CHECKPOINT_PAGES), "the threshold");
        assert!(progress.committed(20 + CHECKPOINT_PAGES + 50), "still past it");
        progress.copied(i64::from(20 + CHECKPOINT_PAGES + 50));
        progress.copied(-1);
        assert_eq!(progress.uncopied(), 0, "a checkpoint that could not run leaves the count");
        assert!(progress.committed(5), "the WAL restarted: its frames are new");
        assert_eq!(progress.uncopied(), 5);
        progress.copied(5);
        assert!(progress.committed(5), "restarted again, to the length the last checkpoint copied");
        assert_eq!(progress.uncopied(), 5);

        let near = WAL_CAP - CHECKPOINT_PAGES;
        let progress = Progress::new(WAL_CAP);
        assert!(progress.committed(near - 10));
        progress.copied(i64::from(near - 10));
        assert!(progress.committed(near - 5));
        assert!(!progress.committed(near - 1));
        assert!(progress.committed(near), "a threshold short of the cap, every commit");
        assert!(progress.committed(near + 1));
    }

    /// A burst past the threshold leaves frames behind the checkpoint it asked for; a pause
    /// copies them, so the next commit restarts the WAL from its beginning instead of growing it.
    #[test]
    fn a_pause_after_a_burst_lets_the_wal_restart() {
        let (dir, mut writer) = wal_database("checkpoint-burst");
        let errors = Mapper { busy_timeout: Duration::from_secs(5), max_size_bytes: None };
        let checkpointer = Checkpointer::start(&dir.0.join("db"), &mut writer, errors).unwrap();

        // About 50 frames a commit (a row of a page each), well past the threshold.
        while checkpointer.wal_frames() < CHECKPOINT_PAGES + 1500 {
            commit_pages(&writer, 50);
        }

        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while checkpointer.progress.uncopied() > 0 {
            assert!(std::time::Instant::now() < deadline, "the pause's frames were never copied");
            std::thread::sleep(Duration::from_millis(10));
        }
        commit_pages(&writer, 1);
        assert!(checkpointer.wal_frames() < 50, "the WAL restarted: {} frames", checkpointer.wal_frames());

        checkpointer.stop(&mut writer);
        drop(writer);
    }

    /// Commits that never pause leave a `PASSIVE` checkpoint no moment to catch up; past the cap
    /// the writer's own checkpoint between two commits makes the WAL start over anyway.
    #[test]
    fn steady_commits_restart_the_wal_past_the_cap() {
        let (dir, mut writer) = wal_database("checkpoint-cap");
        let errors = Mapper { busy_timeout: Duration::from_secs(5), max_size_bytes: None };
        let cap = 3 * CHECKPOINT_PAGES;
        let checkpointer = Checkpointer::start_capped(&dir.0.join("db"), &mut writer, errors, cap).unwrap();

        let (mut longest, mut restarted) = (0, false);
        for _ in 0..2_000 {
            commit_pages(&writer, 50);
            checkpointer.catch_up_if_long(&writer);
            let frames = checkpointer.wal_frames();
            if frames < longest && longest >= cap {
                restarted = true;
                break;
            }
            longest = longest.max(frames);
        }
        assert!(restarted, "the WAL grew to {longest} frames and never restarted");

        checkpointer.stop(&mut writer);
        drop(writer);
    }
}
