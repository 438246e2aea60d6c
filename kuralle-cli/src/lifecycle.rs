//! `runs cancel` and the console's Cancel button: [`RunStore::cancel_run`], which needs only
//! the store. A run nobody owns is closed at once; an owner (in any process) sees its lease
//! released at its next journal write or renewal, and stops.

use kuralle::{RunStatus, RunStore};
use serde::Serialize;

use crate::error::CliError;

/// A cancelled run, as reported.
#[derive(Debug, Clone, Serialize)]
pub struct Cancelled {
    /// Run id.
    pub run_id: String,
    /// The status it had (`running` or `paused`).
    pub was: RunStatus,
}

/// Cancels a `running` or `paused` run.
pub async fn cancel(store: &dyn RunStore, run_id: &str) -> Result<Cancelled, CliError> {
    match store.cancel_run(run_id).await? {
        None => Err(CliError::UnknownRun(run_id.to_owned())),
        Some(was @ (RunStatus::Running | RunStatus::Paused)) => Ok(Cancelled { run_id: run_id.to_owned(), was }),
        Some(status) => Err(CliError::NotCancellable { run_id: run_id.to_owned(), status }),
    }
}
