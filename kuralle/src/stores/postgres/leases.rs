//! Leases: one row per run with the current holder, its fencing token and an expiry by the
//! database's clock (`clock_timestamp()`), so that clients with skewed clocks agree.

use std::time::Duration;

use super::PostgresStore;
use tokio_postgres::{Row, types::ToSql};

use super::codec::{encode, to_i64, to_u64, ttl_ms};
use super::errors::{Fail, retrying};
use super::runs::get;
use crate::store::{Lease, RunRecord, StoreError};
use crate::stores::check_len;

/// How often acquiring retries when the holder it was refused by let go in the meantime.
const ACQUIRE_ATTEMPTS: usize = 8;

impl PostgresStore {
    pub(super) async fn acquire(&self, run_id: &str, owner: &str, ttl: Duration) -> Result<Lease, StoreError> {
        Ok(self.acquire_by(run_id, owner, ttl, &self.inner.sql.acquire_lease, &[]).await?.0)
    }

    /// [`RunStore::acquire_lease_and_create_run`](crate::RunStore::acquire_lease_and_create_run)
    /// in one statement when the run is not there (the lease taken, the run created under it);
    /// when it is, a read of it follows.
    pub(super) async fn acquire_creating(
        &self,
        new: &RunRecord,
        owner: &str,
        ttl: Duration,
    ) -> Result<(Lease, Option<RunRecord>), StoreError> {
        // Refused before the lease is taken: a run too large to store.
        check_len("run state", new.state.len(), self.inner.options.max_value_bytes)?;
        let (epoch, version) = (to_i64("run epoch", new.epoch)?, to_i64("run version", new.version)?);
        let state = encode(&new.state.to_value());
        let status = new.status.as_str();
        let run: [&(dyn ToSql + Sync); 7] =
            [&new.agent_id, &status, &epoch, &version, &state, &new.created_at_ms, &new.updated_at_ms];
        let sql = &self.inner.sql.acquire_lease_create;
        let (lease, row) = self.acquire_by(&new.run_id, owner, ttl, sql, &run).await?;
        if get::<bool>(&row, 2)? {
            return Ok((lease, None));
        }
        let read = match self.get_run_row(&new.run_id).await {
            // Deleted since the statement met it (an operator's `delete_run`): created now,
            // under the lease, as the statement would have.
            Ok(None) => self.create_run_fenced(new, Some(lease.token)).await.map(|()| None),
            read => read,
        };
        crate::store::read_under(self, lease, read).await
    }

    /// Takes run `run_id`'s lease with `sql` (the acquire statement, or one that does more
    /// under the lease it takes, with `extra` as its parameters from `$4` on); returns the lease
    /// and the statement's row.
    async fn acquire_by(
        &self,
        run_id: &str,
        owner: &str,
        ttl: Duration,
        sql: &str,
        extra: &[&(dyn ToSql + Sync)],
    ) -> Result<(Lease, Row), StoreError> {
        let ttl = ttl_ms(ttl);
        retrying(|| async {
            let client = self.client().await?;
            let acquire = client.prepare_cached(sql).await.map_err(Fail::write)?;
            let holder = client.prepare_cached(&self.inner.sql.lease_holder).await.map_err(Fail::read)?;
            let mut params: Vec<&(dyn ToSql + Sync)> = vec![&run_id, &owner, &ttl];
            params.extend_from_slice(extra);
            for _ in 0..ACQUIRE_ATTEMPTS {
                // One statement: the row lock makes concurrent acquirers take turns, and each
                // re-checks "released or expired" against the row as the previous one left it.
                if let Some(row) = client.query_opt(&acquire, &params).await.map_err(Fail::write)? {
                    let lease = Lease {
                        run_id: run_id.to_owned(),
                        owner: owner.to_owned(),
                        token: to_u64("kuralle_leases.token", get(&row, 0)?)?,
                        expires_at_ms: get(&row, 1)?,
                    };
                    return Ok((lease, row));
                }
                if let Some(row) = client.query_opt(&holder, &[&run_id]).await.map_err(Fail::read)? {
                    let free: bool = get(&row, 2)?;
                    if !free {
                        return Err(StoreError::LeaseHeld {
                            run_id: run_id.to_owned(),
                            owner: get(&row, 0)?,
                            expires_at_ms: get(&row, 1)?,
                        }
                        .into());
                    }
                }
                // Released or expired between the two statements: try again.
            }
            Err(StoreError::Unavailable(format!("the lease of run `{run_id}` kept changing hands; try again").into())
                .into())
        })
        .await
    }

    pub(super) async fn renew(&self, lease: &Lease, ttl: Duration) -> Result<Lease, StoreError> {
        let token = to_i64("lease token", lease.token)?;
        let ttl = ttl_ms(ttl);
        retrying(|| async {
            let client = self.client().await?;
            let stmt = client.prepare_cached(&self.inner.sql.renew_lease).await.map_err(Fail::write)?;
            match client.query_opt(&stmt, &[&lease.run_id, &token, &ttl]).await.map_err(Fail::write)? {
                Some(row) => Ok(Lease { expires_at_ms: get(&row, 0)?, ..lease.clone() }),
                None => Err(StoreError::Fenced { run_id: lease.run_id.clone(), token: lease.token }.into()),
            }
        })
        .await
    }

    /// Renews `leases` in one statement (one round trip, one commit); each lease's own outcome
    /// at its index.
    pub(super) async fn renew_many(
        &self,
        leases: &[Lease],
        ttl: Duration,
    ) -> Result<Vec<Result<Lease, StoreError>>, StoreError> {
        let fenced = |lease: &Lease| StoreError::Fenced { run_id: lease.run_id.clone(), token: lease.token };
        // A token beyond `bigint` names no lease: fenced without asking.
        let tokens: Vec<Option<i64>> = leases.iter().map(|l| i64::try_from(l.token).ok()).collect();
        let (run_ids, sent): (Vec<&str>, Vec<i64>) =
            leases.iter().zip(&tokens).filter_map(|(l, t)| Some((l.run_id.as_str(), (*t)?))).unzip();
        let ttl = ttl_ms(ttl);
        let rows = retrying(|| async {
            let client = self.client().await?;
            let stmt = client.prepare_cached(&self.inner.sql.renew_leases).await.map_err(Fail::write)?;
            client.query(&stmt, &[&run_ids, &sent, &ttl]).await.map_err(Fail::write)
        })
        .await?;
        let mut expiries = std::collections::HashMap::with_capacity(rows.len());
        for row in &rows {
            let (run_id, token, expires_at_ms): (String, i64, i64) = (get(row, 0)?, get(row, 1)?, get(row, 2)?);
            expiries.insert((run_id, token), expires_at_ms);
        }
        Ok(leases
            .iter()
            .zip(tokens)
            .map(|(lease, token)| {
                token
                    .and_then(|t| expiries.get(&(lease.run_id.clone(), t)))
                    .map(|&expires_at_ms| Lease { expires_at_ms, ..lease.clone() })
                    .ok_or_else(|| fenced(lease))
            })
            .collect())
    }

    pub(super) async fn release(&self, lease: &Lease) -> Result<(), StoreError> {
        let token = to_i64("lease token", lease.token)?;
        retrying(|| async {
            let client = self.client().await?;
            let stmt = client.prepare_cached(&self.inner.sql.release_lease).await.map_err(Fail::write)?;
            match client.query_opt(&stmt, &[&lease.run_id, &token]).await.map_err(Fail::write)? {
                Some(_) => Ok(()),
                None => Err(StoreError::Fenced { run_id: lease.run_id.clone(), token: lease.token }.into()),
            }
        })
        .await
    }

    pub(super) async fn current(&self, run_id: &str) -> Result<Option<Lease>, StoreError> {
        retrying(|| async {
            let client = self.client().await?;
            let stmt = client.prepare_cached(&self.inner.sql.current_lease).await.map_err(Fail::read)?;
            let row = client.query_opt(&stmt, &[&run_id]).await.map_err(Fail::read)?;
            let lease = row
                .map(|row| {
                    Ok::<_, StoreError>(Lease {
                        run_id: run_id.to_owned(),
                        owner: get(&row, 0)?,
                        token: to_u64("kuralle_leases.token", get(&row, 1)?)?,
                        expires_at_ms: get(&row, 2)?,
                    })
                })
                .transpose()?;
            Ok(lease)
        })
        .await
    }
}
