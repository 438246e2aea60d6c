//! The SQL of the `RunStore` contract. Every function runs on a connection the caller holds:
//! writes inside the writer's transaction and savepoint, reads on a pooled read connection.

use rusqlite::{Connection, OptionalExtension, params};

use super::codec::{Mapper, RawStep, parse_run_status, to_u64};
use crate::JsonText;
use crate::store::{Lease, NewStep, RunFilter, RunRecord, RunSummary, StepRecord, StoreError};

/// Reserves the next ordinals and inserts the intents; runs inside the writer's savepoint, so
/// a failure leaves neither the ordinals nor any row behind.
pub(super) fn append(
    conn: &Connection,
    errors: Mapper,
    run_id: &str,
    steps: Vec<NewStep>,
    epochs: &[i64],
) -> Result<Vec<u64>, StoreError> {
    // The next ordinal is read from the journal's primary key (one index probe) rather than
    // kept in the run's row: SQLite rewrites a whole row to update one column, so a counter
    // beside the run's state rewrote the state (a session's whole conversation) on every
    // append. The writer's transaction makes the read and the inserts one step.
    let first: Option<i64> = conn
        .prepare_cached(
            "SELECT (SELECT coalesce(max(ordinal) + 1, 0) FROM steps WHERE run_id = ?1) FROM runs WHERE run_id = ?1",
        )
        .and_then(|mut stmt| stmt.query_row(params![run_id], |row| row.get(0)).optional())
        .map_err(|e| errors.map(e))?;
    let Some(first) = first else {
        return Err(StoreError::RunNotFound(run_id.to_owned()));
    };
    let mut insert = conn
        .prepare_cached(
            "INSERT INTO steps (run_id, ordinal, key, kind, name, epoch, status, started_at)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, 'running', ?7)",
        )
        .map_err(|e| errors.map(e))?;
    let mut ordinals = Vec::with_capacity(steps.len());
    for ((ordinal, step), epoch) in (first..).zip(steps).zip(epochs) {
        let inserted = insert.execute(params![
            run_id,
            ordinal,
            step.key,
            step.kind.as_str(),
            step.name,
            epoch,
            step.started_at_ms
        ]);
        match inserted {
            Ok(_) => ordinals.push(to_u64("steps.ordinal", ordinal)?),
            Err(rusqlite::Error::SqliteFailure(e, _)) if e.extended_code == rusqlite::ffi::SQLITE_CONSTRAINT_UNIQUE => {
                return Err(StoreError::DuplicateKey { run_id: run_id.to_owned(), key: step.key });
            }
            Err(rusqlite::Error::SqliteFailure(e, _))
                if e.extended_code == rusqlite::ffi::SQLITE_CONSTRAINT_PRIMARYKEY =>
            {
                return Err(StoreError::Corrupt(format!(
                    "run `{run_id}`: ordinal {ordinal} is already taken although it follows the journal's last"
                )));
            }
            Err(e) => return Err(errors.map(e)),
        }
    }
    Ok(ordinals)
}

fn stored_version(conn: &Connection, run_id: &str, errors: Mapper) -> Result<Option<u64>, StoreError> {
    let version: Option<i64> = conn
        .prepare_cached("SELECT version FROM runs WHERE run_id = ?1")
        .and_then(|mut stmt| stmt.query_row([run_id], |row| row.get(0)).optional())
        .map_err(|e| errors.map(e))?;
    version.map(|v| to_u64("runs.version", v)).transpose()
}

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
        holder.ok_or_else(|| StoreError::Corrupt(format!("lease of run `{run_id}` vanished")))?;
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

/// A run row ready to write: `(epoch, version, state JSON)`, converted before it is queued.
pub(super) type PreparedRun = (i64, i64, String);

pub(super) fn insert_run(
    conn: &Connection,
    errors: Mapper,
    run: &RunRecord,
    (epoch, version, state): PreparedRun,
) -> Result<(), StoreError> {
    let inserted = conn
        .prepare_cached(
            "INSERT INTO runs (run_id, agent_id, status, epoch, version, next_ordinal, state, created_at, updated_at)
             VALUES (?1, ?2, ?3, ?4, ?5, 0, ?6, ?7, ?8) ON CONFLICT (run_id) DO NOTHING",
        )
        .and_then(|mut stmt| {
            stmt.execute(params![
                run.run_id,
                run.agent_id,
                run.status.as_str(),
                epoch,
                version,
                state,
                run.created_at_ms,
                run.updated_at_ms
            ])
        })
        .map_err(|e| errors.map(e))?;
    if inserted == 0 {
        return Err(StoreError::RunExists(run.run_id.clone()));
    }
    Ok(())
}

pub(super) fn update_run(
    conn: &Connection,
    errors: Mapper,
    run: &RunRecord,
    (epoch, version, state): PreparedRun,
) -> Result<u64, StoreError> {
    let next = version
        .checked_add(1)
        .ok_or_else(|| StoreError::LimitExceeded(format!("run `{}` version overflow", run.run_id)))?;
    let updated = conn
        .prepare_cached(
            "UPDATE runs SET agent_id = ?1, status = ?2, epoch = ?3, version = ?4, state = ?5, updated_at = ?6
             WHERE run_id = ?7 AND version = ?8",
        )
        .and_then(|mut stmt| {
            stmt.execute(params![
                run.agent_id,
                run.status.as_str(),
                epoch,
                next,
                state,
                run.updated_at_ms,
                run.run_id,
                version
            ])
        })
        .map_err(|e| errors.map(e))?;
    if updated == 1 {
        return to_u64("runs.version", next);
    }
    match stored_version(conn, &run.run_id, errors)? {
        None => Err(StoreError::RunNotFound(run.run_id.clone())),
        Some(actual) => Err(StoreError::VersionConflict { run_id: run.run_id.clone(), expected: run.version, actual }),
    }
}

pub(super) fn get_run(conn: &Connection, errors: Mapper, run_id: &str) -> Result<Option<RunRecord>, StoreError> {
    conn.prepare_cached(
        "SELECT run_id, agent_id, status, epoch, version, state, created_at, updated_at
         FROM runs WHERE run_id = ?1",
    )
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
            state: crate::JsonText::parse(state)
                .map_err(|e| StoreError::Corrupt(format!("runs.state holds invalid JSON: {e}")))?,
            run_id,
            agent_id,
            created_at_ms,
            updated_at_ms,
        })
    })
    .transpose()
}

pub(super) fn list_runs(conn: &Connection, errors: Mapper, filter: &RunFilter) -> Result<Vec<RunSummary>, StoreError> {
    let limit = filter.limit.map_or(-1, |limit| i64::try_from(limit).unwrap_or(i64::MAX));
    let map_row = |row: &rusqlite::Row<'_>| {
        Ok((row.get::<_, String>(0)?, row.get::<_, String>(1)?, row.get::<_, String>(2)?, row.get::<_, i64>(3)?))
    };
    let rows = match filter.status {
        Some(status) => conn
            .prepare_cached(
                "SELECT run_id, agent_id, status, updated_at FROM runs WHERE status = ?1
                 ORDER BY updated_at DESC, run_id ASC LIMIT ?2",
            )
            .and_then(|mut stmt| stmt.query_map(params![status.as_str(), limit], map_row)?.collect()),
        None => conn
            .prepare_cached(
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
pub(super) fn delete_run(conn: &Connection, errors: Mapper, run_id: &str) -> Result<bool, StoreError> {
    let deleted = conn
        .prepare_cached("DELETE FROM steps WHERE run_id = ?1")
        .and_then(|mut stmt| stmt.execute([run_id]))
        .and_then(|_| conn.prepare_cached("DELETE FROM runs WHERE run_id = ?1"))
        .and_then(|mut stmt| stmt.execute([run_id]))
        .map_err(|e| errors.map(e))?;
    Ok(deleted > 0)
}

/// A step outcome ready to write: `(status, result JSON, error JSON)`.
pub(super) type PreparedOutcome = (&'static str, Option<JsonText>, Option<JsonText>);

pub(super) fn finish(
    conn: &Connection,
    errors: Mapper,
    run_id: &str,
    ordinal: u64,
    (status, result, error): PreparedOutcome,
    finished_at_ms: i64,
) -> Result<(), StoreError> {
    let (result, error) = (result.as_ref().map(JsonText::as_str), error.as_ref().map(JsonText::as_str));
    // An ordinal beyond SQLite's integers names no step.
    let stored_ordinal = i64::try_from(ordinal).unwrap_or(-1);
    let updated = conn
        .prepare_cached(
            "UPDATE steps SET status = ?1, result = ?2, error = ?3, finished_at = ?4
             WHERE run_id = ?5 AND ordinal = ?6 AND status = 'running'",
        )
        .and_then(|mut stmt| stmt.execute(params![status, result, error, finished_at_ms, run_id, stored_ordinal]))
        .map_err(|e| errors.map(e))?;
    if updated == 1 {
        return Ok(());
    }
    match stored_version(conn, run_id, errors)? {
        None => Err(StoreError::RunNotFound(run_id.to_owned())),
        Some(_) => Err(StoreError::StepNotRunning { run_id: run_id.to_owned(), ordinal }),
    }
}

pub(super) fn steps(conn: &Connection, errors: Mapper, run_id: &str) -> Result<Vec<StepRecord>, StoreError> {
    let mut stmt = conn
        .prepare_cached(
            "SELECT ordinal, key, kind, name, epoch, status, result, error, started_at, finished_at
             FROM steps WHERE run_id = ?1 ORDER BY ordinal",
        )
        .map_err(|e| errors.map(e))?;
    let rows = stmt
        .query_map([run_id], |row| {
            Ok(RawStep {
                ordinal: row.get(0)?,
                key: row.get(1)?,
                kind: row.get(2)?,
                name: row.get(3)?,
                epoch: row.get(4)?,
                status: row.get(5)?,
                result: row.get(6)?,
                error: row.get(7)?,
                started_at_ms: row.get(8)?,
                finished_at_ms: row.get(9)?,
            })
        })
        .map_err(|e| errors.map(e))?;
    let mut steps = Vec::new();
    for row in rows {
        steps.push(row.map_err(|e| errors.map(e))?.into_record()?);
    }
    Ok(steps)
}
