//! PostgreSQL and pool errors as typed [`StoreError`]s.
//!
//! Anything that a later attempt may get past (the server or the network is down, the
//! connection was terminated, a lock or serialization conflict, too many connections) is
//! [`StoreError::Unavailable`]; data the schema cannot hold is [`StoreError::LimitExceeded`];
//! a schema that is not what this build expects is [`StoreError::Corrupt`].

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
