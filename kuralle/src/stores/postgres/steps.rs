//! The journal: atomic ordinal reservation with intents, outcomes, reads.

use std::collections::HashSet;

use super::PostgresStore;
use super::codec::{decode, encode, to_i64, to_u64};
use super::errors::{Fail, retrying};
use super::runs::{fence_param, fenced, get};
use crate::store::{FinishedWithIntents, NewStep, StepKind, StepOutcome, StepRecord, StepStatus};
use crate::stores::check_len;
use crate::{json::JsonText, store::StoreError};

/// A step outcome as its `status`, `result` and `error` columns.
pub(super) type OutcomeColumns = (&'static str, Option<serde_json::Value>, Option<serde_json::Value>);

/// The unique constraint on `(run_id, key)` as PostgreSQL names it.
pub(super) const KEY_CONSTRAINT: &str = "kuralle_steps_run_id_key_key";

impl PostgresStore {
    pub(super) async fn append_fenced(
        &self,
        run_id: &str,
        fence: Option<u64>,
        steps: &[NewStep],
    ) -> Result<Vec<u64>, StoreError> {
        self.append_rows(run_id, fence, steps, None).await
    }

    /// Appends `finished`, already finished with `outcome` at `finished_at_ms`, then the
    /// intents, in one statement (one commit).
    pub(super) async fn append_finished_fenced(
        &self,
        run_id: &str,
        fence: Option<u64>,
        write: FinishedWithIntents,
    ) -> Result<Vec<u64>, StoreError> {
        let FinishedWithIntents { finished, outcome, finished_at_ms, intents } = write;
        let mut steps = Vec::with_capacity(intents.len() + 1);
        steps.push(finished);
        steps.extend(intents);
        let first = self.outcome_columns(&outcome)?;
        self.append_rows(run_id, fence, &steps, Some((first, finished_at_ms))).await
    }

    /// The `(status, result, error)` columns of `outcome`, after its size check.
    pub(super) fn outcome_columns(&self, outcome: &StepOutcome) -> Result<OutcomeColumns, StoreError> {
        let max = self.inner.options.max_value_bytes;
        Ok(match outcome {
            // JSONB at the boundary: the text becomes a tree only here.
            StepOutcome::Finished(text) => {
                check_len("step result", text.len(), max)?;
                (StepStatus::Finished.as_str(), Some(encode(&text.to_value())), None)
            }
            StepOutcome::Failed(text) => {
                check_len("step error", text.len(), max)?;
                (StepStatus::Failed.as_str(), None, Some(encode(&text.to_value())))
            }
        })
    }

    /// Inserts `steps` as intents, all or none; with `first_done`, the first is inserted
    /// already finished with those columns at that time.
    async fn append_rows(
        &self,
        run_id: &str,
        fence: Option<u64>,
        steps: &[NewStep],
        first_done: Option<(OutcomeColumns, i64)>,
    ) -> Result<Vec<u64>, StoreError> {
        let fence = fence_param(fence)?;
        let count = i64::try_from(steps.len()).map_err(|_| StoreError::LimitExceeded("too many steps".into()))?;
        let keys: Vec<&str> = steps.iter().map(|s| s.key.as_str()).collect();
        let kinds: Vec<&str> = steps.iter().map(|s| s.kind.as_str()).collect();
        let names: Vec<&str> = steps.iter().map(|s| s.name.as_str()).collect();
        let epochs = steps.iter().map(|s| to_i64("step epoch", s.epoch)).collect::<Result<Vec<_>, _>>()?;
        let started: Vec<i64> = steps.iter().map(|s| s.started_at_ms).collect();
        retrying(|| async {
            let client = self.client().await?;
            let sql = &self.inner.sql;
            let stmt = match &first_done {
                None => client.prepare_cached(&sql.append_steps).await,
                Some(_) => client.prepare_cached(&sql.append_finished).await,
            }
            .map_err(Fail::write)?;
            type Param<'p> = &'p (dyn tokio_postgres::types::ToSql + Sync);
            let mut params: Vec<Param<'_>> = vec![&run_id, &fence, &count, &keys, &kinds, &names, &epochs, &started];
            if let Some(((status, result, error), finished_at_ms)) = &first_done {
                params.extend::<[Param<'_>; 4]>([status, result, error, finished_at_ms]);
            }
            let row = match client.query_one(&stmt, &params).await {
                Ok(row) => row,
                Err(e) if e.as_db_error().and_then(|db| db.constraint()) == Some(KEY_CONSTRAINT) => {
                    // The statement rolled back whole: no row, no ordinal. Name the first key of
                    // the call that is already journaled or repeated within the call.
                    let stmt = client.prepare_cached(&self.inner.sql.existing_keys).await.map_err(Fail::read)?;
                    let rows = client.query(&stmt, &[&run_id, &keys]).await.map_err(Fail::read)?;
                    let mut seen: HashSet<String> = rows.iter().map(|row| get(row, 0)).collect::<Result<_, _>>()?;
                    let key = keys.iter().find(|key| !seen.insert((**key).to_owned())).copied().unwrap_or_default();
                    return Err(StoreError::DuplicateKey { run_id: run_id.to_owned(), key: key.to_owned() }.into());
                }
                Err(e) => return Err(Fail::write(e)),
            };
            let allowed: bool = get(&row, 0)?;
            if !allowed {
                return Err(fenced(run_id, fence).into());
            }
            let Some(first) = get::<Option<i64>>(&row, 1)? else {
                return Err(StoreError::RunNotFound(run_id.to_owned()).into());
            };
            let inserted: i64 = get(&row, 2)?;
            if inserted != count {
                let message = format!("run `{run_id}`: {inserted} of {count} intents were stored");
                return Err(StoreError::Corrupt(message.into()).into());
            }
            let ordinals = (first..first + count)
                .map(|ordinal| to_u64("kuralle_runs.next_ordinal", ordinal))
                .collect::<Result<_, _>>()?;
            Ok(ordinals)
        })
        .await
    }

    pub(super) async fn finish_fenced(
        &self,
        run_id: &str,
        fence: Option<u64>,
        ordinal: u64,
        outcome: &StepOutcome,
        finished_at_ms: i64,
    ) -> Result<(), StoreError> {
        let fence = fence_param(fence)?;
        let (status, result, error) = self.outcome_columns(outcome)?;
        // An ordinal beyond `bigint` names no step.
        let stored_ordinal = i64::try_from(ordinal).unwrap_or(-1);
        retrying(|| async {
            let client = self.client().await?;
            let stmt = client.prepare_cached(&self.inner.sql.finish_step).await.map_err(Fail::write)?;
            let params: [&(dyn tokio_postgres::types::ToSql + Sync); 7] =
                [&run_id, &fence, &stored_ordinal, &status, &result, &error, &finished_at_ms];
            let row = client.query_one(&stmt, &params).await.map_err(Fail::write)?;
            let (allowed, updated, run_exists): (bool, bool, bool) = (get(&row, 0)?, get(&row, 1)?, get(&row, 2)?);
            match (allowed, updated, run_exists) {
                (false, _, _) => Err(fenced(run_id, fence).into()),
                (true, true, _) => Ok(()),
                (true, false, false) => Err(StoreError::RunNotFound(run_id.to_owned()).into()),
                (true, false, true) => Err(StoreError::StepNotRunning { run_id: run_id.to_owned(), ordinal }.into()),
            }
        })
        .await
    }

    pub(super) async fn step_rows(&self, run_id: &str) -> Result<Vec<StepRecord>, StoreError> {
        retrying(|| async {
            let client = self.client().await?;
            let stmt = client.prepare_cached(&self.inner.sql.steps).await.map_err(Fail::read)?;
            let rows = client.query(&stmt, &[&run_id]).await.map_err(Fail::read)?;
            Ok(rows.iter().map(step_from_row).collect::<Result<_, _>>()?)
        })
        .await
    }
}

fn step_from_row(row: &tokio_postgres::Row) -> Result<StepRecord, StoreError> {
    let kind: String = get(row, 2)?;
    let status: String = get(row, 5)?;
    Ok(StepRecord {
        ordinal: to_u64("kuralle_steps.ordinal", get(row, 0)?)?,
        key: get(row, 1)?,
        kind: StepKind::parse(&kind)
            .ok_or_else(|| StoreError::Corrupt(format!("unknown step kind `{kind}`").into()))?,
        name: get(row, 3)?,
        epoch: to_u64("kuralle_steps.epoch", get(row, 4)?)?,
        status: StepStatus::parse(&status)
            .ok_or_else(|| StoreError::Corrupt(format!("unknown step status `{status}`").into()))?,
        result: get::<Option<serde_json::Value>>(row, 6)?
            .map(|v| decode("kuralle_steps.result", v).map(JsonText::from))
            .transpose()?,
        error: get::<Option<serde_json::Value>>(row, 7)?
            .map(|v| decode("kuralle_steps.error", v).map(JsonText::from))
            .transpose()?,
        started_at_ms: get(row, 8)?,
        finished_at_ms: get(row, 9)?,
    })
}
