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
