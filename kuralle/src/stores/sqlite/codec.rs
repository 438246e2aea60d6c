//! The row codec: Rust values ↔ SQLite columns.

use crate::json::JsonText;
use crate::store::{RunRecord, RunStatus, StepKind, StepRecord, StepStatus, StoreError};

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
                .ok_or_else(|| StoreError::Corrupt(format!("unknown step kind `{}`", self.kind).into()))?,
            status: StepStatus::parse(&self.status)
                .ok_or_else(|| StoreError::Corrupt(format!("unknown step status `{}`", self.status).into()))?,
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
