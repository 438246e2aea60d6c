//! Run rows' SQL: insert, compare-and-swap, read, list, delete.

use rusqlite::{OptionalExtension, params};

use super::codec::{parse_run_status, to_u64};
use super::errors::Mapper;
use super::leases::{self, check_fence, fence_holds, known_to_hold, stored_token};
use super::prepared::Db;
use super::steps;
use crate::store::{RunFilter, RunRecord, RunStatus, RunSummary, StoreError};

/// The run's stored version, `None` when the run does not exist.
pub(super) fn stored_version(conn: &Db<'_>, run_id: &str, errors: Mapper) -> Result<Option<u64>, StoreError> {
    let version: Option<i64> = conn
        .prepared("SELECT version FROM runs WHERE run_id = ?1")
        .and_then(|mut stmt| stmt.query_row([run_id], |row| row.get(0)).optional())
        .map_err(|e| errors.map(e))?;
    version.map(|v| to_u64("runs.version", v)).transpose()
}

/// A run row's integers ready to write: `(epoch, version)`, converted and the state's size
/// checked before the write is queued. The state itself is bound from the record: the writer
/// borrows the record, so it is not copied.
pub(super) type PreparedRun = (i64, i64);

/// Inserts the run's row under lease `fence`: a read of the fence, then the one write.
pub(super) fn insert_run(
    conn: &Db<'_>,
    errors: Mapper,
    run: &RunRecord,
    fence: u64,
    prepared: &PreparedRun,
) -> Result<(), StoreError> {
    check_fence(conn, errors, &run.run_id, fence)?;
    let Some(run_key) = insert_row(conn, errors, run, prepared)? else {
        return Err(StoreError::RunExists(run.run_id.clone()));
    };
    steps::created(conn, &run.run_id, run_key, fence);
    Ok(())
}

/// Inserts the run's row unless the run exists; the key it got in the file, `None` when the
/// run existed. The caller has checked the fence (or has just taken the lease in the same
/// transaction).
pub(super) fn insert_row(
    conn: &Db<'_>,
    errors: Mapper,
    run: &RunRecord,
    (epoch, version): &PreparedRun,
) -> Result<Option<i64>, StoreError> {
    let exists = conn
        .prepared(RUN_EXISTS)
        .and_then(|mut stmt| stmt.query_row([&run.run_id], |row| row.get::<_, bool>(0)))
        .map_err(|e| errors.map(e))?;
    if exists {
        return Ok(None);
    }
    let inserted = conn
        .prepared(INSERT_RUN)
        .and_then(|mut stmt| {
            stmt.execute(params![
                run.run_id,
                run.agent_id,
                run.status.as_str(),
                epoch,
                version,
                run.state.as_str(),
                run.created_at_ms,
                run.updated_at_ms
            ])
        })
        .map_err(|e| errors.map(e))?;
    // The key is the row's rowid, read from the connection rather than by `RETURNING`, which
    // made SQLite buffer the row and journal the write for a statement rollback (as in
    // `leases::ACQUIRE`).
    Ok((inserted > 0).then(|| conn.last_insert_rowid()))
}

/// Whether a run of this id exists: read before the insert, which it spares when the run is
/// there. An insert that conflicts has already taken the next key, and `AUTOINCREMENT` then
/// rewrites its counter, a write on the writer for every later turn of a run its caller names
/// (`acquire_lease_and_create_run`).
pub(super) const RUN_EXISTS: &str = "SELECT EXISTS (SELECT 1 FROM runs WHERE run_id = ?1)";

/// Inserts a run's row. One row of `VALUES`, not the rows of a query: SQLite gives a statement
/// that inserts a query's rows a statement journal (it could fail after some of them), and
/// that copied every page the insert touched into memory: 29 of the about 38 allocations a run
/// it cost the writer (heaptrack, 10,000 runs in flight). Under the writer's lock no row can
/// come between [`RUN_EXISTS`] and this insert; the conflict clause stays as a guard, so that
/// one never turns into a constraint error.
pub(super) const INSERT_RUN: &str =
    "INSERT INTO runs (run_id, agent_id, status, epoch, version, state, created_at, updated_at)
     VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)
     ON CONFLICT (run_id) DO NOTHING";

/// Replaces the run's row by compare-and-swap on its version, under lease `fence`, in one
/// statement that checks the fence too; only when it changed nothing do reads tell why.
pub(super) fn update_run(
    conn: &Db<'_>,
    errors: Mapper,
    run: &RunRecord,
    fence: u64,
    (epoch, version): &PreparedRun,
) -> Result<u64, StoreError> {
    let token = stored_token(&run.run_id, fence)?;
    let next = version
        .checked_add(1)
        .ok_or_else(|| StoreError::LimitExceeded(format!("run `{}` version overflow", run.run_id).into()))?;
    let fence_known = known_to_hold(conn, &run.run_id, token);
    let updated = conn
        .prepared(if fence_known { UPDATE_RUN_KNOWN_FENCE } else { UPDATE_RUN })
        .and_then(|mut stmt| {
            stmt.execute(params![
                run.run_id,
                token,
                run.agent_id,
                run.status.as_str(),
                epoch,
                next,
                run.state.as_str(),
                run.updated_at_ms,
                version
            ])
        })
        .map_err(|e| errors.map(e))?;
    if updated == 1 {
        // The statement checked the fence: the writer knows it now (if it did not already).
        if !fence_known {
            conn.learn(|known| known.fence_held(&run.run_id, token));
        }
        return to_u64("runs.version", next);
    }
    check_fence(conn, errors, &run.run_id, fence)?;
    match stored_version(conn, &run.run_id, errors)? {
        None => Err(StoreError::RunNotFound(run.run_id.clone())),
        Some(actual) => Err(StoreError::VersionConflict { run_id: run.run_id.clone(), expected: run.version, actual }),
    }
}

/// The compare-and-swap of [`UPDATE_RUN`] and [`UPDATE_RUN_KNOWN_FENCE`], without the fence.
macro_rules! update_run_sql {
    () => {
        "UPDATE runs SET agent_id = ?3, status = ?4, epoch = ?5, version = ?6, state = ?7, updated_at = ?8
         WHERE run_id = ?1 AND version = ?9"
    };
}

/// Replaces run `?1`'s row iff its version is `?9` and its lease `?2` holds.
pub(super) const UPDATE_RUN: &str = concat!(update_run_sql!(), " AND ", fence_holds!(2));

/// Replaces run `?1`'s row iff its version is `?9`, its lease `?2` known to hold by the writer
/// (`?2` is bound and unused, so both statements take the same parameters).
pub(super) const UPDATE_RUN_KNOWN_FENCE: &str = update_run_sql!();

/// [`RunStore::put_run_and_release`](crate::RunStore::put_run_and_release): the run written
/// as by [`update_run`], then its lease released. A refused run write changed nothing and
/// leaves the lease held; once the run is written under the fence, in this transaction, the
/// release cannot be refused.
pub(super) fn update_run_and_release(
    conn: &Db<'_>,
    errors: Mapper,
    run: &RunRecord,
    fence: u64,
    prepared: &PreparedRun,
) -> Result<(u64, bool), StoreError> {
    let version = update_run(conn, errors, run, fence, prepared)?;
    leases::release(conn, errors, &run.run_id, fence)?;
    Ok((version, true))
}

/// Run `?1`'s row.
pub(super) const GET_RUN: &str =
    "SELECT run_id, agent_id, status, epoch, version, state, created_at, updated_at FROM runs WHERE run_id = ?1";

pub(super) fn get_run(conn: &Db<'_>, errors: Mapper, run_id: &str) -> Result<Option<RunRecord>, StoreError> {
    conn.prepared(GET_RUN)
        .and_then(|mut stmt| {
            stmt.query_row([run_id], |row| {
                Ok((
                    row.get::<_, String>(0)?,
                    row.get::<_, String>(1)?,
                    row.get::<_, String>(2)?,
                    row.get::<_, i64>(3)?,
                    row.get::<_, i64>(4)?,
                    row.get::<_, String>(5)?,
                    row.get::<_, i64>(6)?,
                    row.get::<_, i64>(7)?,
                ))
            })
            .optional()
        })
        .map_err(|e| errors.map(e))?
        .map(|(run_id, agent_id, status, epoch, version, state, created_at_ms, updated_at_ms)| {
            Ok(RunRecord {
                status: parse_run_status(&status)?,
                epoch: to_u64("runs.epoch", epoch)?,
                version: to_u64("runs.version", version)?,
                state: crate::json::JsonText::parse(state)
                    .map_err(|e| StoreError::Corrupt(format!("runs.state holds invalid JSON: {e}").into()))?,
                run_id,
                agent_id,
                created_at_ms,
                updated_at_ms,
            })
        })
        .transpose()
}

pub(super) fn list_runs(conn: &Db<'_>, errors: Mapper, filter: &RunFilter) -> Result<Vec<RunSummary>, StoreError> {
    let limit = filter.limit.map_or(-1, |limit| i64::try_from(limit).unwrap_or(i64::MAX));
    let map_row = |row: &rusqlite::Row<'_>| {
        Ok((row.get::<_, String>(0)?, row.get::<_, String>(1)?, row.get::<_, String>(2)?, row.get::<_, i64>(3)?))
    };
    let rows = match filter.status {
        Some(status) => conn
            .prepared(
                "SELECT run_id, agent_id, status, updated_at FROM runs WHERE status = ?1
                 ORDER BY updated_at DESC, run_id ASC LIMIT ?2",
            )
            .and_then(|mut stmt| stmt.query_map(params![status.as_str(), limit], map_row)?.collect()),
        None => conn
            .prepared(
                "SELECT run_id, agent_id, status, updated_at FROM runs
                 ORDER BY updated_at DESC, run_id ASC LIMIT ?1",
            )
            .and_then(|mut stmt| stmt.query_map(params![limit], map_row)?.collect()),
    };
    let rows: Vec<(String, String, String, i64)> = rows.map_err(|e| errors.map(e))?;
    rows.into_iter()
        .map(|(run_id, agent_id, status, updated_at_ms)| {
            Ok(RunSummary { run_id, agent_id, status: parse_run_status(&status)?, updated_at_ms })
        })
        .collect()
}

/// Deletes the run and its journal; its lease row stays so a reused id never reuses a token.
pub(super) fn delete_run(conn: &Db<'_>, errors: Mapper, run_id: &str) -> Result<bool, StoreError> {
    let deleted = conn
        .prepared("DELETE FROM steps WHERE run_key = (SELECT run_key FROM runs WHERE run_id = ?1)")
        .and_then(|mut stmt| stmt.execute([run_id]))
        .and_then(|_| conn.prepared("DELETE FROM runs WHERE run_id = ?1"))
        .and_then(|mut stmt| stmt.execute([run_id]))
        .map_err(|e| errors.map(e))?;
    conn.learn(|known| known.forget(run_id));
    Ok(deleted > 0)
}

/// [`RunStore::cancel_run`](crate::RunStore::cancel_run): the status before, and, for a
/// running or paused run, the status set to `cancelled` and the lease released, in the
/// caller's one transaction.
pub(super) fn cancel_run(conn: &Db<'_>, errors: Mapper, run_id: &str) -> Result<Option<RunStatus>, StoreError> {
    let before: Option<String> = conn
        .prepared("SELECT status FROM runs WHERE run_id = ?1")
        .and_then(|mut stmt| stmt.query_row([run_id], |row| row.get(0)).optional())
        .map_err(|e| errors.map(e))?;
    let Some(before) = before.as_deref().map(parse_run_status).transpose()? else { return Ok(None) };
    if !matches!(before, RunStatus::Running | RunStatus::Paused) {
        return Ok(Some(before));
    }
    conn.prepared("UPDATE runs SET status = 'cancelled', version = version + 1, updated_at = ?2 WHERE run_id = ?1")
        .and_then(|mut stmt| stmt.execute(params![run_id, crate::clock::now_ms()]))
        .and_then(|_| conn.prepared("UPDATE leases SET released = 1 WHERE run_id = ?1 AND released = 0"))
        .and_then(|mut stmt| stmt.execute([run_id]))
        .map_err(|e| errors.map(e))?;
    conn.learn(|known| known.forget(run_id));
    Ok(Some(before))
}
