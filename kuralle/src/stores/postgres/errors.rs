//! PostgreSQL and pool errors as typed [`StoreError`]s.
//!
//! Anything that a later attempt may get past (the server or the network is down, the
//! connection was terminated, a lock or serialization conflict, too many connections) is
//! [`StoreError::Unavailable`]; data the schema cannot hold is [`StoreError::LimitExceeded`];
//! a schema that is not what this build expects is [`StoreError::Corrupt`].

use std::future::Future;

use deadpool_postgres::PoolError;
use tokio_postgres::error::SqlState;

use crate::StoreError;

/// Maps a client error.
pub(super) fn map(error: tokio_postgres::Error) -> StoreError {
    let Some(db) = error.as_db_error() else {
        // No server response: I/O, a closed connection, a timeout, or a protocol problem.
        return StoreError::Unavailable(format!("PostgreSQL connection failed: {error}"));
    };
    let code = db.code().code();
    let detail = format!("{} (SQLSTATE {code})", db.message());
    match &code[..2] {
        // connection exception; operator intervention (terminated backend, shutdown);
        // insufficient resources; transaction rollback (serialization, deadlock); lock timeout.
        "08" | "57" | "53" | "40" => StoreError::Unavailable(format!("PostgreSQL: {detail}")),
        "55" if *db.code() == SqlState::LOCK_NOT_AVAILABLE => StoreError::Unavailable(format!("PostgreSQL: {detail}")),
        "25" if *db.code() == SqlState::READ_ONLY_SQL_TRANSACTION => {
            StoreError::Unavailable(format!("PostgreSQL is read-only (a standby?): {detail}"))
        }
        "54" => StoreError::LimitExceeded(format!("PostgreSQL: {detail}")),
        "22" => StoreError::LimitExceeded(format!("PostgreSQL cannot store the value: {detail}")),
        _ => StoreError::Corrupt(format!("unexpected PostgreSQL error (is the kuralle schema intact?): {detail}")),
    }
}

/// Maps a failure to get a pooled connection.
pub(super) fn pool(error: PoolError) -> StoreError {
    match error {
        PoolError::Backend(e) => map(e),
        other => StoreError::Unavailable(format!("no PostgreSQL connection available: {other}")),
    }
}

/// A failed attempt of one operation, and whether running it again is safe: the server
/// answered that the statement did not run (terminated backend, connection exception,
/// serialization failure), or no statement was sent (no pooled connection), or the operation
/// is a read.
#[derive(Debug)]
pub(super) struct Fail {
    pub error: StoreError,
    pub retry: bool,
}

impl From<StoreError> for Fail {
    fn from(error: StoreError) -> Self {
        Self { error, retry: false }
    }
}

impl Fail {
    /// A write's statement failed: retry only if the server said it did not run. A broken
    /// connection with no answer leaves the write in doubt: it is reported, not repeated.
    pub fn write(error: tokio_postgres::Error) -> Self {
        let retry = error.as_db_error().is_some_and(|db| matches!(&db.code().code()[..2], "08" | "57" | "40"));
        Self { error: map(error), retry }
    }

    /// A read's statement failed: any retryable failure may be retried.
    pub fn read(error: tokio_postgres::Error) -> Self {
        let error = map(error);
        Self { retry: error.is_retryable(), error }
    }

    /// No connection could be had: nothing was sent.
    pub fn pool(error: PoolError) -> Self {
        let error = pool(error);
        Self { retry: error.is_retryable(), error }
    }
}

/// How many times an operation runs at most when its failures are safe to retry.
pub(super) const ATTEMPTS: usize = 3;

/// Runs `attempt` until it succeeds, fails for good, or [`ATTEMPTS`] are spent.
pub(super) async fn retrying<T, F, Fut>(mut attempt: F) -> Result<T, StoreError>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, Fail>>,
{
    let mut tries = 0;
    loop {
        tries += 1;
        match attempt().await {
            Ok(value) => return Ok(value),
            Err(fail) if fail.retry && tries < ATTEMPTS => {
                tracing::debug!(error = %fail.error, tries, "retrying a PostgreSQL operation on a fresh connection");
            }
            Err(fail) => return Err(fail.error),
        }
    }
}
