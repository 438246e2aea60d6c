//! Every statement the store runs, bound to one schema.
//!
//! Writes that belong to a run start with the same two CTEs: `fence` share-locks the run's
//! lease row if its token is the writer's and it is not released, and `ok` says whether the
//! write may go ahead (always, for an unfenced administrative write with a `NULL` token). The
//! share lock is held until the write commits, so an `acquire` that would take the lease over
//! waits for in-flight writes of the old holder and then sees them: a write is either
//! committed before the takeover or rejected. One statement, one round trip, one commit.

/// The fence prelude; `$1` is the run id and `$2` the writer's token (`NULL`: unfenced).
const FENCE: &str = "fence AS MATERIALIZED (
        SELECT 1 FROM {s}.kuralle_leases WHERE run_id = $1 AND token = $2::int8 AND NOT released FOR SHARE
    ),
    ok AS (SELECT $2::int8 IS NULL OR EXISTS (SELECT 1 FROM fence) AS ok)";

/// The fence prelude of a write of many runs, after a `req` CTE with one row per write
/// (`run_id`, `token`, and `i`, its position): `fence` share-locks the lease rows whose tokens
/// match, in `run_id` order (as the batched renewal locks its rows, so the two do not deadlock
/// on each other), and `ok` keeps the writes that may go ahead.
const FENCES: &str = "fence AS MATERIALIZED (
        SELECT r.i FROM req r
        JOIN {s}.kuralle_leases l ON l.run_id = r.run_id AND l.token = r.token AND NOT l.released
        ORDER BY l.run_id
        FOR SHARE OF l
    ),
    ok AS MATERIALIZED (SELECT r.* FROM req r WHERE r.token IS NULL OR r.i IN (SELECT i FROM fence))";

/// The run row's fenced, versioned update (after the fence prelude), shared by `put_run` and
/// `put_run_release`; `upd` has a row when the run was written.
const PUT_RUN: &str = "upd AS (
        UPDATE {s}.kuralle_runs
        SET agent_id = $3, status = $4, epoch = $5, version = $6, state = $7, updated_at = $8
        WHERE run_id = $1 AND version = $9 AND (SELECT ok FROM ok)
        RETURNING 1
    )";

/// Milliseconds since the Unix epoch of a `timestamptz` expression.
macro_rules! ms {
    ($e:literal) => {
        concat!("(floor(extract(epoch FROM ", $e, ") * 1000))::int8")
    };
}

/// Takes run `$1`'s lease for owner `$2` for `$3` ms iff it is released or expired (or there
/// is none); the token only grows. Returns the token and the expiry, or no row.
const ACQUIRE: &str = concat!(
    "INSERT INTO {s}.kuralle_leases AS l (run_id, owner, token, expires_at, released)
     VALUES ($1, $2, 1, clock_timestamp() + $3::int8 * interval '1 millisecond', false)
     ON CONFLICT (run_id) DO UPDATE
     SET owner = EXCLUDED.owner, token = l.token + 1, released = false,
         expires_at = clock_timestamp() + $3::int8 * interval '1 millisecond'
     WHERE l.released OR l.expires_at <= clock_timestamp()
     RETURNING l.token, ",
    ms!("l.expires_at"),
    " AS expires_at_ms"
);

/// Statements with the schema name filled in.
#[derive(Debug)]
pub(super) struct Sql {
    pub create_run: String,
    pub get_run: String,
    pub put_run: String,
    pub put_run_release: String,
    pub put_run_release_after: String,
    pub close_many: String,
    pub run_version: String,
    pub run_versions: String,
    pub list_runs: String,
    pub delete_run: String,
    pub delete_steps: String,
    pub append_steps: String,
    pub append_finished: String,
    pub append_many: String,
    pub existing_keys: String,
    pub journaled_keys: String,
    pub finish_step: String,
    pub finish_steps: String,
    pub steps: String,
    pub acquire_lease: String,
    pub acquire_lease_create: String,
    pub lease_holder: String,
    pub renew_lease: String,
    pub renew_leases: String,
    pub release_lease: String,
    pub current_lease: String,
    pub claim_leased: String,
    pub claim_unleased: String,
    pub take_back: String,
    pub cancel_run: String,
    pub record_instance: String,
    pub instance_holder: String,
}

impl Sql {
    /// The statements for the (already quoted) schema `s`.
    pub fn new(s: &str) -> Self {
        let bind = |sql: &str| {
            sql.replace("{fences}", FENCES)
                .replace("{fence}", FENCE)
                .replace("{put_run}", PUT_RUN)
                .replace("{acquire}", ACQUIRE)
                .replace("{s}", s)
        };
        Self {
            create_run: bind(
                "WITH {fence},
                ins AS (
                    INSERT INTO {s}.kuralle_runs
                        (run_id, agent_id, status, epoch, version, next_ordinal, state, created_at, updated_at)
                    SELECT $1, $3, $4, $5, $6, 0, $7, $8, $9 FROM ok WHERE ok.ok
                    ON CONFLICT (run_id) DO NOTHING
                    RETURNING 1
                )
                SELECT (SELECT ok FROM ok), EXISTS (SELECT 1 FROM ins)",
            ),
            get_run: bind(
                "SELECT run_id, agent_id, status, epoch, version, state, created_at, updated_at
                 FROM {s}.kuralle_runs WHERE run_id = $1",
            ),
            put_run: bind("WITH {fence}, {put_run} SELECT (SELECT ok FROM ok), EXISTS (SELECT 1 FROM upd)"),
            // `put_run`, then the lease released if the run was written: the lease row,
            // share-locked by the fence, is updated by the same transaction.
            put_run_release: bind(
                "WITH {fence}, {put_run},
                rel AS (
                    UPDATE {s}.kuralle_leases SET released = true
                    WHERE run_id = $1 AND token = $2::int8 AND NOT released AND EXISTS (SELECT 1 FROM upd)
                    RETURNING 1
                )
                SELECT (SELECT ok FROM ok), EXISTS (SELECT 1 FROM upd), EXISTS (SELECT 1 FROM rel)",
            ),
            // `put_run_release` after a step appended finished ($10 key, $11 kind, $12 name, $13
            // epoch, $14 status, $15 result, $16 error, $17 started_at, $18 finished_at) at the
            // run's next ordinal, which the run's one update takes (a statement cannot update
            // a row twice): the run written, its last step journaled and its lease released, or
            // none of it.
            put_run_release_after: bind(
                "WITH {fence},
                upd AS (
                    UPDATE {s}.kuralle_runs
                    SET agent_id = $3, status = $4, epoch = $5, version = $6, state = $7, updated_at = $8,
                        next_ordinal = next_ordinal + 1
                    WHERE run_id = $1 AND version = $9 AND (SELECT ok FROM ok)
                    RETURNING next_ordinal - 1 AS ordinal
                ),
                ins AS (
                    INSERT INTO {s}.kuralle_steps
                        (run_id, ordinal, key, kind, name, epoch, status, result, error, started_at, finished_at)
                    SELECT $1, upd.ordinal, $10, $11, $12, $13::int8, $14::text, $15::jsonb, $16::jsonb,
                        $17::int8, $18::int8
                    FROM upd
                    RETURNING 1
                ),
                rel AS (
                    UPDATE {s}.kuralle_leases SET released = true
                    WHERE run_id = $1 AND token = $2::int8 AND NOT released AND EXISTS (SELECT 1 FROM upd)
                    RETURNING 1
                )
                SELECT (SELECT ok FROM ok), EXISTS (SELECT 1 FROM upd), EXISTS (SELECT 1 FROM rel),
                    EXISTS (SELECT 1 FROM ins)",
            ),
            // `put_run_release_after` for many runs, one row of each parameter per write: `$1` run
            // ids, `$2` tokens, `$3` agents, `$4` statuses, `$5` epochs, `$6` new versions, `$7`
            // states, `$8` update times, `$9` versions compared; the last step's `$10` key, `$11`
            // kind, `$12` name, `$13` epoch, `$14` status, `$15` result, `$16` error, `$17` start
            // and `$18` finish times. One row back per write, in order: whether its fence let it
            // through, whether its run was written, whether its lease was released, whether its
            // step was stored. A key already journaled fails the whole statement.
            close_many: bind(
                "WITH req AS MATERIALIZED (
                    SELECT * FROM unnest($1::text[], $2::int8[], $3::text[], $4::text[], $5::int8[], $6::int8[],
                        $7::jsonb[], $8::int8[], $9::int8[], $10::text[], $11::text[], $12::text[], $13::int8[],
                        $14::text[], $15::jsonb[], $16::jsonb[], $17::int8[], $18::int8[])
                        WITH ORDINALITY AS r (run_id, token, agent_id, status, epoch, version, state, updated_at,
                            expected, key, kind, name, step_epoch, step_status, result, error, started_at,
                            finished_at, i)
                ),
                {fences},
                upd AS (
                    UPDATE {s}.kuralle_runs AS u
                    SET agent_id = ok.agent_id, status = ok.status, epoch = ok.epoch, version = ok.version,
                        state = ok.state, updated_at = ok.updated_at, next_ordinal = u.next_ordinal + 1
                    FROM ok WHERE u.run_id = ok.run_id AND u.version = ok.expected
                    RETURNING ok.i, u.next_ordinal - 1 AS ordinal
                ),
                ins AS (
                    INSERT INTO {s}.kuralle_steps
                        (run_id, ordinal, key, kind, name, epoch, status, result, error, started_at, finished_at)
                    SELECT ok.run_id, upd.ordinal, ok.key, ok.kind, ok.name, ok.step_epoch, ok.step_status,
                        ok.result, ok.error, ok.started_at, ok.finished_at
                    FROM upd JOIN ok ON ok.i = upd.i
                    RETURNING run_id
                ),
                rel AS (
                    UPDATE {s}.kuralle_leases AS l SET released = true
                    FROM upd JOIN ok ON ok.i = upd.i
                    WHERE l.run_id = ok.run_id AND l.token = ok.token AND NOT l.released
                    RETURNING ok.i
                )
                SELECT r.i IN (SELECT i FROM ok), r.i IN (SELECT i FROM upd), r.i IN (SELECT i FROM rel),
                    r.run_id IN (SELECT run_id FROM ins)
                FROM req r ORDER BY r.i",
            ),
            run_version: bind("SELECT version FROM {s}.kuralle_runs WHERE run_id = $1"),
            run_versions: bind("SELECT run_id, version FROM {s}.kuralle_runs WHERE run_id = ANY($1::text[])"),
            list_runs: bind(
                "SELECT run_id, agent_id, status, updated_at FROM {s}.kuralle_runs
                 WHERE $1::text IS NULL OR status = $1
                 ORDER BY updated_at DESC, run_id ASC LIMIT $2::int8",
            ),
            delete_run: bind("DELETE FROM {s}.kuralle_runs WHERE run_id = $1"),
            delete_steps: bind("DELETE FROM {s}.kuralle_steps WHERE run_id = $1"),
            append_steps: bind(
                "WITH {fence},
                res AS (
                    UPDATE {s}.kuralle_runs SET next_ordinal = next_ordinal + $3::int8
                    WHERE run_id = $1 AND (SELECT ok FROM ok)
                    RETURNING next_ordinal - $3::int8 AS first
                ),
                ins AS (
                    INSERT INTO {s}.kuralle_steps (run_id, ordinal, key, kind, name, epoch, status, started_at)
                    SELECT $1, res.first + i.n - 1, i.key, i.kind, i.name, i.epoch, 'running', i.started_at
                    FROM res, unnest($4::text[], $5::text[], $6::text[], $7::int8[], $8::int8[])
                        WITH ORDINALITY AS i (key, kind, name, epoch, started_at, n)
                    RETURNING 1
                )
                SELECT (SELECT ok FROM ok), (SELECT first FROM res), (SELECT count(*) FROM ins)",
            ),
            // `append_steps` whose first row is already finished ($9 status, $10 result, $11
            // error, $12 finished_at): a model response and its calls' intents in one statement,
            // so one commit.
            append_finished: bind(
                "WITH {fence},
                res AS (
                    UPDATE {s}.kuralle_runs SET next_ordinal = next_ordinal + $3::int8
                    WHERE run_id = $1 AND (SELECT ok FROM ok)
                    RETURNING next_ordinal - $3::int8 AS first
                ),
                ins AS (
                    INSERT INTO {s}.kuralle_steps
                        (run_id, ordinal, key, kind, name, epoch, status, result, error, started_at, finished_at)
                    SELECT $1, res.first + i.n - 1, i.key, i.kind, i.name, i.epoch,
                        CASE WHEN i.n = 1 THEN $9::text ELSE 'running' END,
                        CASE WHEN i.n = 1 THEN $10::jsonb END,
                        CASE WHEN i.n = 1 THEN $11::jsonb END,
                        i.started_at,
                        CASE WHEN i.n = 1 THEN $12::int8 END
                    FROM res, unnest($4::text[], $5::text[], $6::text[], $7::int8[], $8::int8[])
                        WITH ORDINALITY AS i (key, kind, name, epoch, started_at, n)
                    RETURNING 1
                )
                SELECT (SELECT ok FROM ok), (SELECT first FROM res), (SELECT count(*) FROM ins)",
            ),
            // `append_steps` and `append_finished` for many runs. One row per write: `$1` run ids,
            // `$2` tokens, `$3` counts of steps, and for a write whose first step is already
            // finished `$4` its status, `$5` result, `$6` error, `$7` finish time (`NULL`s
            // otherwise). One row per step: `$8` its write and `$9` its position in it (both
            // from 1), `$10` keys, `$11` kinds, `$12` names, `$13` epochs, `$14` start times. One
            // row back per write, in order: whether its fence let it through, the first ordinal
            // it reserved (`NULL`: no run), how many steps it inserted. A key already journaled
            // fails the whole statement (nothing is written).
            append_many: bind(
                "WITH req AS MATERIALIZED (
                    SELECT * FROM unnest($1::text[], $2::int8[], $3::int8[], $4::text[], $5::jsonb[], $6::jsonb[],
                        $7::int8[])
                        WITH ORDINALITY AS r (run_id, token, count, status, result, error, finished_at, i)
                ),
                {fences},
                res AS (
                    UPDATE {s}.kuralle_runs AS u SET next_ordinal = u.next_ordinal + ok.count
                    FROM ok WHERE u.run_id = ok.run_id
                    RETURNING ok.i, u.next_ordinal - ok.count AS first
                ),
                ins AS (
                    INSERT INTO {s}.kuralle_steps
                        (run_id, ordinal, key, kind, name, epoch, status, result, error, started_at, finished_at)
                    SELECT ok.run_id, res.first + st.n - 1, st.key, st.kind, st.name, st.epoch,
                        CASE WHEN st.n = 1 AND ok.status IS NOT NULL THEN ok.status ELSE 'running' END,
                        CASE WHEN st.n = 1 THEN ok.result END,
                        CASE WHEN st.n = 1 THEN ok.error END,
                        st.started_at,
                        CASE WHEN st.n = 1 THEN ok.finished_at END
                    FROM unnest($8::int8[], $9::int8[], $10::text[], $11::text[], $12::text[], $13::int8[],
                        $14::int8[]) AS st (i, n, key, kind, name, epoch, started_at)
                    JOIN res ON res.i = st.i
                    JOIN ok ON ok.i = st.i
                    RETURNING run_id
                ),
                inserted AS (SELECT run_id, count(*) AS n FROM ins GROUP BY run_id)
                SELECT r.i IN (SELECT i FROM ok), res.first, coalesce(inserted.n, 0)
                FROM req r
                LEFT JOIN res ON res.i = r.i
                LEFT JOIN inserted ON inserted.run_id = r.run_id
                ORDER BY r.i",
            ),
            existing_keys: bind("SELECT key FROM {s}.kuralle_steps WHERE run_id = $1 AND key = ANY($2::text[])"),
            // Which of the `($1, $2)` pairs (run ids and keys, pairwise) are journaled.
            journaled_keys: bind(
                "SELECT s.run_id, s.key FROM {s}.kuralle_steps s
                 JOIN unnest($1::text[], $2::text[]) AS k (run_id, key) ON s.run_id = k.run_id AND s.key = k.key",
            ),
            finish_step: bind(
                "WITH {fence},
                upd AS (
                    UPDATE {s}.kuralle_steps SET status = $4, result = $5, error = $6, finished_at = $7
                    WHERE run_id = $1 AND ordinal = $3 AND status = 'running' AND (SELECT ok FROM ok)
                    RETURNING 1
                )
                SELECT (SELECT ok FROM ok), EXISTS (SELECT 1 FROM upd),
                    EXISTS (SELECT 1 FROM {s}.kuralle_runs WHERE run_id = $1)",
            ),
            // `finish_step` for many runs: `$1` run ids, `$2` tokens, `$3` ordinals, `$4` statuses,
            // `$5` results, `$6` errors, `$7` finish times, pairwise; one row per write, in order:
            // whether its fence let it through, whether its step was updated, whether its run exists.
            finish_steps: bind(
                "WITH req AS MATERIALIZED (
                    SELECT * FROM unnest($1::text[], $2::int8[], $3::int8[], $4::text[], $5::jsonb[], $6::jsonb[],
                        $7::int8[])
                        WITH ORDINALITY AS r (run_id, token, ordinal, status, result, error, finished_at, i)
                ),
                {fences},
                upd AS (
                    UPDATE {s}.kuralle_steps AS s
                    SET status = ok.status, result = ok.result, error = ok.error, finished_at = ok.finished_at
                    FROM ok
                    WHERE s.run_id = ok.run_id AND s.ordinal = ok.ordinal AND s.status = 'running'
                    RETURNING ok.i
                )
                SELECT r.i IN (SELECT i FROM ok), r.i IN (SELECT i FROM upd),
                    EXISTS (SELECT 1 FROM {s}.kuralle_runs x WHERE x.run_id = r.run_id)
                FROM req r ORDER BY r.i",
            ),
            steps: bind(
                "SELECT ordinal, key, kind, name, epoch, status, result, error, started_at, finished_at
                 FROM {s}.kuralle_steps WHERE run_id = $1 ORDER BY ordinal",
            ),
            acquire_lease: bind(ACQUIRE),
            // `acquire_lease`, and the run created under the lease it took ($4 agent, $5 status,
            // $6 epoch, $7 version, $8 state, $9 created_at, $10 updated_at) unless it exists:
            // no row when the lease was not taken, else its token, its expiry and whether the
            // run was created.
            acquire_lease_create: bind(
                "WITH acq AS ({acquire}),
                ins AS (
                    INSERT INTO {s}.kuralle_runs
                        (run_id, agent_id, status, epoch, version, next_ordinal, state, created_at, updated_at)
                    SELECT $1, $4, $5, $6, $7, 0, $8, $9, $10 FROM acq
                    ON CONFLICT (run_id) DO NOTHING
                    RETURNING 1
                )
                SELECT token, expires_at_ms, EXISTS (SELECT 1 FROM ins) FROM acq",
            ),
            lease_holder: bind(concat!(
                "SELECT owner, ",
                ms!("expires_at"),
                ", released OR expires_at <= clock_timestamp() FROM {s}.kuralle_leases WHERE run_id = $1"
            )),
            renew_lease: bind(concat!(
                "UPDATE {s}.kuralle_leases SET expires_at = clock_timestamp() + $3::int8 * interval '1 millisecond'
                 WHERE run_id = $1 AND token = $2 AND NOT released
                 RETURNING ",
                ms!("expires_at")
            )),
            // Many leases, one statement: `$1` run ids and `$2` tokens, pairwise. A lease not
            // returned was taken over or released (fenced). The rows are locked in `run_id` order,
            // as batched writes' fences take them (see `FENCES`): the two do not deadlock.
            renew_leases: bind(concat!(
                "WITH r AS (
                    SELECT l.run_id, l.token FROM {s}.kuralle_leases l
                    JOIN unnest($1::text[], $2::int8[]) AS r(run_id, token) ON l.run_id = r.run_id AND l.token = r.token
                    WHERE NOT l.released
                    ORDER BY l.run_id
                    FOR NO KEY UPDATE OF l
                )
                UPDATE {s}.kuralle_leases AS l SET expires_at = clock_timestamp() + $3::int8 * interval '1 millisecond'
                 FROM r
                 WHERE l.run_id = r.run_id AND l.token = r.token AND NOT l.released
                 RETURNING l.run_id, l.token, ",
                ms!("l.expires_at")
            )),
            release_lease: bind(
                "UPDATE {s}.kuralle_leases SET released = true WHERE run_id = $1 AND token = $2 AND NOT released RETURNING 1",
            ),
            current_lease: bind(concat!(
                "SELECT owner, token, ",
                ms!("expires_at"),
                " FROM {s}.kuralle_leases
                 WHERE run_id = $1 AND NOT released AND expires_at > clock_timestamp()"
            )),
            // Locks only lease rows, skipping those locked by another claimer or share-locked
            // by an in-flight write of the old holder (claimed on a later poll, after it
            // committed): lease rows are always locked before run rows, so no deadlock.
            claim_leased: bind(concat!(
                "WITH candidates AS (
                    SELECT l.run_id FROM {s}.kuralle_leases l
                    JOIN {s}.kuralle_runs r ON r.run_id = l.run_id
                    WHERE r.status = 'running' AND (l.released OR l.expires_at <= clock_timestamp())
                    ORDER BY r.updated_at, r.run_id
                    LIMIT $3
                    FOR UPDATE OF l SKIP LOCKED
                )
                UPDATE {s}.kuralle_leases l
                SET owner = $1 || '/' || l.run_id, token = l.token + 1, released = false,
                    expires_at = clock_timestamp() + $2::int8 * interval '1 millisecond'
                FROM candidates c WHERE l.run_id = c.run_id
                RETURNING l.run_id, l.owner, l.token, ",
                ms!("l.expires_at")
            )),
            // Runs that never had a lease (written unfenced, or by schema version 1).
            claim_unleased: bind(concat!(
                "INSERT INTO {s}.kuralle_leases AS l (run_id, owner, token, expires_at, released)
                 SELECT r.run_id, $1 || '/' || r.run_id, 1, clock_timestamp() + $2::int8 * interval '1 millisecond', false
                 FROM {s}.kuralle_runs r
                 WHERE r.status = 'running'
                   AND NOT EXISTS (SELECT 1 FROM {s}.kuralle_leases x WHERE x.run_id = r.run_id)
                 ORDER BY r.updated_at, r.run_id
                 LIMIT $3
                 ON CONFLICT (run_id) DO NOTHING
                 RETURNING l.run_id, l.owner, l.token, ",
                ms!("l.expires_at")
            )),
            // An exact prefix test (`LIKE` would read `%` and `_` in an instance id as
            // wildcards); both sides count characters.
            // The lease row is locked first, as every fenced write does (lease rows before run
            // rows: no deadlock); the run is cancelled only from `running` or `paused`, and its
            // lease released with it. Returns the status before and whether it was cancelled.
            cancel_run: bind(
                "WITH l AS (SELECT run_id FROM {s}.kuralle_leases WHERE run_id = $1 FOR UPDATE),
                prev AS (SELECT status FROM {s}.kuralle_runs WHERE run_id = $1),
                upd AS (
                    UPDATE {s}.kuralle_runs SET status = 'cancelled', version = version + 1, updated_at = $2
                    WHERE run_id = $1 AND status IN ('running', 'paused') AND (SELECT count(*) FROM l) >= 0
                    RETURNING run_id
                ),
                rel AS (
                    UPDATE {s}.kuralle_leases SET released = true
                    WHERE run_id IN (SELECT run_id FROM upd) AND NOT released RETURNING 1
                )
                SELECT (SELECT status FROM prev), EXISTS (SELECT 1 FROM upd), (SELECT count(*) FROM rel)",
            ),
            take_back: bind(
                "UPDATE {s}.kuralle_leases SET released = true
                 WHERE NOT released AND left(owner, length($1)) = $1
                 RETURNING run_id",
            ),
            record_instance: bind(
                "INSERT INTO {s}.kuralle_instances (instance_id, backend_pid, claimed_at)
                 VALUES ($1, pg_backend_pid(), now())
                 ON CONFLICT (instance_id) DO UPDATE
                 SET backend_pid = EXCLUDED.backend_pid, claimed_at = EXCLUDED.claimed_at",
            ),
            // The backend holding the two-key advisory lock ($1, $2) in this database, and the
            // instance id it recorded.
            instance_holder: bind(
                "SELECT l.pid, i.instance_id FROM pg_locks l
                 LEFT JOIN {s}.kuralle_instances i ON i.backend_pid = l.pid
                 WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 2
                   AND l.classid = $1::int4::oid AND l.objid = $2::int4::oid
                   AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
                 LIMIT 1",
            ),
        }
    }
}
