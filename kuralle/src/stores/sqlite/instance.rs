//! Proof of life for an instance id: an OS file lock held beside the database file for the
//! life of the process (the kernel drops it when the process dies, even on SIGKILL), or, for
//! an in-memory database, the store's in-process registry.

use std::fs::{File, OpenOptions, TryLockError};
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

use super::writer::Writes;
use super::{SqliteStore, leases};
use crate::store::{InstanceLock, Registered, StoreError, StoreFuture, owner_prefix};

/// The lock file of instance `id` beside the database at `db`:
/// `<db file>.instance-<lowercase hex of the id's UTF-8 bytes>.lock`.
pub(super) fn lock_path(db: &Path, id: &str) -> PathBuf {
    use std::fmt::Write as _;
    let mut name = db.as_os_str().to_owned();
    let mut hex = String::with_capacity(id.len() * 2);
    for byte in id.as_bytes() {
        let _ = write!(hex, "{byte:02x}");
    }
    name.push(format!(".instance-{hex}.lock"));
    PathBuf::from(name)
}

/// What keeps the proof: the locked file, or the registry entry.
#[derive(Debug)]
enum Proof {
    /// Kept open (and locked) for as long as the lock lives; never deleted (deleting a lock
    /// file races with the next process that opens it).
    File(#[allow(dead_code)] File),
    Registered(#[allow(dead_code)] Registered),
}

/// A [`SqliteStore`]'s proof of an instance id.
#[derive(Debug)]
pub(super) struct SqliteInstance {
    store: SqliteStore,
    id: String,
    prefix: String,
    _proof: Proof,
}

impl SqliteStore {
    pub(super) fn lock_instance_now(&self, id: &str) -> Result<SqliteInstance, StoreError> {
        let proof = match &self.inner.path {
            Some(db) => Proof::File(lock_file(&lock_path(db, id), id)?),
            None => Proof::Registered(self.inner.instances.claim(id).ok_or_else(|| StoreError::InstanceInUse {
                instance_id: id.to_owned(),
                holder: "another runtime of this process holds it on this in-memory database".to_owned(),
            })?),
        };
        Ok(SqliteInstance { store: self.clone(), id: id.to_owned(), prefix: owner_prefix(id), _proof: proof })
    }
}

/// Opens and locks `path` (exclusively, without waiting); writes this process's id in it for
/// operators. Held by another open file (another process, or another runtime of this one):
/// [`StoreError::InstanceInUse`] naming the process id written there.
fn lock_file(path: &Path, id: &str) -> Result<File, StoreError> {
    let unavailable =
        |e: std::io::Error| StoreError::Unavailable(format!("cannot lock `{}`: {e}", path.display()).into());
    let mut file =
        OpenOptions::new().read(true).write(true).create(true).truncate(false).open(path).map_err(unavailable)?;
    match file.try_lock() {
        Ok(()) => {}
        Err(TryLockError::WouldBlock) => {
            let mut pid = String::new();
            let _ = file.read_to_string(&mut pid);
            let pid = pid.trim();
            let who = if pid.is_empty() { "another process".to_owned() } else { format!("process {pid}") };
            return Err(StoreError::InstanceInUse {
                instance_id: id.to_owned(),
                holder: format!("{who} holds the lock file `{}`", path.display()),
            });
        }
        Err(TryLockError::Error(e)) => return Err(unavailable(e)),
    }
    // Only informational: the lock is the proof, not the text.
    let _ = file.set_len(0).and_then(|()| file.seek(SeekFrom::Start(0))).and_then(|_| {
        writeln!(file, "{}", std::process::id())?;
        file.sync_data()
    });
    Ok(file)
}

impl InstanceLock for SqliteInstance {
    fn instance_id(&self) -> &str {
        &self.id
    }

    fn take_back(&self) -> StoreFuture<'_, Vec<String>> {
        let prefix = self.prefix.clone();
        let errors = self.store.inner.errors;
        Box::pin(self.store.write(Writes::Direct, prefix, move |conn, prefix| leases::take_back(conn, errors, prefix)))
    }
}
