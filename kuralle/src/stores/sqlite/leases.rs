//! Leases' SQL: the fence check every write of a run makes in its own transaction, and
//! acquiring, renewing, releasing and reading a run's lease by the store's clock.

use rusqlite::{OptionalExtension, params};

use super::codec::to_u64;
use super::errors::Mapper;
use super::known::Known;
use super::prepared::Db;
use crate::store::{Lease, StoreError};

/// The store's clock in SQL: milliseconds since the Unix epoch. Lease expiry is computed and
/// compared with it inside the statement, never with the client's clock. A macro so that the
/// statements using it are `&'static str` (they were formatted anew at every call).
macro_rules! now_ms {
    () => {
        "CAST((julianday('now') - 2440587.5) * 86400000.0 AS INTEGER)"
    };
}

/// The fence as an SQL condition, for a write that folds it into its one statement: true iff
/// the lease of run `?1` is unreleased and its token is `?{token}`. On a write that changed
/// nothing, [`check_fence`] tells whether this was why.
macro_rules! fence_holds {
    ($token:literal) => {
        concat!("EXISTS (SELECT 1 FROM leases WHERE run_id = ?1 AND token = ?", $token, " AND released = 0)")
    };
}
pub(super) use fence_holds;

/// `fence` as stored, or `Fenced` for a token SQLite cannot hold (no lease has it).
pub(super) fn stored_token(run_id: &str, fence: u64) -> Result<i64, StoreError> {
    i64::try_from(fence).map_err(|_| StoreError::Fenced { run_id: run_id.to_owned(), token: fence })
}

/// Whether run `?1`'s lease is unreleased with token `?2`.
pub(super) const FENCE: &str = "SELECT 1 FROM leases WHERE run_id = ?1 AND token = ?2 AND released = 0";

/// Rejects a write unless the run's lease is unreleased and its token is `fence`; runs in the
/// write's own transaction, so the check and the write commit together. Reads nothing when
/// the writer knows the lease holds.
pub(super) fn check_fence(conn: &Db<'_>, errors: Mapper, run_id: &str, fence: u64) -> Result<(), StoreError> {
    let fenced = || StoreError::Fenced { run_id: run_id.to_owned(), token: fence };
    let token = stored_token(run_id, fence)?;
    if known_to_hold(conn, run_id, token) {
        return Ok(());
    }
    read_fence(conn, run_id, token).map_err(|e| errors.map(e))?.then_some(()).ok_or_else(fenced)?;
    conn.learn(|known| known.fence_held(run_id, token));
    Ok(())
}

/// Whether run `run_id`'s lease is unreleased with `token`, read.
fn read_fence(conn: &Db<'_>, run_id: &str, token: i64) -> rusqlite::Result<bool> {
    conn.prepared(FENCE)
        .and_then(|mut stmt| stmt.query_row(params![run_id, token], |_| Ok(())).optional())
        .map(|row| row.is_some())
}

/// Whether the writer knows run `run_id`'s lease to be unreleased with `token` (`known.rs`),
/// so that a write may leave the fence unread. In debug builds, and so in every test, the
/// lease is read anyway and must agree: the whole suite checks what the writer knows.
pub(super) fn known_to_hold(conn: &Db<'_>, run_id: &str, token: i64) -> bool {
    let known = conn.known().is_some_and(|known| known.holds(run_id, token));
    if cfg!(debug_assertions) && known {
        assert!(
            !matches!(read_fence(conn, run_id, token), Ok(false)),
            "the writer knew run `{run_id}`'s lease {token} to hold; the database says it does not"
        );
    }
    known
}

/// One write: take the lease iff there is none, or it is released or expired by the
/// store's clock; the token only grows. The row is read back by a second statement
/// ([`LEASE_ROW`]): a `RETURNING` clause made SQLite buffer the row in a temporary table and
/// journal the write's pages for a statement rollback.
pub(super) const ACQUIRE: &str = concat!(
    "INSERT INTO leases (run_id, owner, token, expires_at, released) VALUES (?1, ?2, 1, ",
    now_ms!(),
    " + ?3, 0)
     ON CONFLICT (run_id) DO UPDATE SET owner = excluded.owner, token = leases.token + 1,
         expires_at = excluded.expires_at, released = 0
     WHERE leases.released = 1 OR leases.expires_at <= ",
    now_ms!()
);

/// Run `?1`'s lease, released or not.
pub(super) const LEASE_ROW: &str = "SELECT owner, token, expires_at FROM leases WHERE run_id = ?1";

pub(super) fn acquire(
    conn: &Db<'_>,
    errors: Mapper,
    run_id: &str,
    owner: &str,
    ttl_ms: i64,
) -> Result<Lease, StoreError> {
    let granted = conn
        .prepared(ACQUIRE)
        .and_then(|mut stmt| stmt.execute(params![run_id, owner, ttl_ms]))
        .map_err(|e| errors.map(e))?;
    let row: Option<(String, i64, i64)> = conn
        .prepared(LEASE_ROW)
        .and_then(|mut stmt| stmt.query_row([run_id], |row| Ok((row.get(0)?, row.get(1)?, row.get(2)?))).optional())
        .map_err(|e| errors.map(e))?;
    let (holder, token, expires_at_ms) =
        row.ok_or_else(|| StoreError::Corrupt(format!("lease of run `{run_id}` vanished").into()))?;
    if granted == 1 {
        conn.learn(|known| known.fence_held(run_id, token));
        return Ok(Lease {
            run_id: run_id.to_owned(),
            owner: holder,
            token: to_u64("leases.token", token)?,
            expires_at_ms,
        });
    }
    Err(StoreError::LeaseHeld { run_id: run_id.to_owned(), owner: holder, expires_at_ms })
}

/// Moves the expiry of run `?1`'s lease `?2` to `?3` ms from now, iff it is unreleased.
pub(super) const RENEW: &str = concat!(
    "UPDATE leases SET expires_at = ",
    now_ms!(),
    " + ?3 WHERE run_id = ?1 AND token = ?2 AND released = 0 RETURNING expires_at"
);

pub(super) fn renew(conn: &Db<'_>, errors: Mapper, lease: &Lease, ttl_ms: i64) -> Result<Lease, StoreError> {
    let fenced = || StoreError::Fenced { run_id: lease.run_id.clone(), token: lease.token };
    let token = stored_token(&lease.run_id, lease.token)?;
    let renewed: Option<i64> = conn
        .prepared(RENEW)
        .and_then(|mut stmt| stmt.query_row(params![lease.run_id, token, ttl_ms], |row| row.get(0)).optional())
        .map_err(|e| errors.map(e))?;
    let expires_at_ms = renewed.ok_or_else(fenced)?;
    Ok(Lease { expires_at_ms, ..lease.clone() })
}

/// Renews `leases` on one connection, in the caller's transaction: each lease's own outcome
/// (a lease taken over is [`StoreError::Fenced`] at its index); a failure of SQLite itself
/// fails the whole batch.
pub(super) fn renew_many(
    conn: &Db<'_>,
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

/// Releases run `?1`'s lease `?2`, iff it is unreleased.
pub(super) const RELEASE: &str = "UPDATE leases SET released = 1 WHERE run_id = ?1 AND token = ?2 AND released = 0";

/// Releases the lease of `run_id` held under token `fence`.
pub(super) fn release(conn: &Db<'_>, errors: Mapper, run_id: &str, fence: u64) -> Result<(), StoreError> {
    let token = stored_token(run_id, fence)?;
    let released =
        conn.prepared(RELEASE).and_then(|mut stmt| stmt.execute(params![run_id, token])).map_err(|e| errors.map(e))?;
    conn.learn(|known| known.forget(run_id));
    if released == 1 { Ok(()) } else { Err(StoreError::Fenced { run_id: run_id.to_owned(), token: fence }) }
}

pub(super) fn current_lease(conn: &Db<'_>, errors: Mapper, run_id: &str) -> Result<Option<Lease>, StoreError> {
    const CURRENT: &str = concat!(
        "SELECT owner, token, expires_at FROM leases WHERE run_id = ?1 AND released = 0 AND expires_at > ",
        now_ms!()
    );
    let row: Option<(String, i64, i64)> = conn
        .prepared(CURRENT)
        .and_then(|mut stmt| stmt.query_row([run_id], |row| Ok((row.get(0)?, row.get(1)?, row.get(2)?))).optional())
        .map_err(|e| errors.map(e))?;
    row.map(|(owner, token, expires_at_ms)| {
        Ok(Lease { run_id: run_id.to_owned(), owner, token: to_u64("leases.token", token)?, expires_at_ms })
    })
    .transpose()
}

/// Ends every unreleased lease whose owner starts with `prefix` (an instance's leases, taken
/// back under its proof); returns their run ids.
pub(super) fn take_back(conn: &Db<'_>, errors: Mapper, prefix: &str) -> Result<Vec<String>, StoreError> {
    // `substr`/`length` count characters on both sides, so this is an exact prefix test
    // (`LIKE` would treat `%` and `_` in an instance id as wildcards).
    let mut taken = conn
        .prepared(
            "UPDATE leases SET released = 1 WHERE released = 0 AND substr(owner, 1, length(?1)) = ?1
             RETURNING run_id",
        )
        .and_then(|mut stmt| stmt.query_map([prefix], |row| row.get::<_, String>(0))?.collect::<Result<Vec<_>, _>>())
        .map_err(|e| errors.map(e))?;
    conn.learn(Known::forget_all);
    taken.sort();
    Ok(taken)
}
