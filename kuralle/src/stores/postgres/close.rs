//! A turn's close: the run's row written, its last step journaled at the next ordinal and its
//! lease released, all or none, alone or with other runs' closes in one statement (see
//! [`batch`](super::batch)).

use super::PostgresStore;
use super::batch::{Batched, Queue, Unsent};
use super::codec::{to_i64, to_u64};
use super::errors::{Fail, retrying};
use super::runs::{Put, fenced, get, not_written};
use super::steps::{KEY_CONSTRAINT, OutcomeColumns};
use crate::store::{FinishedStep, RunRecord, StoreError};

impl PostgresStore {
    /// `run` written and its lease of token `fence` released, after `last` appended finished
    /// at the run's next ordinal, in one statement (one commit) shared with other runs' closes
    /// waiting at the same time. Returns the run's new version and whether the lease was
    /// released.
    pub(super) async fn put_run_release_after(
        &self,
        last: FinishedStep,
        run: RunRecord,
        fence: u64,
    ) -> Result<(u64, bool), StoreError> {
        self.batched(Close::new(self, last, run, fence)?).await
    }
}

/// A run's close waiting to be written.
pub(super) struct Close {
    run_id: String,
    fence: i64,
    agent_id: String,
    put: Put,
    /// The version the write compares, as the run's record holds it.
    version: u64,
    updated_at_ms: i64,
    key: String,
    kind: &'static str,
    name: String,
    step_epoch: i64,
    outcome: OutcomeColumns,
    started_at_ms: i64,
    finished_at_ms: i64,
    bytes: usize,
}

impl Close {
    fn new(store: &PostgresStore, last: FinishedStep, run: RunRecord, fence: u64) -> Result<Self, StoreError> {
        let fence = to_i64("lease token", fence)?;
        let put = store.put_of(&run)?;
        let outcome = store.outcome_columns(&last.outcome)?;
        let FinishedStep { step, outcome: text, finished_at_ms } = last;
        let bytes = run.run_id.len()
            + run.agent_id.len()
            + run.state.len()
            + text.text().len()
            + step.key.len()
            + step.name.len()
            + 64;
        Ok(Self {
            fence,
            put,
            version: run.version,
            updated_at_ms: run.updated_at_ms,
            kind: step.kind.as_str(),
            step_epoch: to_i64("step epoch", step.epoch)?,
            started_at_ms: step.started_at_ms,
            key: step.key,
            name: step.name,
            outcome,
            finished_at_ms,
            bytes,
            run_id: run.run_id,
            agent_id: run.agent_id,
        })
    }

    /// What the statement's answer gives this write (whether its fence let it through,
    /// whether the run was written, whether the lease was released, whether the step was
    /// stored): the new version and whether the lease was released, `None` when the run was
    /// not written (see [`not_written`] for why), or the error.
    fn outcome(
        &self,
        allowed: bool,
        updated: bool,
        released: bool,
        stored: bool,
    ) -> Result<Option<(u64, bool)>, StoreError> {
        if !allowed {
            return Err(fenced(&self.run_id, Some(self.fence)));
        }
        if !updated {
            return Ok(None);
        }
        if !stored {
            let message = format!("run `{}`: its closing step was not stored", self.run_id);
            return Err(StoreError::Corrupt(message.into()));
        }
        Ok(Some((to_u64("kuralle_runs.version", self.put.next)?, released)))
    }
}

impl Batched for Close {
    type Output = (u64, bool);

    fn key(&self) -> (&str, Option<u64>) {
        (&self.run_id, None)
    }

    fn bytes(&self) -> usize {
        self.bytes
    }

    fn queue(store: &PostgresStore) -> &Queue<Self> {
        &store.inner.closes
    }

    async fn send_alone(store: &PostgresStore, write: &Self) -> Result<(u64, bool), StoreError> {
        let Put { epoch, expected, next, state, status } = &write.put;
        let (step_status, result, error) = &write.outcome;
        retrying(|| async {
            let client = store.client().await?;
            let stmt = client.prepare_cached(&store.inner.sql.put_run_release_after).await.map_err(Fail::write)?;
            let params: [&(dyn tokio_postgres::types::ToSql + Sync); 18] = [
                &write.run_id,
                &write.fence,
                &write.agent_id,
                status,
                epoch,
                next,
                state,
                &write.updated_at_ms,
                expected,
                &write.key,
                &write.kind,
                &write.name,
                &write.step_epoch,
                step_status,
                result,
                error,
                &write.started_at_ms,
                &write.finished_at_ms,
            ];
            let row = match client.query_one(&stmt, &params).await {
                Ok(row) => row,
                // The statement rolled back whole: the run is as it was.
                Err(e) if e.as_db_error().and_then(|db| db.constraint()) == Some(KEY_CONSTRAINT) => {
                    let key = write.key.clone();
                    return Err(StoreError::DuplicateKey { run_id: write.run_id.clone(), key }.into());
                }
                Err(e) => return Err(Fail::write(e)),
            };
            match write.outcome(get(&row, 0)?, get(&row, 1)?, get(&row, 2)?, get(&row, 3)?)? {
                Some(written) => Ok(written),
                None => Err(store.refused(&client, &write.run_id, write.version).await),
            }
        })
        .await
    }

    async fn send(store: &PostgresStore, batch: &[Self]) -> Result<Vec<Result<(u64, bool), StoreError>>, Unsent> {
        let run_ids: Vec<&str> = batch.iter().map(|c| c.run_id.as_str()).collect();
        let tokens: Vec<i64> = batch.iter().map(|c| c.fence).collect();
        let agents: Vec<&str> = batch.iter().map(|c| c.agent_id.as_str()).collect();
        let statuses: Vec<&str> = batch.iter().map(|c| c.put.status).collect();
        let epochs: Vec<i64> = batch.iter().map(|c| c.put.epoch).collect();
        let versions: Vec<i64> = batch.iter().map(|c| c.put.next).collect();
        let states: Vec<&serde_json::Value> = batch.iter().map(|c| &c.put.state).collect();
        let updated: Vec<i64> = batch.iter().map(|c| c.updated_at_ms).collect();
        let expected: Vec<i64> = batch.iter().map(|c| c.put.expected).collect();
        let keys: Vec<&str> = batch.iter().map(|c| c.key.as_str()).collect();
        let kinds: Vec<&str> = batch.iter().map(|c| c.kind).collect();
        let names: Vec<&str> = batch.iter().map(|c| c.name.as_str()).collect();
        let step_epochs: Vec<i64> = batch.iter().map(|c| c.step_epoch).collect();
        let step_statuses: Vec<&str> = batch.iter().map(|c| c.outcome.0).collect();
        let results: Vec<Option<&serde_json::Value>> = batch.iter().map(|c| c.outcome.1.as_ref()).collect();
        let errors: Vec<Option<&serde_json::Value>> = batch.iter().map(|c| c.outcome.2.as_ref()).collect();
        let started: Vec<i64> = batch.iter().map(|c| c.started_at_ms).collect();
        let finished: Vec<i64> = batch.iter().map(|c| c.finished_at_ms).collect();
        let params: [&(dyn tokio_postgres::types::ToSql + Sync); 18] = [
            &run_ids,
            &tokens,
            &agents,
            &statuses,
            &epochs,
            &versions,
            &states,
            &updated,
            &expected,
            &keys,
            &kinds,
            &names,
            &step_epochs,
            &step_statuses,
            &results,
            &errors,
            &started,
            &finished,
        ];
        let rows = store.query_batch(&store.inner.sql.close_many, &params, batch.len()).await?;
        let mut outcomes = Vec::with_capacity(batch.len());
        for (row, write) in rows.iter().zip(batch) {
            outcomes.push(write.outcome(get(row, 0)?, get(row, 1)?, get(row, 2)?, get(row, 3)?));
        }
        // Rare (the runtime closes only a run whose version it holds): why, read once for all
        // of them; the closes that landed wait for that one read (not one a refused close).
        let refused: Vec<&str> = outcomes
            .iter()
            .zip(batch)
            .filter(|(outcome, _)| matches!(outcome, Ok(None)))
            .map(|(_, write)| write.run_id.as_str())
            .collect();
        let versions = if refused.is_empty() { Ok(Default::default()) } else { store.run_versions(&refused).await };
        let outcomes = outcomes.into_iter().zip(batch).map(|(outcome, write)| match outcome {
            Ok(Some(written)) => Ok(written),
            Ok(None) => match &versions {
                Ok(versions) => Err(not_written(&write.run_id, write.version, versions.get(&write.run_id).copied())),
                Err(error) => Err(error.clone()),
            },
            Err(error) => Err(error),
        });
        Ok(outcomes.collect())
    }
}
