//! The schema and its migrations.
//!
//! The tables live in one PostgreSQL schema (`public` by default). `kuralle_schema_version`
//! records which of [`MIGRATIONS`] have been applied; [`migrate`] applies the missing ones in
//! one transaction under a transaction-scoped advisory lock, so any number of processes may
//! connect (and migrate) at once: the first does the work, the others wait for it and then
//! find nothing to do. A database migrated by a newer build is refused, not downgraded.

use deadpool_postgres::Object;

use super::errors;
use crate::store::StoreError;

/// Migrations in order; entry `i` takes the schema from version `i` to `i + 1`. `{s}` stands
/// for the quoted schema name.
pub(super) const MIGRATIONS: &[&str] = &[
    // 1: runs and their journals.
    "CREATE TABLE {s}.kuralle_runs (
        run_id text PRIMARY KEY,
        agent_id text NOT NULL,
        status text NOT NULL,
        epoch bigint NOT NULL,
        version bigint NOT NULL,
        next_ordinal bigint NOT NULL DEFAULT 0,
        state jsonb NOT NULL,
        created_at bigint NOT NULL,
        updated_at bigint NOT NULL
    );
    CREATE INDEX kuralle_runs_by_updated ON {s}.kuralle_runs (updated_at DESC, run_id);
    CREATE INDEX kuralle_runs_by_status ON {s}.kuralle_runs (status, updated_at DESC, run_id);
    CREATE TABLE {s}.kuralle_steps (
        run_id text NOT NULL REFERENCES {s}.kuralle_runs (run_id) ON DELETE CASCADE,
        ordinal bigint NOT NULL,
        key text NOT NULL,
        kind text NOT NULL,
        name text NOT NULL,
        epoch bigint NOT NULL,
        status text NOT NULL,
        result jsonb,
        error jsonb,
        started_at bigint NOT NULL,
        finished_at bigint,
        PRIMARY KEY (run_id, ordinal),
        UNIQUE (run_id, key)
    );",
    // 2: leases with fencing tokens. A lease row outlives its run (and may precede it): the
    // token only ever grows.
    "CREATE TABLE {s}.kuralle_leases (
        run_id text PRIMARY KEY,
        owner text NOT NULL,
        token bigint NOT NULL,
        expires_at timestamptz NOT NULL,
        released boolean NOT NULL DEFAULT false
    );",
    // 3: the work queue: runnable runs (status `running`, no live lease) in submission order.
    "CREATE INDEX kuralle_runs_runnable ON {s}.kuralle_runs (updated_at, run_id) WHERE status = 'running';",
    // 4: instances: which backend holds each instance id's session advisory lock (written
    // under the lock; for operators, and to tell a hash collision from a live holder).
    "CREATE TABLE {s}.kuralle_instances (
        instance_id text PRIMARY KEY,
        backend_pid integer NOT NULL,
        claimed_at timestamptz NOT NULL
    );",
    // 5: no foreign key from steps to runs. Its check (a nested query and a row lock per
    // inserted step) was a sixth of a journal write's server time, for a guarantee the
    // writes already give: a step is inserted only by the statement that reserved its
    // ordinal on the run's row, and `delete_run` deletes the journal with the run.
    "ALTER TABLE {s}.kuralle_steps DROP CONSTRAINT IF EXISTS kuralle_steps_run_id_fkey;",
];

/// The schema version this build reads and writes.
pub(super) const SCHEMA_VERSION: i32 = MIGRATIONS.len() as i32;

/// Arbitrary first key of the migration advisory lock (the second is the schema's hash), so
/// that it does not collide with an application's own advisory locks by accident.
const LOCK_CLASS: i32 = 0x6b75_7261; // "kura"

/// `"name"`, with embedded quotes doubled.
pub(super) fn quote_ident(name: &str) -> String {
    format!("\"{}\"", name.replace('"', "\"\""))
}

/// Brings the schema `schema` to [`SCHEMA_VERSION`]; returns the version found before.
pub(super) async fn migrate(client: &mut Object, schema: &str) -> Result<i32, StoreError> {
    let s = quote_ident(schema);
    let tx = client.transaction().await.map_err(errors::map)?;
    tx.execute("SELECT pg_advisory_xact_lock($1, hashtext($2))", &[&LOCK_CLASS, &schema]).await.map_err(errors::map)?;
    tx.batch_execute(&format!(
        "CREATE SCHEMA IF NOT EXISTS {s};
         CREATE TABLE IF NOT EXISTS {s}.kuralle_schema_version (
             id integer PRIMARY KEY CHECK (id = 1),
             version integer NOT NULL,
             migrated_at timestamptz NOT NULL DEFAULT now()
         );"
    ))
    .await
    .map_err(errors::map)?;
    let row = tx
        .query_opt(&format!("SELECT version FROM {s}.kuralle_schema_version WHERE id = 1"), &[])
        .await
        .map_err(errors::map)?;
    let found: i32 = match row {
        Some(row) => row.try_get(0).map_err(errors::map)?,
        None => 0,
    };
    if found > SCHEMA_VERSION {
        return Err(StoreError::Corrupt(
            format!(
                "schema {schema} has kuralle schema version {found}, newer than the version {SCHEMA_VERSION} this \
             kuralle supports; upgrade kuralle to use it"
            )
            .into(),
        ));
    }
    if found < 0 {
        return Err(StoreError::Corrupt(
            format!("schema {schema} records a negative kuralle schema version {found}").into(),
        ));
    }
    if found == 0 {
        let foreign = tx
            .query_opt(
                "SELECT table_name::text FROM information_schema.tables
                 WHERE table_schema = $1 AND table_name IN ('kuralle_runs', 'kuralle_steps', 'kuralle_leases')",
                &[&schema],
            )
            .await
            .map_err(errors::map)?;
        if let Some(row) = foreign {
            let table: String = row.try_get(0).map_err(errors::map)?;
            return Err(StoreError::Corrupt(
                format!(
                    "schema {schema} has a table `{table}` but no kuralle schema version; it was not created by kuralle"
                )
                .into(),
            ));
        }
    }
    for (from, migration) in MIGRATIONS.iter().enumerate().skip(found as usize) {
        tracing::info!(schema, from, to = from + 1, "migrating the kuralle PostgreSQL schema");
        tx.batch_execute(&migration.replace("{s}", &s)).await.map_err(errors::map)?;
    }
    if found < SCHEMA_VERSION {
        tx.execute(
            &format!(
                "INSERT INTO {s}.kuralle_schema_version (id, version) VALUES (1, $1)
                 ON CONFLICT (id) DO UPDATE SET version = EXCLUDED.version, migrated_at = now()"
            ),
            &[&SCHEMA_VERSION],
        )
        .await
        .map_err(errors::map)?;
    }
    tx.commit().await.map_err(errors::map)?;
    Ok(found)
}
