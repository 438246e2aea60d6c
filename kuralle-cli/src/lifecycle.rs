//! `runs cancel` (and the console's Cancel button), `runs retry` and `runs fork`: each needs
//! only the store. A cancelled run nobody owns is closed at once; an owner (in any process)
//! sees its lease released at its next journal write or renewal, and stops. A retried or
//! forked run is left `running` with no owner, for a worker (or `resume`) to carry on.

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

/// Makes a failed run runnable again ([`kuralle::record_retry`]).
pub async fn retry(store: &dyn RunStore, run_id: &str) -> Result<(), CliError> {
    Ok(kuralle::record_retry(store, run_id).await?)
}

/// Forks a run at journal ordinal `at` ([`kuralle::fork_run`]); returns the new run's id.
pub async fn fork(
    store: &dyn RunStore,
    run_id: &str,
    at: u64,
    new_id: Option<String>,
    agent: Option<String>,
    instructions: Option<String>,
) -> Result<String, CliError> {
    let mut options = kuralle::ForkOptions::new();
    if let Some(id) = new_id {
        options = options.run_id(id);
    }
    if let Some(agent) = agent {
        options = options.agent(agent);
    }
    if let Some(text) = instructions {
        options = options.instructions(text);
    }
    let id = kuralle::fork_run(store, run_id, at, &options).await?;
    let _ = store.notify_runnable().await;
    Ok(id)
}
