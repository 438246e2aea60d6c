//! Proof of life for an instance id: a session advisory lock, held on a connection of its own
//! (not from the pool) for as long as the lock lives. The server drops a session's locks when
//! the session ends, so a process that died (or whose connection died) holds nothing.
//!
//! The lock key is the two-`int4` form `(hi, lo)`: the high and low halves of the 64-bit
//! FNV-1a hash of `"kuralle-instance\0<schema>\0<instance id>"` (UTF-8). Two ids may collide;
//! a collision can only refuse an id, never grant one to two processes (one id always maps to
//! one key), and the holder's recorded id (`kuralle_instances`) tells a collision apart from a
//! live holder of the same id in the error.

use std::sync::Arc;
use std::time::Duration;

use futures::future::BoxFuture;
use tokio::task::JoinHandle;
use tokio_postgres::NoTls;
use tokio_util::sync::CancellationToken;

use super::PostgresStore;
use super::errors;
use crate::store::{InstanceLock, StoreError, StoreFuture, owner_prefix};

/// How often the lock's connection is checked, and how long a check may take before the
/// connection (and so the proof) counts as lost.
const PING: Duration = Duration::from_secs(5);

/// The advisory lock key of `id` on `schema` (see the module docs).
pub(super) fn lock_key(schema: &str, id: &str) -> (i32, i32) {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for part in [b"kuralle-instance".as_slice(), b"\0", schema.as_bytes(), b"\0", id.as_bytes()] {
        for &byte in part {
            hash ^= u64::from(byte);
            hash = hash.wrapping_mul(0x0100_0000_01b3);
        }
    }
    let [a, b, c, d, e, f, g, h] = hash.to_be_bytes();
    (i32::from_be_bytes([a, b, c, d]), i32::from_be_bytes([e, f, g, h]))
}

/// A [`PostgresStore`]'s proof of an instance id: the session holding its advisory lock.
#[derive(Debug)]
pub(super) struct PgInstance {
    id: String,
    prefix: String,
    client: Arc<tokio_postgres::Client>,
    take_back_sql: String,
    lost: CancellationToken,
    /// Pings the session; dropping the lock stops it, which closes the session.
    pinger: JoinHandle<()>,
}

impl Drop for PgInstance {
    fn drop(&mut self) {
        self.pinger.abort();
    }
}

impl PostgresStore {
    pub(super) async fn lock_instance_session(&self, id: &str) -> Result<PgInstance, StoreError> {
        let mut config = self.inner.config.clone();
        config
            .connect_timeout(self.inner.options.connect_timeout)
            .keepalives(true)
            .keepalives_idle(Duration::from_secs(10))
            .application_name(format!("kuralle instance {}", id.chars().take(40).collect::<String>()));
        let (client, connection) = config.connect(NoTls).await.map_err(errors::map)?;
        let lost = CancellationToken::new();
        {
            let lost = lost.clone();
            tokio::spawn(async move {
                if let Err(e) = connection.await {
                    tracing::debug!(error = %e, "the instance lock's PostgreSQL connection failed");
                }
                lost.cancel();
            });
        }
        let (hi, lo) = lock_key(&self.inner.options.schema, id);
        let row = client.query_one("SELECT pg_try_advisory_lock($1, $2)", &[&hi, &lo]).await.map_err(errors::map)?;
        let locked: bool = row.try_get(0).map_err(errors::map)?;
        if !locked {
            let holder = client.query_opt(&self.inner.sql.instance_holder, &[&hi, &lo]).await.map_err(errors::map)?;
            let holder = match holder {
                Some(row) => {
                    let pid: i32 = row.try_get(0).map_err(errors::map)?;
                    match row.try_get::<_, Option<String>>(1).map_err(errors::map)? {
                        Some(other) if other != id => format!(
                            "PostgreSQL backend {pid} holds its advisory lock for instance `{other}`, whose lock key \
                             collides with this one's; give this process another instance id"
                        ),
                        _ => format!("PostgreSQL backend {pid} holds its advisory lock"),
                    }
                }
                None => "another PostgreSQL session holds its advisory lock".to_owned(),
            };
            return Err(StoreError::InstanceInUse { instance_id: id.to_owned(), holder });
        }
        client.execute(&self.inner.sql.record_instance, &[&id]).await.map_err(errors::map)?;
        let client = Arc::new(client);
        let pinger = tokio::spawn(ping(Arc::downgrade(&client), lost.clone()));
        Ok(PgInstance {
            id: id.to_owned(),
            prefix: owner_prefix(id),
            client,
            take_back_sql: self.inner.sql.take_back.clone(),
            lost,
            pinger,
        })
    }
}

/// Checks the session every [`PING`]; one that does not answer within [`PING`] is lost (a
/// dead peer can take the kernel minutes to notice).
async fn ping(client: std::sync::Weak<tokio_postgres::Client>, lost: CancellationToken) {
    loop {
        tokio::select! {
            () = lost.cancelled() => return,
            () = tokio::time::sleep(PING) => {}
        }
        let Some(client) = client.upgrade() else { return };
        match tokio::time::timeout(PING, client.simple_query("SELECT 1")).await {
            Ok(Ok(_)) => {}
            Ok(Err(e)) => {
                tracing::warn!(error = %e, "the instance lock's PostgreSQL session failed");
                lost.cancel();
                return;
            }
            Err(_) => {
                tracing::warn!("the instance lock's PostgreSQL session stopped answering");
                lost.cancel();
                return;
            }
        }
    }
}

impl InstanceLock for PgInstance {
    fn instance_id(&self) -> &str {
        &self.id
    }

    /// Runs on the lock's own session: once the session is gone, so is the proof, and the
    /// statement cannot run.
    fn take_back(&self) -> StoreFuture<'_, Vec<String>> {
        Box::pin(async move {
            if self.lost.is_cancelled() {
                return Err(StoreError::Unavailable("the instance lock's PostgreSQL session is gone".into()));
            }
            let rows = self.client.query(&self.take_back_sql, &[&self.prefix]).await.map_err(errors::map)?;
            let mut taken = rows
                .iter()
                .map(|row| row.try_get::<_, String>(0))
                .collect::<Result<Vec<_>, _>>()
                .map_err(errors::map)?;
            taken.sort();
            Ok(taken)
        })
    }

    fn lost(&self) -> BoxFuture<'static, ()> {
        Box::pin(self.lost.clone().cancelled_owned())
    }
}

#[cfg(test)]
mod tests {
    use super::lock_key;

    #[test]
    fn the_lock_key_is_a_stable_hash_of_schema_and_id() {
        // FNV-1a 64 of "kuralle-instance\0public\0app-1", split in two halves: changing it would
        // let an old and a new build hold one instance at once.
        assert_eq!(lock_key("public", "app-1"), lock_key("public", "app-1"));
        assert_ne!(lock_key("public", "app-1"), lock_key("public", "app-2"));
        assert_ne!(lock_key("public", "app-1"), lock_key("tenant", "app-1"));
        assert_eq!(lock_key("public", "app-1"), KNOWN);
    }

    const KNOWN: (i32, i32) = (-1_159_918_327, 688_037_379);
}
