//! The journal: atomic ordinal reservation with intents, outcomes, reads.

use std::collections::HashSet;

use super::PostgresStore;
use super::batch::{Batched, Queue, Unsent};
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
    /// Intents, sent with other runs' appends waiting at the same time (see
    /// [`batch`](super::batch)).
    pub(super) async fn append_fenced(
        &self,
        run_id: &str,
        fence: Option<u64>,
        steps: Vec<NewStep>,
    ) -> Result<Vec<u64>, StoreError> {
        self.batched(Append::new(run_id, fence, steps, None, 0)?).await
    }

    /// Appends `finished`, already finished with `outcome` at `finished_at_ms`, then the
    /// intents, all or none (one commit, shared with other runs' appends waiting at the same
    /// time).
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
        self.batched(Append::new(run_id, fence, steps, Some((first, finished_at_ms)), outcome.text().len())?).await
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

    /// `write` alone, in a statement of its own: after a batch met a key already journaled, this
    /// tells which write holds it, and which key.
    async fn append_alone(&self, write: &Append) -> Result<Vec<u64>, StoreError> {
        let Append { run_id, fence, steps, epochs, first_done, .. } = write;
        let (run_id, fence, count) = (run_id.as_str(), *fence, write.count());
        let keys: Vec<&str> = steps.iter().map(|s| s.key.as_str()).collect();
        let kinds: Vec<&str> = steps.iter().map(|s| s.kind.as_str()).collect();
        let names: Vec<&str> = steps.iter().map(|s| s.name.as_str()).collect();
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
            let mut params: Vec<Param<'_>> = vec![&run_id, &fence, &count, &keys, &kinds, &names, epochs, &started];
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
            Ok(write.ordinals(get(&row, 0)?, get(&row, 1)?, get(&row, 2)?)?)
        })
        .await
    }

    /// A call's outcome, sent with other runs' outcomes waiting at the same time (see
    /// [`batch`](super::batch)).
    pub(super) async fn finish_fenced(
        &self,
        run_id: &str,
        fence: Option<u64>,
        ordinal: u64,
        outcome: &StepOutcome,
        finished_at_ms: i64,
    ) -> Result<(), StoreError> {
        let fence = fence_param(fence)?;
        let columns = self.outcome_columns(outcome)?;
        let bytes = run_id.len() + outcome.text().len();
        self.batched(Finish { run_id: run_id.to_owned(), fence, ordinal, columns, finished_at_ms, bytes }).await
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

/// A step's outcome waiting to be written.
pub(super) struct Finish {
    run_id: String,
    fence: Option<i64>,
    ordinal: u64,
    columns: OutcomeColumns,
    finished_at_ms: i64,
    bytes: usize,
}

impl Finish {
    /// The outcome the statement's answer gives this write: whether its fence let it through,
    /// whether its step was updated, whether its run exists.
    fn outcome(&self, allowed: bool, updated: bool, run_exists: bool) -> Result<(), StoreError> {
        let run_id = &self.run_id;
        match (allowed, updated, run_exists) {
            (false, _, _) => Err(fenced(run_id, self.fence)),
            (true, true, _) => Ok(()),
            (true, false, false) => Err(StoreError::RunNotFound(run_id.clone())),
            (true, false, true) => Err(StoreError::StepNotRunning { run_id: run_id.clone(), ordinal: self.ordinal }),
        }
    }

    /// The ordinal as a parameter: one beyond `bigint` names no step.
    fn stored_ordinal(&self) -> i64 {
        i64::try_from(self.ordinal).unwrap_or(-1)
    }
}

impl Batched for Finish {
    type Output = ();

    fn key(&self) -> (&str, Option<u64>) {
        (&self.run_id, Some(self.ordinal))
    }

    fn bytes(&self) -> usize {
        self.bytes
    }

    async fn send_alone(store: &PostgresStore, write: &Self) -> Result<(), StoreError> {
        let (run_id, ordinal) = (write.run_id.as_str(), write.stored_ordinal());
        let (status, result, error) = &write.columns;
        retrying(|| async {
            let client = store.client().await?;
            let stmt = client.prepare_cached(&store.inner.sql.finish_step).await.map_err(Fail::write)?;
            let params: [&(dyn tokio_postgres::types::ToSql + Sync); 7] =
                [&run_id, &write.fence, &ordinal, status, result, error, &write.finished_at_ms];
            let row = client.query_one(&stmt, &params).await.map_err(Fail::write)?;
            Ok(write.outcome(get(&row, 0)?, get(&row, 1)?, get(&row, 2)?)?)
        })
        .await
    }

    fn queue(store: &PostgresStore) -> &Queue<Self> {
        &store.inner.finishes
    }

    async fn send(store: &PostgresStore, batch: &[Self]) -> Result<Vec<Result<(), StoreError>>, Unsent> {
        let run_ids: Vec<&str> = batch.iter().map(|f| f.run_id.as_str()).collect();
        let tokens: Vec<Option<i64>> = batch.iter().map(|f| f.fence).collect();
        let ordinals: Vec<i64> = batch.iter().map(Finish::stored_ordinal).collect();
        let statuses: Vec<&str> = batch.iter().map(|f| f.columns.0).collect();
        let results: Vec<Option<&serde_json::Value>> = batch.iter().map(|f| f.columns.1.as_ref()).collect();
        let errors: Vec<Option<&serde_json::Value>> = batch.iter().map(|f| f.columns.2.as_ref()).collect();
        let finished: Vec<i64> = batch.iter().map(|f| f.finished_at_ms).collect();
        let params: [&(dyn tokio_postgres::types::ToSql + Sync); 7] =
            [&run_ids, &tokens, &ordinals, &statuses, &results, &errors, &finished];
        let rows = store.query_batch(&store.inner.sql.finish_steps, &params, batch.len()).await?;
        let outcomes =
            rows.iter().zip(batch).map(|(row, write)| Ok(write.outcome(get(row, 0)?, get(row, 1)?, get(row, 2)?)));
        Ok(outcomes.collect::<Result<_, StoreError>>()?)
    }
}

/// Steps waiting to be appended to a run's journal, the first already finished if
/// `first_done` says how.
pub(super) struct Append {
    run_id: String,
    fence: Option<i64>,
    steps: Vec<NewStep>,
    epochs: Vec<i64>,
    first_done: Option<(OutcomeColumns, i64)>,
    bytes: usize,
}

impl Append {
    /// `outcome_bytes`: the length of the first step's outcome's text, if it has one.
    fn new(
        run_id: &str,
        fence: Option<u64>,
        steps: Vec<NewStep>,
        first_done: Option<(OutcomeColumns, i64)>,
        outcome_bytes: usize,
    ) -> Result<Self, StoreError> {
        let fence = fence_param(fence)?;
        i64::try_from(steps.len()).map_err(|_| StoreError::LimitExceeded("too many steps".into()))?;
        let epochs = steps.iter().map(|s| to_i64("step epoch", s.epoch)).collect::<Result<Vec<_>, _>>()?;
        let bytes = run_id.len() + outcome_bytes + steps.iter().map(|s| s.key.len() + s.name.len() + 32).sum::<usize>();
        Ok(Self { run_id: run_id.to_owned(), fence, steps, epochs, first_done, bytes })
    }

    fn count(&self) -> i64 {
        // Checked in `new`.
        self.steps.len() as i64
    }

    /// The ordinals the statement's answer gives this write (whether its fence let it through,
    /// the first ordinal it reserved, how many rows it inserted), or why it has none.
    fn ordinals(&self, allowed: bool, first: Option<i64>, inserted: i64) -> Result<Vec<u64>, StoreError> {
        let (run_id, count) = (&self.run_id, self.count());
        if !allowed {
            return Err(fenced(run_id, self.fence));
        }
        let Some(first) = first else {
            return Err(StoreError::RunNotFound(run_id.clone()));
        };
        if inserted != count {
            let message = format!("run `{run_id}`: {inserted} of {count} intents were stored");
            return Err(StoreError::Corrupt(message.into()));
        }
        (first..first + count).map(|ordinal| to_u64("kuralle_runs.next_ordinal", ordinal)).collect()
    }
}

impl Batched for Append {
    type Output = Vec<u64>;

    fn key(&self) -> (&str, Option<u64>) {
        (&self.run_id, None)
    }

    fn bytes(&self) -> usize {
        self.bytes
    }

    async fn send_alone(store: &PostgresStore, write: &Self) -> Result<Vec<u64>, StoreError> {
        store.append_alone(write).await
    }

    fn queue(store: &PostgresStore) -> &Queue<Self> {
        &store.inner.appends
    }

    async fn send(store: &PostgresStore, batch: &[Self]) -> Result<Vec<Result<Vec<u64>, StoreError>>, Unsent> {
        let writes: Vec<&Append> = batch.iter().collect();
        match store.append_many(&writes).await {
            Err(Unsent::Clash) => Ok(store.append_apart(&writes).await),
            sent => sent,
        }
    }
}

impl PostgresStore {
    /// `batch` in one statement: one outcome per write, or why there is none ([`Unsent::Clash`]
    /// if a write holds a key its run already journaled).
    async fn append_many(&self, batch: &[&Append]) -> Result<Vec<Result<Vec<u64>, StoreError>>, Unsent> {
        let run_ids: Vec<&str> = batch.iter().map(|a| a.run_id.as_str()).collect();
        let tokens: Vec<Option<i64>> = batch.iter().map(|a| a.fence).collect();
        let counts: Vec<i64> = batch.iter().map(|a| a.count()).collect();
        let statuses: Vec<Option<&str>> =
            batch.iter().map(|a| a.first_done.as_ref().map(|((status, _, _), _)| *status)).collect();
        let results: Vec<Option<&serde_json::Value>> =
            batch.iter().map(|a| a.first_done.as_ref().and_then(|((_, result, _), _)| result.as_ref())).collect();
        let errors: Vec<Option<&serde_json::Value>> =
            batch.iter().map(|a| a.first_done.as_ref().and_then(|((_, _, error), _)| error.as_ref())).collect();
        let finished: Vec<Option<i64>> = batch.iter().map(|a| a.first_done.as_ref().map(|(_, at)| *at)).collect();
        // The steps of every write, flattened: `writes` and `positions` (both from 1) say whose
        // and which.
        let rows = batch.iter().map(|a| a.steps.len()).sum();
        let (mut writes, mut positions) = (Vec::<i64>::with_capacity(rows), Vec::<i64>::with_capacity(rows));
        let (mut keys, mut kinds, mut names) =
            (Vec::with_capacity(rows), Vec::with_capacity(rows), Vec::with_capacity(rows));
        let (mut epochs, mut started) = (Vec::<i64>::with_capacity(rows), Vec::<i64>::with_capacity(rows));
        for (write, a) in (1..).zip(batch) {
            for ((position, step), epoch) in (1..).zip(&a.steps).zip(&a.epochs) {
                writes.push(write);
                positions.push(position);
                keys.push(step.key.as_str());
                kinds.push(step.kind.as_str());
                names.push(step.name.as_str());
                epochs.push(*epoch);
                started.push(step.started_at_ms);
            }
        }
        let params: [&(dyn tokio_postgres::types::ToSql + Sync); 14] = [
            &run_ids, &tokens, &counts, &statuses, &results, &errors, &finished, &writes, &positions, &keys, &kinds,
            &names, &epochs, &started,
        ];
        let rows = self.query_batch(&self.inner.sql.append_many, &params, batch.len()).await?;
        let outcomes =
            rows.iter().zip(batch).map(|(row, write)| Ok(write.ordinals(get(row, 0)?, get(row, 1)?, get(row, 2)?)));
        Ok(outcomes.collect::<Result<_, StoreError>>()?)
    }

    /// After `batch` met a key already journaled: the writes holding such a key (or one key
    /// twice) go alone, each told which key; the others go as a batch again.
    async fn append_apart(&self, batch: &[&Append]) -> Vec<Result<Vec<u64>, StoreError>> {
        let journaled = match self.journaled_keys(batch).await {
            Ok(journaled) => journaled,
            Err(error) => return batch.iter().map(|_| Err(error.clone())).collect(),
        };
        let clashes = |write: &Append| {
            let mut own = HashSet::new();
            write
                .steps
                .iter()
                .any(|s| !own.insert(s.key.as_str()) || journaled.contains(&(write.run_id.as_str(), s.key.as_str())))
        };
        let (mut alone, again): (Vec<usize>, Vec<usize>) = (0..batch.len()).partition(|&i| clashes(batch[i]));
        if alone.is_empty() {
            // A clash no write shows (its key was deleted meanwhile): each alone, which ends it.
            return self.send_each(batch.iter().copied()).await;
        }
        let mut outcomes: Vec<Option<Result<Vec<u64>, StoreError>>> = batch.iter().map(|_| None).collect();
        let rest: Vec<&Append> = again.iter().map(|&i| batch[i]).collect();
        match self.append_many(&rest).await {
            Ok(sent) => again.iter().zip(sent).for_each(|(&i, outcome)| outcomes[i] = Some(outcome)),
            // It clashed again (another writer of a run), or the server refused a value in it:
            // those alone too.
            Err(Unsent::Clash | Unsent::Refused(_)) => alone.extend(&again),
            Err(Unsent::Failed(error)) => again.iter().for_each(|&i| outcomes[i] = Some(Err(error.clone()))),
        }
        let sent = self.send_each(alone.iter().map(|&i| batch[i])).await;
        for (i, outcome) in alone.into_iter().zip(sent) {
            outcomes[i] = Some(outcome);
        }
        outcomes.into_iter().map(|outcome| outcome.expect("every write was sent, alone or again")).collect()
    }

    /// The `(run, key)` pairs of `batch`'s steps that their runs already journaled.
    async fn journaled_keys<'b>(&self, batch: &[&'b Append]) -> Result<HashSet<(&'b str, &'b str)>, StoreError> {
        let pairs: HashSet<(&'b str, &'b str)> =
            batch.iter().flat_map(|a| a.steps.iter().map(|s| (a.run_id.as_str(), s.key.as_str()))).collect();
        let (runs, keys): (Vec<&str>, Vec<&str>) = pairs.iter().copied().unzip();
        let rows = retrying(|| async {
            let client = self.client().await?;
            let stmt = client.prepare_cached(&self.inner.sql.journaled_keys).await.map_err(Fail::read)?;
            client.query(&stmt, &[&runs, &keys]).await.map_err(Fail::read)
        })
        .await?;
        let mut journaled = HashSet::with_capacity(rows.len());
        for row in &rows {
            let (run_id, key): (String, String) = (get(row, 0)?, get(row, 1)?);
            // The pair as `batch` holds it, to borrow from there (few rows come back: the clashes).
            if let Some(&pair) = pairs.iter().find(|(r, k)| *r == run_id && *k == key) {
                journaled.insert(pair);
            }
        }
        Ok(journaled)
    }
}
