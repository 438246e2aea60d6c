//! What can go wrong for an operator, each with a message that says what to do.

use kuralle::{RunError, StoreError};

/// A failed `kuralle` command.
#[derive(Debug, thiserror::Error)]
pub enum CliError {
    /// Neither `--store` nor `KURALLE_STORE` names a store.
    #[error("no store given: pass --store sqlite:PATH (or postgres://...), or set KURALLE_STORE")]
    NoStore,
    /// `--store sqlite:PATH` names a file that does not exist.
    #[error("no store at `{0}`: the file does not exist (check --store; the CLI never creates a store)")]
    MissingStore(String),
    /// `--store` is not a form the CLI knows.
    #[error("cannot open store `{0}`: expected `sqlite:PATH` or `postgres://...`")]
    UnsupportedStore(String),
    /// A `postgres://` store in a build without PostgreSQL support.
    #[cfg(not(feature = "postgres"))]
    #[error("store `{0}` needs PostgreSQL support: build kuralle-cli with `--features postgres`")]
    NoPostgres(String),
    /// A decision without the name of who decides.
    #[error("a decision needs the name of who decides (--by)")]
    NoDecider,
    /// Another process owns the run right now (it is running a turn).
    #[error("run `{run_id}` is busy: `{owner}` is running it; try again in a moment")]
    Busy {
        /// Run id.
        run_id: String,
        /// The current owner.
        owner: String,
    },
    /// No run with that id in the store.
    #[error("no run `{0}` in this store")]
    UnknownRun(String),
    /// The run exists but does not wait on that request.
    #[error("run `{run_id}` has no pending approval `{request_id}`{hint}")]
    NotPending {
        /// Run id.
        run_id: String,
        /// The request id given.
        request_id: String,
        /// What it waits on instead, when anything.
        hint: String,
    },
    /// A decision for that request was recorded earlier; the first one stands.
    #[error("approval `{request_id}` of run `{run_id}` was already decided{by}")]
    AlreadyDecided {
        /// Run id.
        run_id: String,
        /// Request id.
        request_id: String,
        /// What was decided and by whom (" (approved by NAME)").
        by: String,
    },
    /// The run already ended: only a running or paused run can be cancelled.
    #[error("run `{run_id}` is {status}: only a running or paused run can be cancelled")]
    NotCancellable {
        /// Run id.
        run_id: String,
        /// Its status.
        status: kuralle::RunStatus,
    },
    /// The store failed.
    #[error("store error: {0}")]
    Store(#[from] StoreError),
    /// The runtime refused the operation.
    #[error("{0}")]
    Run(RunError),
    /// The console could not start.
    #[error("console: {0}")]
    Console(String),
    /// The run could not be exported.
    #[error("cannot export: {0}")]
    Export(String),
    /// The output file could not be created or written.
    #[error("cannot write `{0}`: {1}")]
    Output(String, std::io::Error),
    /// Writing output failed.
    #[error("cannot write output: {0}")]
    Io(#[from] std::io::Error),
}

impl From<RunError> for CliError {
    fn from(e: RunError) -> Self {
        match e {
            RunError::Store(s) => Self::Store(s),
            RunError::RunNotFound(id) => Self::UnknownRun(id),
            RunError::Busy { run_id, owner, .. } => Self::Busy { run_id, owner },
            other => Self::Run(other),
        }
    }
}
