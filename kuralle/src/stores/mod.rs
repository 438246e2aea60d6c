//! [`RunStore`](crate::RunStore) implementations.
//!
//! - [`MemoryStore`]: a process-local map; nothing survives the process. For tests and demos.
//! - [`SqliteStore`] (feature `sqlite`, on by default): the embedded durable store. WAL,
//!   `synchronous=FULL`, one writer thread doing group commit.
//! - `PostgresStore` (feature `postgres`): many workers on many machines; leases with
//!   fencing tokens checked by the database on every write.
//!
//! Every store passes the same conformance suite and has the same semantics, including the
//! value size limit [`DEFAULT_MAX_VALUE_BYTES`].

mod memory;
#[cfg(feature = "postgres")]
mod postgres;
#[cfg(feature = "sqlite")]
mod sqlite;

pub use memory::MemoryStore;
#[cfg(feature = "postgres")]
pub use postgres::{PostgresOptions, PostgresStore, PostgresTls};
/// The rustls that [`PostgresTls`] takes (`RootCertStore`, `ClientConfig`), re-exported so that
/// its version always matches kuralle's.
#[cfg(feature = "postgres")]
#[doc(no_inline)]
pub use rustls;
#[cfg(feature = "sqlite")]
pub use sqlite::{SqliteOptions, SqliteStore};

use crate::store::StoreError;

/// The largest JSON value (a run's `state`, a step's result or error), as compact JSON text,
/// that a store accepts by default: 16 MiB. A larger value is rejected with
/// [`StoreError::LimitExceeded`] and nothing is written.
///
/// ```
/// assert_eq!(kuralle::stores::DEFAULT_MAX_VALUE_BYTES, 16 * 1024 * 1024);
/// ```
pub const DEFAULT_MAX_VALUE_BYTES: usize = 16 * 1024 * 1024;

/// Rejects JSON text longer than `max` bytes.
pub(crate) fn check_len(what: &str, len: usize, max: usize) -> Result<(), StoreError> {
    if len > max {
        return Err(StoreError::LimitExceeded(
            format!("{what} is {len} bytes of JSON; the limit is {max} bytes").into(),
        ));
    }
    Ok(())
}
