//! SQLite errors as typed [`StoreError`]s, each keeping the driver's error as its source.

use std::path::Path;
use std::time::Duration;

use rusqlite::ErrorCode;

use crate::store::StoreError;

/// Maps SQLite errors to typed store errors.
#[derive(Debug, Clone, Copy)]
pub(super) struct Mapper {
    pub(super) busy_timeout: Duration,
    /// The store's size limit, named in the message of a full database.
    pub(super) max_size_bytes: Option<u64>,
}

impl Mapper {
    /// The typed error for `error`, which it keeps as its source.
    pub(super) fn map(self, error: rusqlite::Error) -> StoreError {
        self.classify(&error).with_source(error)
    }

    fn classify(self, error: &rusqlite::Error) -> StoreError {
        let rusqlite::Error::SqliteFailure(failure, message) = error else {
            return StoreError::Corrupt(format!("unexpected data in the store: {error}").into());
        };
        let detail = message.clone().unwrap_or_else(|| failure.to_string());
        match failure.code {
            // SQLite answers some lock conflicts at once, without calling the busy handler (a
            // read transaction that cannot become a write one, a snapshot too old to write
            // from, a WAL being recovered): the extended code tells those from a timeout.
            ErrorCode::DatabaseBusy | ErrorCode::DatabaseLocked => StoreError::Unavailable(
                format!(
                    "database is locked by another process or connection (SQLite extended code {}); busy_timeout is \
                 {} ms: {detail}",
                    failure.extended_code,
                    self.busy_timeout.as_millis()
                )
                .into(),
            ),
            ErrorCode::ReadOnly => StoreError::Unavailable(format!("database is read-only: {detail}").into()),
            // SQLite gives the same code for a full disk and for the file reaching its page cap.
            ErrorCode::DiskFull => StoreError::StorageFull(
                match self.max_size_bytes {
                    Some(max) => format!(
                        "the SQLite database reached its size limit (max_size_bytes = {max}) or the disk is full; \
                         raise SqliteOptions::max_size_bytes or free disk space, then resume the unfinished runs: \
                         {detail}"
                    ),
                    None => format!("the disk is full; free disk space, then resume the unfinished runs: {detail}"),
                }
                .into(),
            ),
            ErrorCode::SystemIoFailure => StoreError::Unavailable(format!("disk I/O error: {detail}").into()),
            ErrorCode::CannotOpen => StoreError::Unavailable(format!("cannot open the database file: {detail}").into()),
            ErrorCode::PermissionDenied => StoreError::Unavailable(format!("permission denied: {detail}").into()),
            ErrorCode::OutOfMemory => StoreError::Unavailable(format!("out of memory: {detail}").into()),
            ErrorCode::FileLockingProtocolFailed => {
                StoreError::Unavailable(format!("file locking failed: {detail}").into())
            }
            ErrorCode::NotADatabase => {
                StoreError::Corrupt(format!("the file is not a SQLite database: {detail}").into())
            }
            ErrorCode::DatabaseCorrupt => {
                StoreError::Corrupt(format!("the database file is malformed: {detail}").into())
            }
            ErrorCode::TooBig => StoreError::LimitExceeded(format!("value too large for SQLite: {detail}").into()),
            _ => {
                StoreError::Corrupt(format!("unexpected SQLite error (is the kuralle schema intact?): {detail}").into())
            }
        }
    }

    pub(super) fn at_open(self, path: &Path, error: rusqlite::Error) -> StoreError {
        match self.map(error) {
            StoreError::Corrupt(message) => StoreError::Corrupt(message.prefixed(&path.display().to_string())),
            StoreError::Unavailable(message) => StoreError::Unavailable(message.prefixed(&path.display().to_string())),
            StoreError::StorageFull(message) => StoreError::StorageFull(message.prefixed(&path.display().to_string())),
            other => other,
        }
    }
}
