//! The work queue: runnable runs are runs in status `running` whose lease is released or
//! expired (submitted and not yet claimed, handed back, or orphaned by a crashed worker).
//! Claiming grants the lease in the same statement, with `FOR UPDATE … SKIP LOCKED` so that
//! concurrent workers claim disjoint runs without waiting on each other.

use std::time::Duration;

use super::PostgresStore;
use super::codec::{to_u64, ttl_ms};
use super::errors::{Fail, retrying};
use super::runs::get;
use crate::store::{Lease, StoreError};

impl PostgresStore {
    pub(super) async fn claim(&self, owner: &str, ttl: Duration, limit: usize) -> Result<Vec<Lease>, StoreError> {
        let ttl = ttl_ms(ttl);
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        if limit == 0 {
            return Ok(Vec::new());
        }
        retrying(|| async {
            let client = self.client().await?;
            let leased = client.prepare_cached(&self.inner.sql.claim_leased).await.map_err(Fail::write)?;
            let rows = client.query(&leased, &[&owner, &ttl, &limit]).await.map_err(Fail::write)?;
            let mut leases = rows.iter().map(lease_from_row).collect::<Result<Vec<_>, _>>()?;
            let rest = limit - leases.len() as i64;
            if rest > 0 {
                let unleased = client.prepare_cached(&self.inner.sql.claim_unleased).await.map_err(Fail::write)?;
                let rows = client.query(&unleased, &[&owner, &ttl, &rest]).await.map_err(Fail::write)?;
                for row in &rows {
                    leases.push(lease_from_row(row)?);
                }
            }
            Ok(leases)
        })
        .await
    }
}

fn lease_from_row(row: &tokio_postgres::Row) -> Result<Lease, StoreError> {
    Ok(Lease {
        run_id: get(row, 0)?,
        owner: get(row, 1)?,
        token: to_u64("kuralle_leases.token", get(row, 2)?)?,
        expires_at_ms: get(row, 3)?,
    })
}
