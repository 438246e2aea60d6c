//! The journal's SQL: reserving ordinals with intents, finishing steps, reading them back.
//! Each write checks the run's fence in its own transaction: folded into its statement where
//! it is one, read before the first change where it is several, and not read again while the
//! writer knows it holds (`known.rs`).

use rusqlite::{OptionalExtension, params};

use super::codec::{RawStep, StoredKey, to_i64, to_u64};
use super::errors::Mapper;
use super::prepared::Db;
use crate::json::JsonText;
use crate::store::{NewStep, StepRecord, StoreError};

use super::leases::{check_fence, fence_holds, known_to_hold, stored_token};
use super::runs::stored_version;

/// Where a write appends: the run's key in the file and its journal's next ordinal, read under
/// a lease token the read found holding (so only [`next_ordinal`] makes one).
#[derive(Debug, Clone, Copy)]
pub(super) struct Next {
    token: i64,
    run_key: i64,
    ordinal: i64,
}

/// Reads the run's next ordinal under lease `fence`: [`StoreError::Fenced`] (checked first, as
/// for every write) or [`StoreError::RunNotFound`] instead. One statement, which only reads:
/// the inserts that follow are the write. The writer usually knows it from the run's last
/// append (see `known.rs`), and then reads nothing.
pub(super) fn next_ordinal(conn: &Db<'_>, errors: Mapper, run_id: &str, fence: u64) -> Result<Next, StoreError> {
    let token = stored_token(run_id, fence)?;
    if let Some((run_key, ordinal)) = conn.known().and_then(|known| known.next_ordinal(run_id, token)) {
        // As in `leases::known_to_hold`: every test checks what the writer knew.
        if cfg!(debug_assertions)
            && let Ok(read) = read_next(conn, run_id, token)
        {
            assert_eq!(
                read,
                (true, Some((run_key, ordinal))),
                "what the writer knew of run `{run_id}` under lease {token}"
            );
        }
        return Ok(Next { token, run_key, ordinal });
    }
    let (fence_holds, next) = read_next(conn, run_id, token).map_err(|e| errors.map(e))?;
    if !fence_holds {
        return Err(StoreError::Fenced { run_id: run_id.to_owned(), token: fence });
    }
    let (run_key, ordinal) = next.ok_or_else(|| StoreError::RunNotFound(run_id.to_owned()))?;
    Ok(Next { token, run_key, ordinal })
}

/// Whether lease `token` of run `run_id` holds, and the run's key and next ordinal (`None` when
/// the run does not exist).
fn read_next(conn: &Db<'_>, run_id: &str, token: i64) -> rusqlite::Result<(bool, Option<(i64, i64)>)> {
    // The next ordinal is read from the journal's primary key (one index probe) rather than
    // kept in the run's row: SQLite rewrites a whole row to update one column, so a counter
    // beside the run's state rewrote the state (a session's whole conversation) on every
    // append. The writer's transaction makes the read and the inserts one step.
    conn.prepared(NEXT_ORDINAL).and_then(|mut stmt| {
        stmt.query_row(params![run_id, token], |row| {
            let run_key: Option<i64> = row.get(1)?;
            Ok((row.get(0)?, run_key.map(|key| row.get(2).map(|next| (key, next))).transpose()?))
        })
    })
}

/// A run whose row this transaction has just inserted, as `run_key`, under lease `fence` has
/// an empty journal (a run's steps are deleted with it): the writer knows its first append's
/// ordinal, 0.
pub(super) fn created(conn: &Db<'_>, run_id: &str, run_key: i64, fence: u64) {
    if let Ok(token) = stored_token(run_id, fence) {
        conn.learn(|known| known.appended(run_id, token, run_key, 0));
    }
}

/// Whether the lease holds, the run's key (`NULL` when the run does not exist) and its
/// journal's next ordinal. The writer reads it only when it does not know them (see
/// `known.rs`): a run's first write after another connection's commit, or a lease taken back.
pub(super) const NEXT_ORDINAL: &str = concat!(
    "SELECT ",
    fence_holds!(2),
    ", run_key, coalesce((SELECT max(ordinal) + 1 FROM steps WHERE steps.run_key = k.run_key), 0)
     FROM (SELECT (SELECT run_key FROM runs WHERE run_id = ?1) AS run_key) AS k"
);

/// The rows of one journal write: a finished step first, if any, then intents. Two slices, so
/// that a response written with its calls' intents is not copied into one vector first, and
/// the epochs are checked in place, not collected: two allocations of every such write.
#[derive(Clone, Copy)]
pub(super) struct Rows<'a> {
    first: &'a [NewStep],
    rest: &'a [NewStep],
}

impl<'a> Rows<'a> {
    /// `first` (a finished step), then `rest`.
    pub(super) fn new(first: Option<&'a NewStep>, rest: &'a [NewStep]) -> Self {
        Self { first: first.map(std::slice::from_ref).unwrap_or_default(), rest }
    }

    /// Steps in one slice.
    pub(super) fn of(steps: &'a [NewStep]) -> Self {
        Self { first: &[], rest: steps }
    }

    fn len(self) -> usize {
        self.first.len() + self.rest.len()
    }

    fn iter(self) -> std::iter::Chain<std::slice::Iter<'a, NewStep>, std::slice::Iter<'a, NewStep>> {
        self.first.iter().chain(self.rest)
    }

    /// `LimitExceeded` for a step whose epoch is beyond SQLite's integers. The writes check it
    /// first, as when the epochs were collected before the job was queued, and `insert` again
    /// before its first row.
    pub(super) fn check_epochs(self) -> Result<(), StoreError> {
        self.iter().try_for_each(|step| to_i64("step epoch", step.epoch).map(drop))
    }
}

/// Inserts `steps` at the ordinals from `at` on, the first one finished with `outcome`
/// when there is one (a response journaled with its calls' intents); returns the ordinals.
/// Every step's epoch is checked before the first insert, and past one step so are the keys,
/// by reads, so that neither refuses the write after it changed a row (see `Writes::Direct`).
pub(super) fn insert(
    conn: &Db<'_>,
    errors: Mapper,
    run_id: &str,
    at: Next,
    steps: Rows<'_>,
    outcome: Option<(&PreparedOutcome, i64)>,
) -> Result<Vec<u64>, StoreError> {
    steps.check_epochs()?;
    if steps.len() > 1 {
        check_keys(conn, errors, run_id, at.run_key, steps)?;
    }
    let mut insert = conn.prepared(INSERT_STEP).map_err(|e| errors.map(e))?;
    let mut ordinals = Vec::with_capacity(steps.len());
    for (i, (ordinal, step)) in (at.ordinal..).zip(steps.iter()).enumerate() {
        // Cannot fail: checked above, before any row.
        let epoch = to_i64("step epoch", step.epoch)?;
        let (status, result, error, finished_at) = match outcome.filter(|_| i == 0) {
            None => ("running", None, None, None),
            Some(((status, result, error), finished_at)) => (
                *status,
                result.as_ref().map(JsonText::as_str),
                error.as_ref().map(JsonText::as_str),
                Some(finished_at),
            ),
        };
        let inserted = insert.execute(params![
            at.run_key,
            ordinal,
            StoredKey::of(&step.key),
            step.kind.as_str(),
            step.name,
            epoch,
            status,
            result,
            error,
            step.started_at_ms,
            finished_at
        ]);
        match inserted {
            Ok(_) => ordinals.push(to_u64("steps.ordinal", ordinal)?),
            Err(rusqlite::Error::SqliteFailure(e, _)) if e.extended_code == rusqlite::ffi::SQLITE_CONSTRAINT_UNIQUE => {
                return Err(StoreError::DuplicateKey { run_id: run_id.to_owned(), key: step.key.clone() });
            }
            Err(rusqlite::Error::SqliteFailure(e, _))
                if e.extended_code == rusqlite::ffi::SQLITE_CONSTRAINT_PRIMARYKEY =>
            {
                return Err(StoreError::Corrupt(
                    format!(
                        "run `{run_id}`: ordinal {ordinal} is already taken although it follows the journal's last"
                    )
                    .into(),
                ));
            }
            Err(e) => return Err(errors.map(e)),
        }
    }
    conn.learn(|known| known.appended(run_id, at.token, at.run_key, at.ordinal + ordinals.len() as i64));
    Ok(ordinals)
}

/// One journal row.
pub(super) const INSERT_STEP: &str =
    "INSERT INTO steps (run_key, ordinal, key, kind, name, epoch, status, result, error, started_at, finished_at)
     VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11)";

/// `DuplicateKey` for the first of `steps` whose key the journal holds, or an earlier step of
/// the same write: the step whose insert would have failed first.
fn check_keys(conn: &Db<'_>, errors: Mapper, run_id: &str, run_key: i64, steps: Rows<'_>) -> Result<(), StoreError> {
    let mut journaled = conn.prepared(KEY_TAKEN).map_err(|e| errors.map(e))?;
    let mut taken = |step: &NewStep| -> Result<bool, StoreError> {
        journaled.query_row(params![run_key, StoredKey::of(&step.key)], |row| row.get(0)).map_err(|e| errors.map(e))
    };
    let duplicate = |step: &NewStep| StoreError::DuplicateKey { run_id: run_id.to_owned(), key: step.key.clone() };
    // The first step is read only when a later one is refused: its own insert comes first, and
    // a refused first insert has changed nothing.
    for (i, step) in steps.iter().enumerate().skip(1) {
        if steps.iter().take(i).any(|earlier| earlier.key == step.key) || taken(step)? {
            return Err(match steps.iter().next() {
                Some(first) if taken(first)? => duplicate(first),
                _ => duplicate(step),
            });
        }
    }
    Ok(())
}

/// Whether the journal of the run keyed `?1` holds key `?2`.
pub(super) const KEY_TAKEN: &str = "SELECT EXISTS (SELECT 1 FROM steps WHERE run_key = ?1 AND key = ?2)";

/// Intents at the next ordinals, under lease `fence`.
pub(super) fn append(
    conn: &Db<'_>,
    errors: Mapper,
    run_id: &str,
    fence: u64,
    steps: &[NewStep],
) -> Result<Vec<u64>, StoreError> {
    let steps = Rows::of(steps);
    steps.check_epochs()?;
    let at = next_ordinal(conn, errors, run_id, fence)?;
    insert(conn, errors, run_id, at, steps, None)
}

/// A step outcome ready to write: `(status, result JSON, error JSON)`.
pub(super) type PreparedOutcome = (&'static str, Option<JsonText>, Option<JsonText>);

/// Finishes the `Running` step at `ordinal` under lease `fence`, in one statement that checks
/// the fence too (unless the writer knows it holds); only when it changed nothing do reads
/// tell why.
pub(super) fn finish(
    conn: &Db<'_>,
    errors: Mapper,
    run_id: &str,
    fence: u64,
    ordinal: u64,
    (status, result, error): &PreparedOutcome,
    finished_at_ms: i64,
) -> Result<(), StoreError> {
    let (result, error) = (result.as_ref().map(JsonText::as_str), error.as_ref().map(JsonText::as_str));
    let token = stored_token(run_id, fence)?;
    let fence_known = known_to_hold(conn, run_id, token);
    // An ordinal beyond SQLite's integers names no step.
    let stored_ordinal = i64::try_from(ordinal).unwrap_or(-1);
    // The run's key, when the writer knows it; the statement looks it up by the run's id when
    // it does not.
    let run_key = conn.known().and_then(|known| known.run_key(run_id));
    // As in `next_ordinal`: every test checks what the writer knew.
    if cfg!(debug_assertions)
        && let Some(known) = run_key
        && let Ok(read) =
            conn.prepared(RUN_KEY).and_then(|mut stmt| stmt.query_row([run_id], |row| row.get::<_, i64>(0)).optional())
    {
        assert_eq!(read, Some(known), "the key the writer knew of run `{run_id}`");
    }
    let updated = conn
        .prepared(if fence_known { FINISH_STEP_KNOWN_FENCE } else { FINISH_STEP })
        .and_then(|mut stmt| {
            stmt.execute(params![run_id, token, status, result, error, finished_at_ms, stored_ordinal, run_key])
        })
        .map_err(|e| errors.map(e))?;
    if updated == 1 {
        // The statement checked the fence: the writer knows it now (if it did not already).
        if !fence_known {
            conn.learn(|known| known.fence_held(run_id, token));
        }
        return Ok(());
    }
    check_fence(conn, errors, run_id, fence)?;
    match stored_version(conn, run_id, errors)? {
        None => Err(StoreError::RunNotFound(run_id.to_owned())),
        Some(_) => Err(StoreError::StepNotRunning { run_id: run_id.to_owned(), ordinal }),
    }
}

/// Run `?1`'s key in the file.
const RUN_KEY: &str = "SELECT run_key FROM runs WHERE run_id = ?1";

/// The update of [`FINISH_STEP`] and [`FINISH_STEP_KNOWN_FENCE`], without the fence.
macro_rules! finish_step_sql {
    () => {
        "UPDATE steps SET status = ?3, result = ?4, error = ?5, finished_at = ?6
         WHERE run_key = coalesce(?8, (SELECT run_key FROM runs WHERE run_id = ?1))
           AND ordinal = ?7 AND status = 'running'"
    };
}

/// Finishes a running step iff the lease `?2` of run `?1` holds.
pub(super) const FINISH_STEP: &str = concat!(finish_step_sql!(), " AND ", fence_holds!(2));

/// Finishes a running step of a run whose lease `?2` the writer knows to hold (`?2` is bound
/// and unused, so both statements take the same parameters).
pub(super) const FINISH_STEP_KNOWN_FENCE: &str = finish_step_sql!();

pub(super) fn steps(conn: &Db<'_>, errors: Mapper, run_id: &str) -> Result<Vec<StepRecord>, StoreError> {
    let mut stmt = conn
        .prepared(
            "SELECT ordinal, key, kind, name, epoch, status, result, error, started_at, finished_at
             FROM steps WHERE run_key = (SELECT run_key FROM runs WHERE run_id = ?1) ORDER BY ordinal",
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

#[cfg(test)]
mod tests {
    use rusqlite::{Connection, StatementStatus};

    use super::*;
    use crate::store::StepKind;
    use crate::stores::sqlite::{KEPT, SqliteOptions, schema::configure_writer};

    const ERRORS: Mapper = Mapper { busy_timeout: std::time::Duration::from_secs(1), max_size_bytes: None };

    /// An in-memory store's write connection.
    fn writer() -> Connection {
        let conn = Connection::open_in_memory().unwrap();
        configure_writer(&conn, &SqliteOptions::default(), ERRORS, None).unwrap();
        conn
    }

    /// A running run with its lease, token 1.
    fn leased_run(conn: &Connection, run_id: &str) {
        conn.execute(
            "INSERT INTO runs (run_id, agent_id, status, epoch, version, state, created_at, updated_at)
             VALUES (?1, 'a', 'running', 0, 0, '{}', 0, 0)",
            [run_id],
        )
        .unwrap();
        conn.execute(
            "INSERT INTO leases (run_id, owner, token, expires_at, released) VALUES (?1, 'me', 1, 0, 0)",
            [run_id],
        )
        .unwrap();
    }

    fn step(key: &str) -> NewStep {
        NewStep { key: key.into(), kind: StepKind::Tool, name: "t".into(), epoch: 0, started_at_ms: 0 }
    }

    /// Appending to runs in turn keeps each statement prepared: without the query planner's
    /// stability guarantee, SQLite re-planned the ordinal read at every new run id, on the
    /// writer thread (a tenth of its time at 10,000 runs in flight).
    #[test]
    fn appending_never_reprepares_a_statement() {
        let conn = writer();
        let db = Db::keeping(&conn, KEPT);
        for i in 0..20 {
            let run_id = format!("run-{i}");
            leased_run(&conn, &run_id);
            for n in 0..3 {
                assert_eq!(append(&db, ERRORS, &run_id, 1, &[step(&format!("k{n}"))]).unwrap(), [n]);
            }
        }
        let stmt = db.prepared(NEXT_ORDINAL).unwrap();
        assert!(matches!(stmt, super::super::prepared::Prepared::Kept(_)));
        assert_eq!(stmt.get_status(StatementStatus::RePrepare), 0);
    }

    /// A deleted run's journal is deleted with it, and the writer forgets its key: its lease
    /// (kept, and not released by the deletion) still finds no run.
    #[test]
    fn appending_to_a_deleted_run_is_run_not_found() {
        let conn = writer();
        let db = Db::keeping(&conn, KEPT);
        leased_run(&conn, "run-1");
        assert_eq!(append(&db, ERRORS, "run-1", 1, &[step("a")]).unwrap(), [0]);
        assert_eq!(append(&db, ERRORS, "run-1", 1, &[step("b")]).unwrap(), [1]);
        assert!(super::super::runs::delete_run(&db, ERRORS, "run-1").unwrap());
        assert_eq!(append(&db, ERRORS, "run-1", 1, &[step("c")]).unwrap_err(), StoreError::RunNotFound("run-1".into()));
        assert_eq!(
            append(&db, ERRORS, "run-1", 2, &[step("c")]).unwrap_err(),
            StoreError::Fenced { run_id: "run-1".into(), token: 2 },
            "the fence is still checked first"
        );
    }
}
