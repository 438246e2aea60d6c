//! The schema and its migrations, and the pragmas of the write connection.

use std::path::Path;

use rusqlite::{Connection, OptionalExtension};

use super::SqliteOptions;
use super::errors::Mapper;
use crate::store::StoreError;

/// The kuralle schema version this build reads and writes (kept in table `kuralle_schema`).
/// 1: runs and steps. 2: leases (one owner per run, fencing tokens). 3: a step's ordinal
/// follows the journal's last (`runs.next_ordinal` is no longer kept), so an older build, which
/// would hand out ordinals from that column, refuses the database instead. 4: the journal is
/// keyed by its run's integer key and holds digest keys as bytes ([`JOURNAL_BY_RUN_KEY`]).
pub(super) const SCHEMA_VERSION: i64 = 4;

/// Prepared statements a connection keeps: more than the store has.
pub(super) const STATEMENT_CACHE: usize = 64;

/// `MIGRATIONS[v - 1]` moves a store from version `v` to `v + 1`.
const MIGRATIONS: [&str; 3] = [LEASES, ORDINALS_FROM_STEPS, JOURNAL_BY_RUN_KEY];

/// The leases table.
macro_rules! leases_table {
    () => {
        "
CREATE TABLE leases (
    run_id TEXT PRIMARY KEY NOT NULL,
    owner TEXT NOT NULL,
    token INTEGER NOT NULL,
    expires_at INTEGER NOT NULL,
    released INTEGER NOT NULL DEFAULT 0
) WITHOUT ROWID;
"
    };
}

/// One row per run that was ever leased, kept after release and after the run is deleted so
/// tokens never go down. Times are ms since the Unix epoch by SQLite's clock.
///
/// Without a rowid, the table is one B-tree keyed by run id: the fence check every journal
/// write makes, and a lease's taking and release, find the row in one descent, where a rowid
/// table went through its primary-key index first and kept both trees on insert (4% of the
/// writer thread's instructions at 1,000 runs in flight). A lease row is small, as such a
/// table wants; the runs and the journal, whose rows hold a state or a result, keep their rowid.
const LEASES: &str = leases_table!();

/// The leases of a store made before [`LEASES`] had no rowid, copied into a table without one,
/// tokens included. In key order, the copy fills the new B-tree from left to right.
const REBUILD_LEASES: &str = concat!(
    "ALTER TABLE leases RENAME TO leases_with_rowid;",
    leases_table!(),
    "INSERT INTO leases (run_id, owner, token, expires_at, released)
     SELECT run_id, owner, token, expires_at, released FROM leases_with_rowid ORDER BY run_id;
     DROP TABLE leases_with_rowid;"
);

/// Nothing to change in the tables: the version alone tells older builds to keep out.
const ORDINALS_FROM_STEPS: &str = "UPDATE kuralle_schema SET version = version WHERE id = 1;";

/// The runs table, named `$name`.
///
/// `run_key` is the run's key inside the file: the journal refers to its run by it. It is an
/// alias of the rowid, which SQLite keeps through `VACUUM` only when it is declared so, and
/// `AUTOINCREMENT` keeps SQLite from handing a deleted run's key to the next run: a run's row
/// deleted behind kuralle's back (the `sqlite3` shell does not enforce the journal's foreign
/// key) leaves its steps, and a new run with its key would have read them as its own.
macro_rules! runs_table {
    ($name:literal) => {
        concat!(
            "CREATE TABLE ",
            $name,
            " (
    run_key INTEGER PRIMARY KEY AUTOINCREMENT,
    run_id TEXT NOT NULL UNIQUE,
    agent_id TEXT NOT NULL,
    status TEXT NOT NULL,
    epoch INTEGER NOT NULL,
    version INTEGER NOT NULL,
    state TEXT NOT NULL,
    created_at INTEGER NOT NULL,
    updated_at INTEGER NOT NULL
);
"
        )
    };
}

/// The journal, named `$name`: a run's steps by its `run_key` and ordinal, and by its key,
/// which is a blob for a digest (`codec::StoredKey`).
macro_rules! steps_table {
    ($name:literal) => {
        concat!(
            "CREATE TABLE ",
            $name,
            " (
    run_key INTEGER NOT NULL REFERENCES runs (run_key) ON DELETE CASCADE,
    ordinal INTEGER NOT NULL,
    key BLOB NOT NULL,
    kind TEXT NOT NULL,
    name TEXT NOT NULL,
    epoch INTEGER NOT NULL,
    status TEXT NOT NULL,
    result TEXT,
    error TEXT,
    started_at INTEGER NOT NULL,
    finished_at INTEGER,
    PRIMARY KEY (run_key, ordinal),
    UNIQUE (run_key, key)
);
"
        )
    };
}

/// The runs' indexes for listing, newest first.
macro_rules! runs_indexes {
    () => {
        "CREATE INDEX runs_by_updated ON runs (updated_at DESC, run_id);
CREATE INDEX runs_by_status_updated ON runs (status, updated_at DESC, run_id);
"
    };
}

const SCHEMA: &str = concat!(
    "CREATE TABLE kuralle_schema (
    id INTEGER PRIMARY KEY CHECK (id = 1),
    version INTEGER NOT NULL
);
",
    runs_table!("runs"),
    runs_indexes!(),
    steps_table!("steps"),
);

/// Version 3 to 4: the journal keyed by its run's integer key, its digest keys as bytes.
///
/// Until version 3 every journal row, and both of the journal's indexes, held the run's
/// 36-character text id, and its unique index the key's 64 characters of hex: about 100
/// bytes an index entry, where an integer and 32 bytes are about 40. At 10,000 runs in flight
/// that was a tenth to a fifth of the writer's CPU a run, and with random (UUID v4) run ids each
/// run's steps landed on pages scattered across the indexes. The runs table gets its key in
/// the same copy (it had none that `VACUUM` keeps), in the order the runs were made.
///
/// The copy holds the write lock for as long as it takes (it is as long as the journal); a
/// process that opens the store meanwhile waits up to its busy timeout. The new tables are
/// made under names of their own and renamed into place with `legacy_alter_table` on, so an
/// operator's views of `runs` or `steps` read the new tables (see `migrate`); an operator's
/// own triggers and indexes on them go with the old tables. Steps whose run's row is gone
/// (deleted behind kuralle's back) belong to no run and are not copied.
const JOURNAL_BY_RUN_KEY: &str = concat!(
    runs_table!("runs_v4"),
    "INSERT INTO runs_v4 (run_id, agent_id, status, epoch, version, state, created_at, updated_at)
     SELECT run_id, agent_id, status, epoch, version, state, created_at, updated_at FROM runs
     ORDER BY rowid;
",
    steps_table!("steps_v4"),
    // As `codec::StoredKey::of`: exactly 64 bytes that are the lowercase hex of the bytes they
    // spell. SQLite's `length`, `GLOB` and `unhex` stop at a NUL in a text, so the length is
    // the blob's and the hex is spelled back and compared in full.
    "INSERT INTO steps_v4 (run_key, ordinal, key, kind, name, epoch, status, result, error, started_at, finished_at)
     SELECT r.run_key, s.ordinal,
            CASE WHEN length(CAST(s.key AS BLOB)) = 64 AND lower(hex(unhex(s.key))) = s.key
                 THEN unhex(s.key) ELSE s.key END,
            s.kind, s.name, s.epoch, s.status, s.result, s.error, s.started_at, s.finished_at
     FROM steps s JOIN runs_v4 r ON r.run_id = s.run_id
     ORDER BY r.run_key, s.ordinal;
DROP TABLE steps;
DROP TABLE runs;
ALTER TABLE runs_v4 RENAME TO runs;
ALTER TABLE steps_v4 RENAME TO steps;
",
    runs_indexes!(),
);

/// Sets the pragmas of the write connection and checks or creates the schema.
pub(super) fn configure_writer(
    conn: &Connection,
    options: &SqliteOptions,
    errors: Mapper,
    path: Option<&Path>,
) -> Result<(), StoreError> {
    let fail = |e: rusqlite::Error| match path {
        Some(path) => errors.at_open(path, e),
        None => errors.map(e),
    };
    conn.busy_timeout(options.busy_timeout).map_err(fail)?;
    // Reading the header first turns "not a database" into a clear error before any pragma.
    let tables: Vec<String> = conn
        .prepare("SELECT name FROM sqlite_master WHERE type = 'table' AND name IN ('kuralle_schema', 'runs', 'steps')")
        .and_then(|mut stmt| stmt.query_map([], |row| row.get(0))?.collect())
        .map_err(fail)?;
    if path.is_some() {
        let mode: String = conn.query_row("PRAGMA journal_mode = WAL", [], |row| row.get(0)).map_err(fail)?;
        if !mode.eq_ignore_ascii_case("wal") {
            return Err(StoreError::Unavailable(
                format!("could not switch the database to WAL mode (mode is `{mode}`)").into(),
            ));
        }
    }
    conn.pragma_update(None, "synchronous", "FULL").map_err(fail)?;
    // The schema declares the journal's reference to its run, but the writer does not have
    // SQLite enforce it: a run's deletion deletes its steps first (`runs::delete_run`), and
    // every insert of a step follows its run's key, which the writer read from the run's row
    // in this transaction or learned at an earlier write since (`steps::next_ordinal`;
    // `RunNotFound` when the row is gone), so the check was a second probe of the runs' index
    // per journal row: 3% of the writer's instructions at 1,000 runs in flight.
    conn.pragma_update(None, "foreign_keys", "OFF").map_err(fail)?;
    // A write in a savepoint (or a statement SQLite journals) keeps a sub-journal (the pages
    // it changed first), which spills to a temporary file past 64 KiB unless temporary
    // storage is in memory; once a file, it stays one, and every such write paid file writes
    // for it.
    conn.pragma_update(None, "temp_store", "MEMORY").map_err(fail)?;
    stable_plans(conn).map_err(fail)?;
    // The writer keeps its hot statements prepared itself (`prepared::Db`); the rest, about 20
    // more, come from rusqlite's cache, which keeps 16 by default: a miss re-parses SQL on the
    // only write thread.
    conn.set_prepared_statement_cache_capacity(STATEMENT_CACHE);
    // A negative `cache_size` is KiB. SQLite reads it as a 32-bit number, and a larger one
    // would wrap to a tiny cache: clamped there (2 TiB).
    let cache_kib = i64::try_from(options.page_cache_bytes / 1024).unwrap_or(i64::MAX).min(i64::from(i32::MAX));
    conn.pragma_update(None, "cache_size", -cache_kib).map_err(fail)?;
    if tables.iter().any(|table| table == "kuralle_schema") {
        check_schema_version(conn, fail)?;
    } else {
        create_schema(conn, fail)?;
    }
    leases_without_rowid(conn, fail)?;
    if let Some(bytes) = options.max_size_bytes {
        // Per connection, and only this one writes. SQLite keeps a cap below the current size
        // at the current size.
        let page_size: u32 = conn.query_row("PRAGMA page_size", [], |row| row.get(0)).map_err(fail)?;
        let pages = i64::try_from((bytes / u64::from(page_size.max(1))).max(1)).unwrap_or(i64::MAX);
        conn.query_row(&format!("PRAGMA max_page_count = {pages}"), [], |_| Ok(())).map_err(fail)?;
    }
    Ok(())
}

/// Turns on SQLite's query planner stability guarantee: a statement keeps the plan it was
/// prepared with. Without it SQLite marks a statement whose plan may depend on a bound value
/// (the journal's `max(ordinal)` by run id) to be re-prepared whenever that value changes: at
/// almost every write, on the writer thread. Every statement here looks rows up by key, so the
/// value-blind plan is the right one.
pub(super) fn stable_plans(conn: &Connection) -> rusqlite::Result<()> {
    conn.set_db_config(rusqlite::config::DbConfig::SQLITE_DBCONFIG_ENABLE_QPSG, true).map(|_| ())
}

/// Reads the stored version; migrates an older store in one transaction (another process may
/// migrate it at the same time: the version is read again under the write lock).
fn check_schema_version(
    conn: &Connection,
    fail: impl Fn(rusqlite::Error) -> StoreError + Copy,
) -> Result<(), StoreError> {
    match stored_version(conn, fail)? {
        SCHEMA_VERSION => Ok(()),
        version if version > SCHEMA_VERSION => Err(newer(version)),
        _ => {
            // A migration renames its new tables into place: the legacy rename leaves an
            // operator's views naming `runs` and `steps` as they are, to read the new tables.
            conn.pragma_update(None, "legacy_alter_table", "ON").map_err(fail)?;
            let migrated = migrate(conn, fail);
            let restored = conn.pragma_update(None, "legacy_alter_table", "OFF").map_err(fail);
            migrated.and(restored)
        }
    }
}

/// Moves the store to [`SCHEMA_VERSION`] in one transaction.
fn migrate(conn: &Connection, fail: impl Fn(rusqlite::Error) -> StoreError + Copy) -> Result<(), StoreError> {
    conn.execute_batch("BEGIN IMMEDIATE").map_err(fail)?;
    let migrated = (|| {
        let mut version = stored_version(conn, fail)?;
        if version > SCHEMA_VERSION {
            return Err(newer(version));
        }
        while version < SCHEMA_VERSION {
            let step = usize::try_from(version - 1).ok().and_then(|i| MIGRATIONS.get(i)).ok_or_else(|| {
                StoreError::Corrupt(
                    format!(
                        "the database has kuralle schema version {version}, which this kuralle cannot migrate \
                     (it supports version {SCHEMA_VERSION})"
                    )
                    .into(),
                )
            })?;
            conn.execute_batch(step).map_err(fail)?;
            version += 1;
            tracing::info!(version, "migrated the SQLite store schema");
        }
        conn.execute("UPDATE kuralle_schema SET version = ?1 WHERE id = 1", [SCHEMA_VERSION]).map_err(fail)?;
        Ok(())
    })();
    match migrated {
        Ok(()) => conn.execute_batch("COMMIT").map_err(fail),
        Err(e) => {
            let _ = conn.execute_batch("ROLLBACK");
            Err(e)
        }
    }
}

/// Rebuilds the leases table without a rowid, once, in a store whose table has one (every
/// store made before this build). The columns and their meaning are the same, so the schema
/// version stays: an older build still reads and writes the store, and a rolling upgrade never
/// meets a store that some of its processes refuse.
///
/// The copy holds the write lock for as long as it takes (it is as long as the number of runs
/// ever leased); a process that opens the store meanwhile waits up to its busy timeout.
/// `legacy_alter_table` keeps the rename from rewriting an operator's views of `leases` to
/// the old name: they read the new table.
fn leases_without_rowid(
    conn: &Connection,
    fail: impl Fn(rusqlite::Error) -> StoreError + Copy,
) -> Result<(), StoreError> {
    let has_rowid = || -> rusqlite::Result<bool> {
        let sql: Option<String> = conn
            .query_row("SELECT sql FROM sqlite_master WHERE type = 'table' AND name = 'leases'", [], |row| row.get(0))
            .optional()?;
        Ok(sql.is_some_and(|sql| !sql.to_ascii_uppercase().contains("WITHOUT ROWID")))
    };
    if !has_rowid().map_err(fail)? {
        return Ok(());
    }
    conn.pragma_update(None, "legacy_alter_table", "ON").map_err(fail)?;
    let rebuilt = (|| {
        conn.execute_batch("BEGIN IMMEDIATE")?;
        // Another process may have rebuilt it between our check and our lock.
        let copied = has_rowid().and_then(|rowid| {
            if rowid {
                conn.execute_batch(REBUILD_LEASES)?;
                conn.query_row("SELECT count(*) FROM leases", [], |row| row.get::<_, i64>(0)).map(Some)
            } else {
                Ok(None)
            }
        });
        match copied {
            Ok(copied) => {
                conn.execute_batch("COMMIT")?;
                if let Some(leases) = copied {
                    tracing::info!(leases, "moved the SQLite store's leases into a table without a rowid");
                }
                Ok(())
            }
            Err(e) => {
                let _ = conn.execute_batch("ROLLBACK");
                Err(e)
            }
        }
    })();
    let restored = conn.pragma_update(None, "legacy_alter_table", "OFF");
    rebuilt.and(restored).map_err(fail)
}

fn stored_version(conn: &Connection, fail: impl Fn(rusqlite::Error) -> StoreError) -> Result<i64, StoreError> {
    let version: Option<i64> = conn
        .query_row("SELECT version FROM kuralle_schema WHERE id = 1", [], |row| row.get(0))
        .optional()
        .map_err(fail)?;
    version.ok_or_else(|| StoreError::Corrupt("table `kuralle_schema` exists but holds no version".into()))
}

fn newer(version: i64) -> StoreError {
    StoreError::Corrupt(
        format!(
            "the database has kuralle schema version {version}, newer than the version {SCHEMA_VERSION} this \
         kuralle supports; upgrade kuralle to open it"
        )
        .into(),
    )
}

fn create_schema(conn: &Connection, fail: impl Fn(rusqlite::Error) -> StoreError + Copy) -> Result<(), StoreError> {
    conn.execute_batch("BEGIN IMMEDIATE").map_err(fail)?;
    let created = (|| {
        // Another process may have created it between our check and our lock.
        let tables: Vec<String> = conn
            .prepare(
                "SELECT name FROM sqlite_master WHERE type = 'table' AND name IN ('kuralle_schema', 'runs', 'steps')",
            )
            .and_then(|mut stmt| stmt.query_map([], |row| row.get(0))?.collect())
            .map_err(fail)?;
        if tables.iter().any(|table| table == "kuralle_schema") {
            return Ok(false);
        }
        if let Some(table) = tables.first() {
            return Err(StoreError::Corrupt(
                format!(
                    "the database has a table `{table}` that is not kuralle's (no `kuralle_schema` table); \
                 use another file for the kuralle store"
                )
                .into(),
            ));
        }
        conn.execute_batch(SCHEMA).map_err(fail)?;
        conn.execute_batch(LEASES).map_err(fail)?;
        conn.execute("INSERT INTO kuralle_schema (id, version) VALUES (1, ?1)", [SCHEMA_VERSION]).map_err(fail)?;
        Ok(true)
    })();
    match created {
        Ok(true) => conn.execute_batch("COMMIT").map_err(fail),
        // Another process created it between our check and our lock: check (or migrate) it.
        Ok(false) => {
            conn.execute_batch("COMMIT").map_err(fail)?;
            check_schema_version(conn, fail)
        }
        Err(e) => {
            let _ = conn.execute_batch("ROLLBACK");
            Err(e)
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::stores::sqlite::{leases, prepared::Db};

    /// A store whose leases are in a rowid table (made by an earlier build) has them moved into
    /// a table without one on open, tokens included, so the next lease's token still grows; an
    /// operator's view of the table reads the new one; the schema version does not change.
    #[test]
    fn a_store_with_rowid_leases_keeps_its_tokens_and_views_through_the_rebuild() {
        let conn = Connection::open_in_memory().unwrap();
        conn.execute_batch(SCHEMA).unwrap();
        conn.execute_batch(
            "CREATE TABLE leases (
                run_id TEXT PRIMARY KEY NOT NULL,
                owner TEXT NOT NULL,
                token INTEGER NOT NULL,
                expires_at INTEGER NOT NULL,
                released INTEGER NOT NULL DEFAULT 0
             );
             INSERT INTO leases VALUES ('run-1', 'gone', 7, 0, 1);
             CREATE VIEW held AS SELECT run_id FROM leases WHERE released = 0;
             INSERT INTO kuralle_schema (id, version) VALUES (1, 4);",
        )
        .unwrap();
        let errors = Mapper { busy_timeout: Duration::from_secs(1), max_size_bytes: None };
        configure_writer(&conn, &SqliteOptions::default(), errors, None).unwrap();

        let version: i64 = conn.query_row("SELECT version FROM kuralle_schema", [], |row| row.get(0)).unwrap();
        assert_eq!(version, SCHEMA_VERSION, "older builds still open the store");
        let tables: Vec<(String, String)> = conn
            .prepare("SELECT name, sql FROM sqlite_master WHERE type = 'table' AND name LIKE 'leases%'")
            .unwrap()
            .query_map([], |row| Ok((row.get(0)?, row.get(1)?)))
            .unwrap()
            .collect::<Result<_, _>>()
            .unwrap();
        assert_eq!(tables.len(), 1, "{tables:?}");
        assert_eq!(tables[0].0, "leases");
        assert!(tables[0].1.contains("WITHOUT ROWID"), "{}", tables[0].1);
        let lease = leases::acquire(&Db::new(&conn), errors, "run-1", "me", 60_000).unwrap();
        assert_eq!(lease.token, 8, "the token grows from the one kept");
        let held = super::super::column::<String>(&conn, "SELECT run_id FROM held");
        assert_eq!(held, ["run-1"], "the view reads the new table");
        let legacy: i64 = conn.query_row("PRAGMA legacy_alter_table", [], |row| row.get(0)).unwrap();
        assert_eq!(legacy, 0, "the connection is left as it was");
    }

    /// The tables of schema version 3, as that release made them.
    const SCHEMA_V3: &str = "
CREATE TABLE kuralle_schema (id INTEGER PRIMARY KEY CHECK (id = 1), version INTEGER NOT NULL);
CREATE TABLE runs (
    run_id TEXT PRIMARY KEY NOT NULL,
    agent_id TEXT NOT NULL,
    status TEXT NOT NULL,
    epoch INTEGER NOT NULL,
    version INTEGER NOT NULL,
    next_ordinal INTEGER NOT NULL DEFAULT 0,
    state TEXT NOT NULL,
    created_at INTEGER NOT NULL,
    updated_at INTEGER NOT NULL
);
CREATE INDEX runs_by_updated ON runs (updated_at DESC, run_id);
CREATE INDEX runs_by_status_updated ON runs (status, updated_at DESC, run_id);
CREATE TABLE steps (
    run_id TEXT NOT NULL REFERENCES runs (run_id) ON DELETE CASCADE,
    ordinal INTEGER NOT NULL,
    key TEXT NOT NULL,
    kind TEXT NOT NULL,
    name TEXT NOT NULL,
    epoch INTEGER NOT NULL,
    status TEXT NOT NULL,
    result TEXT,
    error TEXT,
    started_at INTEGER NOT NULL,
    finished_at INTEGER,
    PRIMARY KEY (run_id, ordinal),
    UNIQUE (run_id, key)
);
INSERT INTO kuralle_schema (id, version) VALUES (1, 3);
";

    /// A store of schema version 3 is migrated on open: each run gets a key in the order the
    /// runs were made, every step keeps its ordinal, its key as written (a digest's hex as
    /// bytes, any other text as text) and everything else; duplicate keys are still refused,
    /// across the keys written before and after; ordinals go on; views of the tables read the
    /// new ones; the listing indexes are back.
    #[test]
    fn a_version_3_store_keys_its_journal_by_run_and_keeps_every_step() {
        use crate::store::{NewStep, StepKind, StepStatus, StoreError};
        use crate::stores::sqlite::{KEPT, steps};

        let digest = crate::keymap::hex(&[0xab; 32]);
        let capitals = digest.to_ascii_uppercase();
        let fs = "f".repeat(64);
        // SQLite's `length`, `GLOB` and `unhex` stop at a NUL: this key must stay text.
        let nul = format!("{fs}\0z");
        let not_hex = "g".repeat(64);
        let conn = Connection::open_in_memory().unwrap();
        conn.execute_batch(SCHEMA_V3).unwrap();
        conn.execute_batch(LEASES).unwrap();
        for (i, run_id) in (0_i64..).zip(["run-b", "run-a"]) {
            conn.execute(
                "INSERT INTO runs (run_id, agent_id, status, epoch, version, state, created_at, updated_at)
                 VALUES (?1, ?2, 'running', ?3, ?4, ?5, ?6, ?7)",
                rusqlite::params![
                    run_id,
                    format!("agent-{i}"),
                    5 + i,
                    9 + i,
                    format!("{{\"n\":{i}}}"),
                    100 + i,
                    200 + i
                ],
            )
            .unwrap();
            conn.execute("INSERT INTO leases (run_id, owner, token, expires_at) VALUES (?1, 'me', 1, 0)", [run_id])
                .unwrap();
        }
        // A step of no run, as a deletion that did not enforce the foreign key leaves one.
        conn.pragma_update(None, "foreign_keys", "OFF").unwrap();
        // (run, ordinal, key, status, result, error, finished_at)
        type Row<'a> = (&'a str, i64, &'a str, &'a str, Option<&'a str>, Option<&'a str>, Option<i64>);
        let steps_v3: [Row<'_>; 8] = [
            ("run-a", 0, &digest, "finished", Some("\"paid\""), None, Some(8)),
            ("run-a", 1, "k1", "running", None, None, None),
            ("run-a", 2, &capitals, "failed", None, Some("{\"kind\":\"timeout\"}"), Some(9)),
            ("run-a", 3, &nul, "finished", Some("3"), None, Some(10)),
            ("run-a", 4, &fs, "finished", Some("4"), None, Some(11)),
            ("run-a", 5, &not_hex, "running", None, None, None),
            ("run-b", 0, &digest, "finished", Some("1"), None, Some(12)),
            ("run-gone", 0, "orphan", "running", None, None, None),
        ];
        for (run_id, ordinal, key, status, result, error, finished_at) in steps_v3 {
            conn.execute(
                "INSERT INTO steps (run_id, ordinal, key, kind, name, epoch, status, result, error, started_at, finished_at)
                 VALUES (?1, ?2, ?3, 'tool', 'charge', 2, ?4, ?5, ?6, 7, ?7)",
                rusqlite::params![run_id, ordinal, key, status, result, error, finished_at],
            )
            .unwrap();
        }
        conn.execute_batch("CREATE VIEW running AS SELECT run_id FROM runs WHERE status = 'running'").unwrap();

        let errors = Mapper { busy_timeout: Duration::from_secs(1), max_size_bytes: None };
        configure_writer(&conn, &SqliteOptions::default(), errors, None).unwrap();

        assert_eq!(stored_version(&conn, |e| errors.map(e)).unwrap(), SCHEMA_VERSION);
        let keyed = super::super::column::<String>(&conn, "SELECT run_id FROM runs ORDER BY run_key");
        assert_eq!(keyed, ["run-b", "run-a"], "keys in the order the runs were made");
        let db = Db::keeping(&conn, KEPT);
        for (i, run_id) in (0_i64..).zip(["run-b", "run-a"]) {
            let run = crate::stores::sqlite::runs::get_run(&db, errors, run_id).unwrap().unwrap();
            let read = (run.agent_id, run.epoch, run.version, run.state.as_str().to_owned());
            assert_eq!(read, (format!("agent-{i}"), 5 + i as u64, 9 + i as u64, format!("{{\"n\":{i}}}")));
            assert_eq!((run.created_at_ms, run.updated_at_ms), (100 + i, 200 + i));
        }
        let kinds = super::super::column::<String>(&conn, "SELECT typeof(key) FROM steps ORDER BY run_key, ordinal");
        assert_eq!(kinds, ["blob", "blob", "text", "text", "text", "blob", "text"], "run-b's, then run-a's");
        let orphans = super::super::column::<i64>(&conn, "SELECT count(*) FROM steps WHERE key = 'orphan'");
        assert_eq!(orphans, [0], "a step of no run is not copied");
        for run_id in ["run-a", "run-b"] {
            let read: Vec<_> = steps::steps(&db, errors, run_id)
                .unwrap()
                .into_iter()
                .map(|step| {
                    assert_eq!(
                        (step.kind, step.name.as_str(), step.epoch, step.started_at_ms),
                        (StepKind::Tool, "charge", 2, 7)
                    );
                    (
                        step.ordinal as i64,
                        step.key,
                        step.status.as_str(),
                        step.result.map(|json| json.as_str().to_owned()),
                        step.error.map(|json| json.as_str().to_owned()),
                        step.finished_at_ms,
                    )
                })
                .collect();
            let written: Vec<_> = steps_v3
                .iter()
                .filter(|step| step.0 == run_id)
                .map(|&(_, ordinal, key, status, result, error, finished_at)| {
                    (ordinal, key.to_owned(), status, result.map(str::to_owned), error.map(str::to_owned), finished_at)
                })
                .collect();
            assert_eq!(read, written, "every step of {run_id} as it was written");
        }
        let journal = steps::steps(&db, errors, "run-a").unwrap();
        assert_eq!(journal[2].status, StepStatus::Failed);

        let step =
            |key: &str| NewStep { key: key.into(), kind: StepKind::Tool, name: "t".into(), epoch: 0, started_at_ms: 0 };
        for taken in [digest.as_str(), "k1", capitals.as_str(), nul.as_str(), fs.as_str(), not_hex.as_str()] {
            assert_eq!(
                steps::append(&db, errors, "run-a", 1, &[step(taken)]).unwrap_err(),
                StoreError::DuplicateKey { run_id: "run-a".into(), key: taken.into() },
                "a key written before the migration is still taken"
            );
        }
        let fresh = crate::keymap::hex(&[0xcd; 32]);
        assert_eq!(steps::append(&db, errors, "run-a", 1, &[step(&fresh), step("k2")]).unwrap(), [6, 7]);
        assert_eq!(
            steps::append(&db, errors, "run-a", 1, &[step("k3"), step(&fresh)]).unwrap_err(),
            StoreError::DuplicateKey { run_id: "run-a".into(), key: fresh.clone() },
            "and one written after it"
        );
        assert_eq!(steps::steps(&db, errors, "run-a").unwrap()[6].key, fresh);

        let running = super::super::column::<String>(&conn, "SELECT run_id FROM running ORDER BY run_id");
        assert_eq!(running, ["run-a", "run-b"], "the view reads the new table");
        let indexes = super::super::column::<String>(
            &conn,
            "SELECT name FROM sqlite_master WHERE type = 'index' AND name LIKE 'runs_by%' ORDER BY name",
        );
        assert_eq!(indexes, ["runs_by_status_updated", "runs_by_updated"]);
        let leftovers = super::super::column::<String>(
            &conn,
            "SELECT name FROM sqlite_master WHERE name LIKE '%v4%' OR name LIKE '%v3%'",
        );
        assert!(leftovers.is_empty(), "{leftovers:?}");
        let legacy: i64 = conn.query_row("PRAGMA legacy_alter_table", [], |row| row.get(0)).unwrap();
        assert_eq!(legacy, 0, "the connection is left as it was");
        let check: String = conn.query_row("PRAGMA integrity_check", [], |row| row.get(0)).unwrap();
        assert_eq!(check, "ok");
    }

    /// A migration that fails leaves the store as it was: version 3, every row, and the
    /// connection's `legacy_alter_table` off.
    #[test]
    fn a_failed_migration_leaves_the_version_3_store_as_it_was() {
        let conn = Connection::open_in_memory().unwrap();
        conn.execute_batch(SCHEMA_V3).unwrap();
        conn.execute_batch(LEASES).unwrap();
        conn.execute_batch(
            "INSERT INTO runs (run_id, agent_id, status, epoch, version, state, created_at, updated_at)
             VALUES ('run-1', 'a', 'running', 0, 0, '{}', 0, 0);
             INSERT INTO steps (run_id, ordinal, key, kind, name, epoch, status, started_at)
             VALUES ('run-1', 0, 'k', 'tool', 't', 0, 'running', 0);
             CREATE TABLE runs_v4 (in_the_way INTEGER);",
        )
        .unwrap();
        let errors = Mapper { busy_timeout: Duration::from_secs(1), max_size_bytes: None };
        let refused = configure_writer(&conn, &SqliteOptions::default(), errors, None).unwrap_err();
        assert!(refused.to_string().contains("runs_v4"), "{refused}");
        assert_eq!(stored_version(&conn, |e| errors.map(e)).unwrap(), 3);
        assert_eq!(super::super::column::<String>(&conn, "SELECT key FROM steps WHERE run_id = 'run-1'"), ["k"]);
        let legacy: i64 = conn.query_row("PRAGMA legacy_alter_table", [], |row| row.get(0)).unwrap();
        assert_eq!(legacy, 0);
    }

    /// A new store creates the leases table without a rowid at once.
    #[test]
    fn a_new_store_keeps_leases_without_a_rowid() {
        let conn = Connection::open_in_memory().unwrap();
        let errors = Mapper { busy_timeout: Duration::from_secs(1), max_size_bytes: None };
        configure_writer(&conn, &SqliteOptions::default(), errors, None).unwrap();
        let sql: String =
            conn.query_row("SELECT sql FROM sqlite_master WHERE name = 'leases'", [], |row| row.get(0)).unwrap();
        assert!(sql.contains("WITHOUT ROWID"), "{sql}");
    }

    /// The write connection keeps the page cache the options give, in KiB (SQLite's negative
    /// `cache_size`): 8 MiB by default, whole KiB, and no more than SQLite's 32-bit count.
    #[test]
    fn the_writer_keeps_the_page_cache_the_options_give() {
        let errors = Mapper { busy_timeout: Duration::from_secs(1), max_size_bytes: None };
        let cache_size = |page_cache_bytes: u64| {
            let conn = Connection::open_in_memory().unwrap();
            configure_writer(&conn, &SqliteOptions { page_cache_bytes, ..SqliteOptions::default() }, errors, None)
                .unwrap();
            conn.query_row("PRAGMA cache_size", [], |row| row.get::<_, i64>(0)).unwrap()
        };
        assert_eq!(cache_size(SqliteOptions::default().page_cache_bytes), -8192);
        assert_eq!(cache_size(16 << 20), -16384);
        assert_eq!(cache_size((4 << 20) + 1023), -4096);
        assert_eq!(cache_size(u64::MAX), -i64::from(i32::MAX));
    }
}
