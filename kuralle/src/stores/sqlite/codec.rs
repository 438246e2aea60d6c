//! The row codec: Rust values ↔ SQLite columns.

use rusqlite::ToSql;
use rusqlite::types::{ToSqlOutput, Value, ValueRef};

use crate::json::JsonText;
use crate::store::{RunRecord, RunStatus, StepKind, StepRecord, StepStatus, StoreError};

pub(super) struct RawStep {
    pub(super) ordinal: i64,
    /// As the column holds it ([`StoredKey`]).
    pub(super) key: Value,
    pub(super) kind: String,
    pub(super) name: String,
    pub(super) epoch: i64,
    pub(super) status: String,
    pub(super) result: Option<String>,
    pub(super) error: Option<String>,
    pub(super) started_at_ms: i64,
    pub(super) finished_at_ms: Option<i64>,
}

/// A journal key as the `steps.key` column holds it: the 32 bytes of a key that is a SHA-256
/// in lowercase hex (every key the runtime makes, `journal/key.rs`), the text of any other,
/// as `keymap::CompactKey` holds keys in memory.
///
/// The key is in the journal's unique index as well as its row, and 64 characters of hex
/// were most of both: as bytes, each index entry is about half as large, so more of them fit
/// in a page and in the page cache. The mapping is one to one: a blob is only ever a digest,
/// and SQLite never finds a blob equal to a text, so a text key that spells a digest in
/// capitals stays a key of its own, as it was.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum StoredKey<'a> {
    Digest([u8; 32]),
    Text(&'a str),
}

impl<'a> StoredKey<'a> {
    pub(super) fn of(key: &'a str) -> Self {
        crate::keymap::digest(key).map_or(Self::Text(key), Self::Digest)
    }

    /// The key a column holds, as the store's callers gave it.
    pub(super) fn read(value: ValueRef<'_>) -> Result<String, StoreError> {
        match value {
            ValueRef::Blob(digest) if digest.len() == 32 => Ok(crate::keymap::hex(digest)),
            ValueRef::Text(text) => String::from_utf8(text.to_vec())
                .map_err(|_| StoreError::Corrupt("steps.key holds text that is not UTF-8".into())),
            other => Err(StoreError::Corrupt(format!("steps.key holds a {:?}, not a key", other.data_type()).into())),
        }
    }
}

impl ToSql for StoredKey<'_> {
    fn to_sql(&self) -> rusqlite::Result<ToSqlOutput<'_>> {
        Ok(ToSqlOutput::Borrowed(match self {
            Self::Digest(digest) => ValueRef::Blob(digest),
            Self::Text(text) => ValueRef::Text(text.as_bytes()),
        }))
    }
}

impl RawStep {
    pub(super) fn into_record(self) -> Result<StepRecord, StoreError> {
        Ok(StepRecord {
            ordinal: to_u64("steps.ordinal", self.ordinal)?,
            kind: StepKind::parse(&self.kind)
                .ok_or_else(|| StoreError::Corrupt(format!("unknown step kind `{}`", self.kind).into()))?,
            status: StepStatus::parse(&self.status)
                .ok_or_else(|| StoreError::Corrupt(format!("unknown step status `{}`", self.status).into()))?,
            epoch: to_u64("steps.epoch", self.epoch)?,
            result: self.result.map(|text| parse_json("steps.result", text)).transpose()?,
            error: self.error.map(|text| parse_json("steps.error", text)).transpose()?,
            key: StoredKey::read(ValueRef::from(&self.key))?,
            name: self.name,
            started_at_ms: self.started_at_ms,
            finished_at_ms: self.finished_at_ms,
        })
    }
}

/// Converts what a run row needs before it is queued, `(epoch, version)`, and checks the size
/// of its state.
pub(super) fn prepare_run(run: &RunRecord, max_value_bytes: usize) -> Result<(i64, i64), StoreError> {
    let prepared = (to_i64("run epoch", run.epoch)?, to_i64("run version", run.version)?);
    crate::stores::check_len("run state", run.state.as_str().len(), max_value_bytes)?;
    Ok(prepared)
}

/// A column's JSON text, checked to be one JSON value and kept as stored.
pub(super) fn parse_json(column: &str, text: String) -> Result<JsonText, StoreError> {
    JsonText::parse(text).map_err(|e| StoreError::Corrupt(format!("{column} holds invalid JSON: {e}").into()))
}

pub(super) fn parse_run_status(text: &str) -> Result<RunStatus, StoreError> {
    RunStatus::parse(text).ok_or_else(|| StoreError::Corrupt(format!("unknown run status `{text}`").into()))
}

pub(super) fn to_i64(what: &str, value: u64) -> Result<i64, StoreError> {
    i64::try_from(value).map_err(|_| StoreError::LimitExceeded(format!("{what} {value} exceeds {}", i64::MAX).into()))
}

pub(super) fn to_u64(column: &str, value: i64) -> Result<u64, StoreError> {
    u64::try_from(value).map_err(|_| StoreError::Corrupt(format!("{column} holds a negative value {value}").into()))
}
