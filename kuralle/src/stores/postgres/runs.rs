//! Run rows: create, read, compare-and-swap, list, delete.

use std::collections::HashMap;

use tokio_postgres::Row;

use super::PostgresStore;
use super::codec::{decode, encode, to_i64, to_u64};
use super::errors::{Fail, retrying};
use crate::store::StoreError;
use crate::store::{RunFilter, RunRecord, RunStatus, RunSummary};
use crate::stores::check_len;

impl PostgresStore {
    pub(super) async fn create_run_fenced(&self, run: &RunRecord, fence: Option<u64>) -> Result<(), StoreError> {
        let fence = fence_param(fence)?;
        let (epoch, version) = (to_i64("run epoch", run.epoch)?, to_i64("run version", run.version)?);
        check_len("run state", run.state.len(), self.inner.options.max_value_bytes)?;
        let state = encode(&run.state.to_value());
        let status = run.status.as_str();
        retrying(|| async {
            let client = self.client().await?;
            let stmt = client.prepare_cached(&self.inner.sql.create_run).await.map_err(Fail::write)?;
            let row = client
                .query_one(
                    &stmt,
                    &[
                        &run.run_id,
                        &fence,
                        &run.agent_id,
                        &status,
                        &epoch,
                        &version,
                        &state,
                        &run.created_at_ms,
                        &run.updated_at_ms,
                    ],
                )
                .await
                .map_err(Fail::write)?;
            let (allowed, inserted): (bool, bool) = (get(&row, 0)?, get(&row, 1)?);
            if !allowed {
                return Err(fenced(&run.run_id, fence).into());
            }
            if !inserted {
                return Err(StoreError::RunExists(run.run_id.clone()).into());
            }
            Ok(())
        })
        .await
    }

    pub(super) async fn get_run_row(&self, run_id: &str) -> Result<Option<RunRecord>, StoreError> {
        retrying(|| async {
            let client = self.client().await?;
            let stmt = client.prepare_cached(&self.inner.sql.get_run).await.map_err(Fail::read)?;
            let row = client.query_opt(&stmt, &[&run_id]).await.map_err(Fail::read)?;
            Ok(row.map(|row| run_from_row(&row)).transpose()?)
        })
        .await
    }

    pub(super) async fn put_run_fenced(&self, run: &RunRecord, fence: Option<u64>) -> Result<u64, StoreError> {
        Ok(self.put_run_statement(run, fence, false).await?.0)
    }

    /// `put_run_fenced`, and with `release` the lease of token `fence` released in the same
    /// statement once the run is written; returns the new version and whether it was released.
    pub(super) async fn put_run_statement(
        &self,
        run: &RunRecord,
        fence: Option<u64>,
        release: bool,
    ) -> Result<(u64, bool), StoreError> {
        let fence = fence_param(fence)?;
        let Put { epoch, expected, next, state, status } = self.put_of(run)?;
        retrying(|| async {
            let client = self.client().await?;
            let sql = if release { &self.inner.sql.put_run_release } else { &self.inner.sql.put_run };
            let stmt = client.prepare_cached(sql).await.map_err(Fail::write)?;
            let params: [&(dyn tokio_postgres::types::ToSql + Sync); 9] =
                [&run.run_id, &fence, &run.agent_id, &status, &epoch, &next, &state, &run.updated_at_ms, &expected];
            let row = client.query_one(&stmt, &params).await.map_err(Fail::write)?;
            let (allowed, updated): (bool, bool) = (get(&row, 0)?, get(&row, 1)?);
            if !allowed {
                return Err(fenced(&run.run_id, fence).into());
            }
            if updated {
                let released = release && get::<bool>(&row, 2)?;
                return Ok((to_u64("kuralle_runs.version", next)?, released));
            }
            Err(self.refused(&client, &run.run_id, run.version).await)
        })
        .await
    }

    /// `run`'s columns for a compare-and-swap write, its size checked.
    pub(super) fn put_of(&self, run: &RunRecord) -> Result<Put, StoreError> {
        let expected = to_i64("run version", run.version)?;
        let next = expected
            .checked_add(1)
            .ok_or_else(|| StoreError::LimitExceeded(format!("run `{}` version overflow", run.run_id).into()))?;
        check_len("run state", run.state.len(), self.inner.options.max_value_bytes)?;
        Ok(Put {
            epoch: to_i64("run epoch", run.epoch)?,
            expected,
            next,
            state: encode(&run.state.to_value()),
            status: run.status.as_str(),
        })
    }

    /// Why a fenced-in write of run `run_id` at version `expected` updated no row: the run is
    /// gone, or its version moved. Read anew: the statement's snapshot may predate the winning
    /// writer.
    pub(super) async fn refused(&self, client: &deadpool_postgres::Object, run_id: &str, expected: u64) -> Fail {
        let stmt = match client.prepare_cached(&self.inner.sql.run_version).await {
            Ok(stmt) => stmt,
            Err(e) => return Fail::read(e),
        };
        match client.query_opt(&stmt, &[&run_id]).await {
            Err(e) => Fail::read(e),
            Ok(None) => not_written(run_id, expected, None).into(),
            Ok(Some(row)) => match get::<i64>(&row, 0).and_then(|v| to_u64("kuralle_runs.version", v)) {
                Ok(actual) => not_written(run_id, expected, Some(actual)).into(),
                Err(e) => e.into(),
            },
        }
    }

    /// The versions of those of `run_ids` that exist (why fenced-in writes of them updated no
    /// row, as [`refused`](Self::refused) reads for one).
    pub(super) async fn run_versions(&self, run_ids: &[&str]) -> Result<HashMap<String, u64>, StoreError> {
        let rows = retrying(|| async {
            let client = self.client().await?;
            let stmt = client.prepare_cached(&self.inner.sql.run_versions).await.map_err(Fail::read)?;
            client.query(&stmt, &[&run_ids]).await.map_err(Fail::read)
        })
        .await?;
        rows.iter().map(|row| Ok((get(row, 0)?, to_u64("kuralle_runs.version", get(row, 1)?)?))).collect()
    }

    pub(super) async fn list_run_rows(&self, filter: &RunFilter) -> Result<Vec<RunSummary>, StoreError> {
        let status = filter.status.map(RunStatus::as_str);
        let limit = filter.limit.map(|limit| i64::try_from(limit).unwrap_or(i64::MAX));
        retrying(|| async {
            let client = self.client().await?;
            let stmt = client.prepare_cached(&self.inner.sql.list_runs).await.map_err(Fail::read)?;
            let rows = client.query(&stmt, &[&status, &limit]).await.map_err(Fail::read)?;
            let summaries = rows
                .iter()
                .map(|row| {
                    Ok(RunSummary {
                        run_id: get(row, 0)?,
                        agent_id: get(row, 1)?,
                        status: parse_status(&get::<String>(row, 2)?)?,
                        updated_at_ms: get(row, 3)?,
                    })
                })
                .collect::<Result<_, StoreError>>()?;
            Ok(summaries)
        })
        .await
    }

    pub(super) async fn cancel_run_row(&self, run_id: &str) -> Result<Option<RunStatus>, StoreError> {
        let now = crate::clock::now_ms();
        let (before, cancelled) = retrying(|| async {
            let client = self.client().await?;
            let stmt = client.prepare_cached(&self.inner.sql.cancel_run).await.map_err(Fail::write)?;
            let row = client.query_one(&stmt, &[&run_id, &now]).await.map_err(Fail::write)?;
            let before: Option<String> = get(&row, 0)?;
            let cancelled: bool = get(&row, 1)?;
            Ok((before.as_deref().map(parse_status).transpose()?, cancelled))
        })
        .await?;
        if cancelled || before.is_none() {
            return Ok(before);
        }
        // Not cancelled: either it had ended, or a writer ended it after the statement's
        // snapshot was taken; say what it is now.
        Ok(self.get_run_row(run_id).await?.map(|r| r.status))
    }

    pub(super) async fn delete_run_row(&self, run_id: &str) -> Result<bool, StoreError> {
        retrying(|| async {
            let mut client = self.client().await?;
            let tx = client.transaction().await.map_err(Fail::write)?;
            let run = tx.prepare_cached(&self.inner.sql.delete_run).await.map_err(Fail::write)?;
            let steps = tx.prepare_cached(&self.inner.sql.delete_steps).await.map_err(Fail::write)?;
            // The run's row first: deleting it waits for an in-flight journal write (which
            // updated that row), and a later one finds no row and inserts nothing. The journal
            // then, in a statement of its own, whose snapshot sees every step committed before.
            // The lease row stays, so a run created again under this id still gets higher
            // tokens.
            let deleted = tx.execute(&run, &[&run_id]).await.map_err(Fail::write)? > 0;
            tx.execute(&steps, &[&run_id]).await.map_err(Fail::write)?;
            tx.commit().await.map_err(Fail::write)?;
            Ok(deleted)
        })
        .await
    }
}

fn run_from_row(row: &Row) -> Result<RunRecord, StoreError> {
    Ok(RunRecord {
        run_id: get(row, 0)?,
        agent_id: get(row, 1)?,
        status: parse_status(&get::<String>(row, 2)?)?,
        epoch: to_u64("kuralle_runs.epoch", get(row, 3)?)?,
        version: to_u64("kuralle_runs.version", get(row, 4)?)?,
        state: crate::json::JsonText::from(decode("kuralle_runs.state", get(row, 5)?)?),
        created_at_ms: get(row, 6)?,
        updated_at_ms: get(row, 7)?,
    })
}

/// A run's columns as `put_run` and the closing write bind them: `expected` is the version the
/// write compares, `next` the one it writes.
pub(super) struct Put {
    pub epoch: i64,
    pub expected: i64,
    pub next: i64,
    pub state: serde_json::Value,
    pub status: &'static str,
}

/// Why a fenced-in write of run `run_id` at version `expected` updated no row, from the run's
/// `version` read after it: the run is gone, or its version moved.
pub(super) fn not_written(run_id: &str, expected: u64, version: Option<u64>) -> StoreError {
    match version {
        None => StoreError::RunNotFound(run_id.to_owned()),
        Some(actual) => StoreError::VersionConflict { run_id: run_id.to_owned(), expected, actual },
    }
}

/// Column `index` of `row`, typed.
pub(super) fn get<'a, T: tokio_postgres::types::FromSql<'a>>(row: &'a Row, index: usize) -> Result<T, StoreError> {
    row.try_get(index)
        .map_err(|e| StoreError::Corrupt(format!("unexpected column {index} in a kuralle row: {e}").into()))
}

/// The token as a statement parameter (`None`: an unfenced administrative write).
pub(super) fn fence_param(fence: Option<u64>) -> Result<Option<i64>, StoreError> {
    fence.map(|token| to_i64("lease token", token)).transpose()
}

pub(super) fn fenced(run_id: &str, fence: Option<i64>) -> StoreError {
    StoreError::Fenced { run_id: run_id.to_owned(), token: fence.and_then(|t| u64::try_from(t).ok()).unwrap_or(0) }
}

fn parse_status(text: &str) -> Result<RunStatus, StoreError> {
    RunStatus::parse(text).ok_or_else(|| StoreError::Corrupt(format!("unknown run status `{text}`").into()))
}
