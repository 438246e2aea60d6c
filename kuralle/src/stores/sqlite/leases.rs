//! Leases' SQL: the fence check every write of a run makes in its own transaction, and
//! acquiring, renewing, releasing and reading a run's lease by the store's clock.

use rusqlite::{Connection, OptionalExtension, params};

use super::codec::to_u64;
use super::errors::Mapper;
use crate::store::{Lease, StoreError};

/// The store's clock in SQL: milliseconds since the Unix epoch. Lease expiry is computed and
/// compared with it inside the statement, never with the client's clock.
const NOW_MS: &str = "CAST((julianday('now') - 2440587.5) * 86400000.0 AS INTEGER)";

/// Rejects a write unless the run's lease is unreleased and its token is `fence`; runs in the
/// write's own transaction, so the check and the write commit together.
pub(super) fn check_fence(conn: &Connection, errors: Mapper, run_id: &str, fence: u64) -> Result<(), StoreError> {
    let fenced = || StoreError::Fenced { run_id: run_id.to_owned(), token: fence };
    let Ok(token) = i64::try_from(fence) else { return Err(fenced()) };
    let current = conn
        .prepare_cached("SELECT 1 FROM leases WHERE run_id = ?1 AND token = ?2 AND released = 0")
        .and_then(|mut stmt| stmt.query_row(params![run_id, token], |_| Ok(())).optional())
        .map_err(|e| errors.map(e))?;
    current.ok_or_else(fenced)
}

pub(super) fn acquire(
    conn: &Connection,
    errors: Mapper,
    run_id: &str,
    owner: &str,
    ttl_ms: i64,
) -> Result<Lease, StoreError> {
    // One statement: take the lease iff there is none, or it is released or expired by the
    // store's clock; the token only grows.
    let sql = format!(
        "INSERT INTO leases (run_id, owner, token, expires_at, released) VALUES (?1, ?2, 1, {NOW_MS} + ?3, 0)
         ON CONFLICT (run_id) DO UPDATE SET owner = excluded.owner, token = leases.token + 1,
             expires_at = excluded.expires_at, released = 0
         WHERE leases.released = 1 OR leases.expires_at <= {NOW_MS}
         RETURNING token, expires_at"
    );
    let granted: Option<(i64, i64)> = conn
        .prepare_cached(&sql)
        .and_then(|mut stmt| {
            stmt.query_row(params![run_id, owner, ttl_ms], |row| Ok((row.get(0)?, row.get(1)?))).optional()
        })
        .map_err(|e| errors.map(e))?;
    if let Some((token, expires_at_ms)) = granted {
        return Ok(Lease {
            run_id: run_id.to_owned(),
            owner: owner.to_owned(),
            token: to_u64("leases.token", token)?,
            expires_at_ms,
        });
    }
    let holder: Option<(String, i64)> = conn
        .prepare_cached("SELECT owner, expires_at FROM leases WHERE run_id = ?1")
        .and_then(|mut stmt| stmt.query_row([run_id], |row| Ok((row.get(0)?, row.get(1)?))).optional())
        .map_err(|e| errors.map(e))?;
    let (owner, expires_at_ms) =
        holder.ok_or_else(|| StoreError::Corrupt(format!("lease of run `{run_id}` vanished").into()))?;
    Err(StoreError::LeaseHeld { run_id: run_id.to_owned(), owner, expires_at_ms })
}

pub(super) fn renew(conn: &Connection, errors: Mapper, lease: &Lease, ttl_ms: i64) -> Result<Lease, StoreError> {
    let fenced = || StoreError::Fenced { run_id: lease.run_id.clone(), token: lease.token };
    let Ok(token) = i64::try_from(lease.token) else { return Err(fenced()) };
    let sql = format!(
        "UPDATE leases SET expires_at = {NOW_MS} + ?3 WHERE run_id = ?1 AND token = ?2 AND released = 0
         RETURNING expires_at"
    );
    let renewed: Option<i64> = conn
        .prepare_cached(&sql)
        .and_then(|mut stmt| stmt.query_row(params![lease.run_id, token, ttl_ms], |row| row.get(0)).optional())
        .map_err(|e| errors.map(e))?;
    let expires_at_ms = renewed.ok_or_else(fenced)?;
    Ok(Lease { expires_at_ms, ..lease.clone() })
}

/// Renews `leases` on one connection, in the caller's transaction: each lease's own outcome
/// (a lease taken over is [`StoreError::Fenced`] at its index); a failure of SQLite itself
/// fails the whole batch.
pub(super) fn renew_many(
    conn: &Connection,
    errors: Mapper,
    leases: &[Lease],
    ttl_ms: i64,
) -> Result<Vec<Result<Lease, StoreError>>, StoreError> {
    leases
        .iter()
        .map(|lease| match renew(conn, errors, lease, ttl_ms) {
            Err(e @ StoreError::Fenced { .. }) => Ok(Err(e)),
            other => other.map(Ok),
        })
        .collect()
}

pub(super) fn release(conn: &Connection, errors: Mapper, lease: &Lease) -> Result<(), StoreError> {
    let fenced = || StoreError::Fenced { run_id: lease.run_id.clone(), token: lease.token };
    let Ok(token) = i64::try_from(lease.token) else { return Err(fenced()) };
    let released = conn
        .prepare_cached("UPDATE leases SET released = 1 WHERE run_id = ?1 AND token = ?2 AND released = 0")
        .and_then(|mut stmt| stmt.execute(params![lease.run_id, token]))
        .map_err(|e| errors.map(e))?;
    if released == 1 { Ok(()) } else { Err(fenced()) }
}

pub(super) fn current_lease(conn: &Connection, errors: Mapper, run_id: &str) -> Result<Option<Lease>, StoreError> {
    let sql = format!(
        "SELECT owner, token, expires_at FROM leases WHERE run_id = ?1 AND released = 0 AND expires_at > {NOW_MS}"
    );
    let row: Option<(String, i64, i64)> = conn
        .prepare_cached(&sql)
        .and_then(|mut stmt| stmt.query_row([run_id], |row| Ok((row.get(0)?, row.get(1)?, row.get(2)?))).optional())
        .map_err(|e| errors.map(e))?;
    row.map(|(owner, token, expires_at_ms)| {
        Ok(Lease { run_id: run_id.to_owned(), owner, token: to_u64("leases.token", token)?, expires_at_ms })
    })
    .transpose()
}

/// Ends every unreleased lease whose owner starts with `prefix` (an instance's leases, taken
/// back under its proof); returns their run ids.
pub(super) fn take_back(conn: &Connection, errors: Mapper, prefix: &str) -> Result<Vec<String>, StoreError> {
    // `substr`/`length` count characters on both sides, so this is an exact prefix test
    // (`LIKE` would treat `%` and `_` in an instance id as wildcards).
    let mut taken = conn
        .prepare_cached(
            "UPDATE leases SET released = 1 WHERE released = 0 AND substr(owner, 1, length(?1)) = ?1
             RETURNING run_id",
        )
        .and_then(|mut stmt| stmt.query_map([prefix], |row| row.get::<_, String>(0))?.collect::<Result<Vec<_>, _>>())
        .map_err(|e| errors.map(e))?;
    taken.sort();
    Ok(taken)
}
