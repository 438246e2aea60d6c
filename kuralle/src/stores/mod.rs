//! [`RunStore`](crate::RunStore) implementations.
//!
//! - [`MemoryStore`]: a process-local map; nothing survives the process. For tests and demos.
//! - [`SqliteStore`] (feature `sqlite`, on by default): the embedded durable store. WAL,
//!   `synchronous=FULL`, one writer thread doing group commit.
//!
//! Every store passes the same conformance suite and has the same semantics, including the
//! value size limit [`DEFAULT_MAX_VALUE_BYTES`].

mod memory;
#[cfg(feature = "sqlite")]
mod sqlite;

pub use memory::MemoryStore;
#[cfg(feature = "sqlite")]
pub use sqlite::{SqliteOptions, SqliteStore};

use serde_json::Value;

use crate::StoreError;

/// The largest JSON value (a run's `state`, a step's result or error), as compact JSON text,
/// that a store accepts by default: 16 MiB. A larger value is rejected with
/// [`StoreError::LimitExceeded`] and nothing is written.
///
/// ```
/// assert_eq!(kuralle::stores::DEFAULT_MAX_VALUE_BYTES, 16 * 1024 * 1024);
/// ```
pub const DEFAULT_MAX_VALUE_BYTES: usize = 16 * 1024 * 1024;

/// Counts the bytes of a value's compact JSON text without building it.
#[derive(Default)]
struct ByteCounter(usize);

impl std::io::Write for ByteCounter {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0 += buf.len();
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Rejects a value whose compact JSON text is longer than `max` bytes.
pub(crate) fn check_value_size(what: &str, value: &Value, max: usize) -> Result<(), StoreError> {
    let mut counter = ByteCounter::default();
    // Serializing a `Value` into a writer that never fails cannot fail.
    let _ = serde_json::to_writer(&mut counter, value);
    if counter.0 > max {
        return Err(StoreError::LimitExceeded(format!(
            "{what} is {} bytes of JSON; the limit is {max} bytes",
            counter.0
        )));
    }
    Ok(())
}

/// Rejects a JSON text longer than `max` bytes.
#[cfg(feature = "sqlite")]
pub(crate) fn check_text_size(what: &str, text: &str, max: usize) -> Result<(), StoreError> {
    if text.len() > max {
        return Err(StoreError::LimitExceeded(format!(
            "{what} is {} bytes of JSON; the limit is {max} bytes",
            text.len()
        )));
    }
    Ok(())
}
