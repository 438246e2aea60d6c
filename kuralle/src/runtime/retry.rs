//! Retrying a failed run from outside the process that runs it: the failed turn is made
//! runnable again, and a worker (or `resume`) carries it on from its journal.

use tokio_util::sync::CancellationToken;

use super::{lease, open::reopen_failed, state::decode_state};
use crate::{
    error::RunError,
    journal::{Fence, RunWriter},
    store::RunStore,
};

/// Makes a [`Failed`](crate::RunStatus::Failed) run runnable again (status `running`, no
/// owner) without running it: a worker claims it, or [`Runtime::resume`](crate::Runtime::resume)
/// continues it, and every step its failed turn finished replays from the journal. This is
/// what `kuralle runs retry` does; [`Runtime::retry`](crate::Runtime::retry) also runs it.
///
/// ```
/// use kuralle::{RunError, stores::MemoryStore};
///
/// # tokio::runtime::Runtime::new().unwrap().block_on(async {
/// let store = MemoryStore::new();
/// let err = kuralle::record_retry(&store, "no-such-run").await.unwrap_err();
/// assert!(matches!(err, RunError::RunNotFound(_)));
/// # });
/// ```
///
/// # Errors
/// [`RunError::WrongStatus`] for a run that did not fail; [`RunError::Busy`] when another
/// caller owns it; [`RunError::RunNotFound`]; [`RunError::Store`] when the store fails.
pub async fn record_retry(store: &dyn RunStore, run_id: &str) -> Result<(), RunError> {
    // Checked before the lease is taken: a made-up run id must not get a lease row.
    if store.get_run(run_id).await?.is_none() {
        return Err(RunError::RunNotFound(run_id.to_owned()));
    }
    let (lease, _) = lease::acquire(store, &lease::owner_id(None), run_id, lease::DEFAULT_LEASE_TTL, None).await?;
    let fence = Fence::new(&lease, CancellationToken::new());
    let writer = RunWriter::new(store, &fence);
    let result = async {
        let record = writer.get_run().await?.ok_or_else(|| RunError::RunNotFound(run_id.to_owned()))?;
        let state = decode_state(&record)?;
        reopen_failed(writer, record, state).await.map(|_| ())
    }
    .await;
    let result = fence.settle(result);
    if !fence.is_lost() {
        let _ = store.release_lease(&lease).await;
    }
    if result.is_ok() {
        let _ = store.notify_runnable().await;
    }
    result
}
