//! The row codec: Rust values ↔ SQLite columns, and SQLite errors → typed store errors.

use std::path::Path;
use std::time::Duration;

use crate::JsonText;
use crate::store::{RunRecord, RunStatus, StepKind, StepRecord, StepStatus, StoreError};
use rusqlite::ErrorCode;

pub(super) struct RawStep {
    pub(super) ordinal: i64,
    pub(super) key: String,
    pub(super) kind: String,
    pub(super) name: String,
    pub(super) epoch: i64,
    pub(super) status: String,
    pub(super) result: Option<String>,
    pub(super) error: Option<String>,
    pub(super) started_at_ms: i64,
    pub(super) finished_at_ms: Option<i64>,
}

impl RawStep {
    pub(super) fn into_record(self) -> Result<StepRecord, StoreError> {
        Ok(StepRecord {
            ordinal: to_u64("steps.ordinal", self.ordinal)?,
            kind: StepKind::parse(&self.kind)
                .ok_or_else(|| StoreError::Corrupt(format!("unknown step kind `{}`", self.kind)))?,
            status: StepStatus::parse(&self.status)
                .ok_or_else(|| StoreError::Corrupt(format!("unknown step status `{}`", self.status)))?,
            epoch: to_u64("steps.epoch", self.epoch)?,
            result: self.result.map(|text| parse_json("steps.result", text)).transpose()?,
            error: self.error.map(|text| parse_json("steps.error", text)).transpose()?,
            key: self.key,
            name: self.name,
            started_at_ms: self.started_at_ms,
            finished_at_ms: self.finished_at_ms,
        })
    }
}

/// Converts what a run row needs before it is queued: `(epoch, version, state JSON)`.
pub(super) fn prepare_run(run: &RunRecord, max_value_bytes: usize) -> Result<(i64, i64, String), StoreError> {
    Ok((to_i64("run epoch", run.epoch)?, to_i64("run version", run.version)?, {
        let state = run.state.as_str();
        crate::stores::check_len("run state", state.len(), max_value_bytes)?;
        state.to_owned()
    }))
}

/// A column's JSON text, checked to be one JSON value and kept as stored.
pub(super) fn parse_json(column: &str, text: String) -> Result<JsonText, StoreError> {
    JsonText::parse(text).map_err(|e| StoreError::Corrupt(format!("{column} holds invalid JSON: {e}")))
}

pub(super) fn parse_run_status(text: &str) -> Result<RunStatus, StoreError> {
    RunStatus::parse(text).ok_or_else(|| StoreError::Corrupt(format!("unknown run status `{text}`")))
}

pub(super) fn to_i64(what: &str, value: u64) -> Result<i64, StoreError> {
    i64::try_from(value).map_err(|_| StoreError::LimitExceeded(format!("{what} {value} exceeds {}", i64::MAX)))
}

pub(super) fn to_u64(column: &str, value: i64) -> Result<u64, StoreError> {
    u64::try_from(value).map_err(|_| StoreError::Corrupt(format!("{column} holds a negative value {value}")))
}

/// Maps SQLite errors to typed store errors.
#[derive(Debug, Clone, Copy)]
pub(super) struct Mapper {
    pub(super) busy_timeout: Duration,
}

impl Mapper {
    pub(super) fn map(self, error: rusqlite::Error) -> StoreError {
        let rusqlite::Error::SqliteFailure(failure, message) = &error else {
            return StoreError::Corrupt(format!("unexpected data in the store: {error}"));
        };
        let detail = message.clone().unwrap_or_else(|| failure.to_string());
        match failure.code {
            // SQLite answers some lock conflicts at once, without calling the busy handler (a
            // read transaction that cannot become a write one, a snapshot too old to write
            // from, a WAL being recovered): the extended code tells those from a timeout.
            ErrorCode::DatabaseBusy | ErrorCode::DatabaseLocked => StoreError::Unavailable(format!(
                "database is locked by another process or connection (SQLite extended code {}); busy_timeout is \
                 {} ms: {detail}",
                failure.extended_code,
                self.busy_timeout.as_millis()
            )),
            ErrorCode::ReadOnly => StoreError::Unavailable(format!("database is read-only: {detail}")),
            ErrorCode::DiskFull => StoreError::Unavailable(format!("database or disk is full: {detail}")),
            ErrorCode::SystemIoFailure => StoreError::Unavailable(format!("disk I/O error: {detail}")),
            ErrorCode::CannotOpen => StoreError::Unavailable(format!("cannot open the database file: {detail}")),
            ErrorCode::PermissionDenied => StoreError::Unavailable(format!("permission denied: {detail}")),
            ErrorCode::OutOfMemory => StoreError::Unavailable(format!("out of memory: {detail}")),
            ErrorCode::FileLockingProtocolFailed => StoreError::Unavailable(format!("file locking failed: {detail}")),
            ErrorCode::NotADatabase => StoreError::Corrupt(format!("the file is not a SQLite database: {detail}")),
            ErrorCode::DatabaseCorrupt => StoreError::Corrupt(format!("the database file is malformed: {detail}")),
            ErrorCode::TooBig => StoreError::LimitExceeded(format!("value too large for SQLite: {detail}")),
            _ => StoreError::Corrupt(format!("unexpected SQLite error (is the kuralle schema intact?): {detail}")),
        }
    }

    pub(super) fn at_open(self, path: &Path, error: rusqlite::Error) -> StoreError {
        match self.map(error) {
            StoreError::Corrupt(message) => StoreError::Corrupt(format!("{}: {message}", path.display())),
            StoreError::Unavailable(message) => StoreError::Unavailable(format!("{}: {message}", path.display())),
            other => other,
        }
    }
}
