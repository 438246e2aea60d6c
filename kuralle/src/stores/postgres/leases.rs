//! Leases: one row per run with the current holder, its fencing token and an expiry by the
//! database's clock (`clock_timestamp()`), so that clients with skewed clocks agree.

use std::time::Duration;

use super::PostgresStore;
use super::codec::{to_i64, to_u64, ttl_ms};
use super::errors::{Fail, retrying};
use super::runs::get;
use crate::store::{Lease, StoreError};

/// How often acquiring retries when the holder it was refused by let go in the meantime.
const ACQUIRE_ATTEMPTS: usize = 8;

impl PostgresStore {
    pub(super) async fn acquire(&self, run_id: &str, owner: &str, ttl: Duration) -> Result<Lease, StoreError> {
        let ttl = ttl_ms(ttl);
        retrying(|| async {
            let client = self.client().await?;
            let acquire = client.prepare_cached(&self.inner.sql.acquire_lease).await.map_err(Fail::write)?;
            let holder = client.prepare_cached(&self.inner.sql.lease_holder).await.map_err(Fail::read)?;
            for _ in 0..ACQUIRE_ATTEMPTS {
                // One statement: the row lock makes concurrent acquirers take turns, and each
                // re-checks "released or expired" against the row as the previous one left it.
                if let Some(row) = client.query_opt(&acquire, &[&run_id, &owner, &ttl]).await.map_err(Fail::write)? {
                    return Ok(Lease {
                        run_id: run_id.to_owned(),
                        owner: owner.to_owned(),
                        token: to_u64("kuralle_leases.token", get(&row, 0)?)?,
                        expires_at_ms: get(&row, 1)?,
                    });
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
