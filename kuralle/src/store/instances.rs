//! Instances: proof that this process is the one live holder of an instance id, so that a
//! restarted process can take its dead predecessor's runs back at once instead of waiting
//! for their leases to expire.

use std::fmt;

use futures::future::BoxFuture;

use super::StoreFuture;

/// Proof, held until dropped, that this process is the only live one with an instance id
/// (see [`RuntimeBuilder::instance_id`](crate::RuntimeBuilder::instance_id)), granted by
/// [`RunStore::lock_instance`](super::RunStore::lock_instance).
///
/// The proof is something the operating system or the database takes away when the holder
/// dies, never a timeout: an OS file lock beside a SQLite file, a PostgreSQL session advisory
/// lock, or (for stores that cannot outlive the process) an in-process registry. While one is
/// held no other process can hold one for the same id, so every lease whose owner starts with
/// `"<instance id>/"` and that this process did not take belongs to a process that is gone,
/// and [`take_back`](Self::take_back) may end it.
///
/// ```
/// use kuralle::{RunStore, StoreError, stores::MemoryStore};
/// # tokio::runtime::Runtime::new().unwrap().block_on(async {
/// let store = MemoryStore::new();
/// let ttl = std::time::Duration::from_secs(3600);
/// // A predecessor of instance `app-1` died holding this run's lease.
/// let old = store.acquire_lease("run-1", "app-1/3f2a", ttl).await?;
///
/// let lock = store.lock_instance("app-1").await?.expect("the memory store proves it");
/// assert_eq!(lock.instance_id(), "app-1");
/// // A second holder of the same id is refused while this one lives.
/// assert!(matches!(store.lock_instance("app-1").await, Err(StoreError::InstanceInUse { .. })));
/// // Taking back ends the predecessor's lease: the run is free at once, with a higher token.
/// assert_eq!(lock.take_back().await?, ["run-1"]);
/// let new = store.acquire_lease("run-1", "app-1/77c0", ttl).await?;
/// assert!(new.token > old.token);
/// drop(lock);
/// assert!(store.lock_instance("app-1").await?.is_some(), "dropped: free again");
/// # Ok::<(), StoreError>(())
/// # }).unwrap();
/// ```
pub trait InstanceLock: Send + Sync + fmt::Debug + 'static {
    /// The instance id this lock proves.
    fn instance_id(&self) -> &str;

    /// Ends every unreleased lease whose owner starts with `"<instance id>/"`, expired or not,
    /// exactly as [`RunStore::release_lease`](super::RunStore::release_lease) does (the next
    /// acquire gets a higher fencing token, so a late write under an ended lease is
    /// [`Fenced`](super::StoreError::Fenced)); returns their run ids.
    ///
    /// Call it right after the lock is granted, before this process takes any lease of its
    /// own: every lease it ends then belongs to a process that is gone. It runs under the proof
    /// (PostgreSQL runs it on the lock's own session, so it cannot run once the lock is lost).
    fn take_back(&self) -> StoreFuture<'_, Vec<String>>;

    /// Resolves once the proof is lost while the lock is held (PostgreSQL: the lock's
    /// connection closed, so its session lock is gone). From then on this process can no
    /// longer prove it is alive: another process with the same id may take its runs back.
    /// The default never resolves, for proofs that last as long as the process (an OS file
    /// lock, an in-process registry).
    fn lost(&self) -> BoxFuture<'static, ()> {
        Box::pin(std::future::pending())
    }
}

/// The owner prefix of instance `id`'s leases: `"<id>/"`.
pub(crate) fn owner_prefix(id: &str) -> String {
    format!("{id}/")
}

/// An in-process registry of instance ids, for stores that cannot outlive the process
/// ([`MemoryStore`](crate::stores::MemoryStore), an in-memory
/// [`SqliteStore`](crate::stores::SqliteStore)): a process that died took the store with it,
/// so a held id only needs to be refused to a second holder in this process.
#[derive(Debug, Default, Clone)]
pub(crate) struct Registry {
    held: std::sync::Arc<std::sync::Mutex<std::collections::HashSet<String>>>,
}

impl Registry {
    /// Registers `id`; `None` when it is held already. Dropping the entry unregisters it.
    pub(crate) fn claim(&self, id: &str) -> Option<Registered> {
        let mut held = self.held.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        held.insert(id.to_owned()).then(|| Registered { registry: self.clone(), id: id.to_owned() })
    }
}

/// One held entry of a [`Registry`].
#[derive(Debug)]
pub(crate) struct Registered {
    registry: Registry,
    id: String,
}

impl Drop for Registered {
    fn drop(&mut self) {
        self.registry.held.lock().unwrap_or_else(std::sync::PoisonError::into_inner).remove(&self.id);
    }
}
