//! Leases: proof of ownership of one run.

use serde::{Deserialize, Serialize};

/// Proof of ownership of one run, granted by [`RunStore::acquire_lease`](super::RunStore::acquire_lease).
///
/// Every write that belongs to the run carries [`token`](Self::token) as its `fence`; the
/// store rejects it with [`StoreError::Fenced`](super::StoreError::Fenced) once a newer lease was granted or this one was
/// released.
///
/// ```
/// use std::time::Duration;
/// use kuralle::{RunStore, stores::MemoryStore};
///
/// # futures::executor::block_on(async {
/// let store = MemoryStore::new();
/// let lease = store.acquire_lease("run-1", "worker-a", Duration::from_secs(30)).await?;
/// assert_eq!(lease.token, 1);
/// store.release_lease(&lease).await?;
/// let next = store.acquire_lease("run-1", "worker-b", Duration::from_secs(30)).await?;
/// assert_eq!(next.token, 2, "tokens only grow");
/// # Ok::<(), kuralle::StoreError>(())
/// # }).unwrap();
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Lease {
    /// Run id.
    pub run_id: String,
    /// Who holds it (unique per holder: e.g. `"<process uuid>/<turn uuid>"`).
    pub owner: String,
    /// Fencing token: per run, strictly greater than every token granted before for that
    /// run, including after release or expiry (never reused; the first grant is 1).
    pub token: u64,
    /// Expiry by the store's clock (ms since the Unix epoch). Informational for the holder.
    pub expires_at_ms: i64,
}
