//! A connection, and on the writer the statements of the hot writes, kept prepared, and what
//! the writer knows of the runs it writes (`known.rs`).

use std::cell::{OnceCell, RefCell, RefMut};
use std::ops::{Deref, DerefMut};

use rusqlite::{CachedStatement, Connection, PrepFlags, Statement};

use super::known::Known;

/// A connection and the statements it keeps prepared: what every SQL function of the store
/// runs on. It dereferences to the [`Connection`].
///
/// rusqlite's statement cache finds a statement by its SQL text: at every use it trims the
/// text, hashes it, allocates an `Arc<str>` for its key and relinks its LRU list twice. The
/// writer made about 21 such lookups a run, and at 1,000 runs in flight they were 8% of the
/// writer thread's instructions, on the one thread every write waits for. The writer's hot
/// statements are few and known in advance, so it keeps them in slots of its own, found by a
/// scan of under twenty lengths; every other statement, and every statement of a read connection,
/// goes through rusqlite's cache as before.
pub(super) struct Db<'c> {
    conn: &'c Connection,
    /// The SQL of the statements kept, and their slots (prepared at first use).
    hot: &'static [&'static str],
    slots: Box<[OnceCell<RefCell<Statement<'c>>>]>,
    /// What the writer knows of the runs it writes (the writer's connection only).
    known: Option<Known>,
}

impl<'c> Db<'c> {
    /// `conn`, with every statement from rusqlite's cache.
    pub(super) fn new(conn: &'c Connection) -> Self {
        Self { conn, hot: &[], slots: Box::new([]), known: None }
    }

    /// The writer's `conn`, keeping the statements of `hot` prepared, and what it learns of
    /// the runs it writes, for as long as this lives.
    pub(super) fn keeping(conn: &'c Connection, hot: &'static [&'static str]) -> Self {
        let slots = hot.iter().map(|_| OnceCell::new()).collect();
        Self { conn, hot, slots, known: Some(Known::default()) }
    }

    /// What the writer knows of the runs it writes; `None` on a read connection.
    pub(super) fn known(&self) -> Option<&Known> {
        self.known.as_ref()
    }

    /// Tells the writer what a write changed (nothing on a read connection).
    pub(super) fn learn(&self, f: impl FnOnce(&Known)) {
        if let Some(known) = &self.known {
            f(known);
        }
    }

    /// The statement of `sql`, ready to bind: a kept one, or one from rusqlite's cache.
    ///
    /// A kept statement already in use (a statement run again while its rows are read) is
    /// taken from rusqlite's cache instead, as the cache itself does.
    pub(super) fn prepared(&self, sql: &str) -> rusqlite::Result<Prepared<'_, 'c>> {
        // The SQL is a constant: the same text usually has the same address, and the lengths
        // of a dozen statements tell them apart before any text is compared.
        let kept =
            self.hot.iter().position(|hot| hot.len() == sql.len() && (hot.as_ptr() == sql.as_ptr() || *hot == sql));
        if let Some(slot) = kept.and_then(|i| self.slots.get(i)) {
            if slot.get().is_none() {
                let stmt = self.conn.prepare_with_flags(sql, PrepFlags::SQLITE_PREPARE_PERSISTENT)?;
                let _ = slot.set(RefCell::new(stmt));
            }
            if let Some(stmt) = slot.get().and_then(|cell| cell.try_borrow_mut().ok()) {
                return Ok(Prepared::Kept(stmt));
            }
        }
        self.conn.prepare_cached(sql).map(Prepared::Cached)
    }
}

impl<'c> Deref for Db<'c> {
    type Target = Connection;

    fn deref(&self) -> &Connection {
        self.conn
    }
}

/// A statement borrowed from a [`Db`]; it dereferences to the [`Statement`].
pub(super) enum Prepared<'a, 'c> {
    Kept(RefMut<'a, Statement<'c>>),
    Cached(CachedStatement<'c>),
}

impl<'c> Deref for Prepared<'_, 'c> {
    type Target = Statement<'c>;

    fn deref(&self) -> &Statement<'c> {
        match self {
            Self::Kept(stmt) => stmt,
            Self::Cached(stmt) => stmt,
        }
    }
}

impl<'c> DerefMut for Prepared<'_, 'c> {
    fn deref_mut(&mut self) -> &mut Statement<'c> {
        match self {
            Self::Kept(stmt) => stmt,
            Self::Cached(stmt) => stmt,
        }
    }
}

impl Drop for Prepared<'_, '_> {
    fn drop(&mut self) {
        // As rusqlite does for a statement back in its cache: the copies SQLite made of the
        // bound texts (a run's whole state, a tool's result) are freed now, not at the
        // statement's next use.
        if let Self::Kept(stmt) = self {
            stmt.clear_bindings();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const INSERT: &str = "INSERT INTO t (n) VALUES (?1)";
    const COUNT: &str = "SELECT count(*) FROM t";

    /// A kept statement is prepared once and reused; the same text at another address finds
    /// it too; a statement in use is taken from rusqlite's cache; others come from the cache.
    #[test]
    fn kept_statements_are_found_by_their_text() {
        static HOT: [&str; 2] = [INSERT, COUNT];
        let conn = Connection::open_in_memory().unwrap();
        conn.execute_batch("CREATE TABLE t (n INTEGER)").unwrap();
        let db = Db::keeping(&conn, &HOT);
        for n in 0..3 {
            assert!(matches!(db.prepared(INSERT).unwrap(), Prepared::Kept(_)));
            db.prepared(INSERT).unwrap().execute([n]).unwrap();
        }
        // One statement ran all three inserts.
        assert_eq!(db.prepared(INSERT).unwrap().get_status(rusqlite::StatementStatus::Run), 3);
        let copy = String::from(INSERT);
        assert!(matches!(db.prepared(&copy).unwrap(), Prepared::Kept(_)));
        let held = db.prepared(COUNT).unwrap();
        let mut again = db.prepared(COUNT).unwrap();
        assert!(matches!((&held, &again), (Prepared::Kept(_), Prepared::Cached(_))));
        assert_eq!(again.query_row::<i64, _, _>([], |row| row.get(0)).unwrap(), 3);
        drop((held, again));
        assert!(matches!(db.prepared("SELECT n FROM t").unwrap(), Prepared::Cached(_)));
        assert!(matches!(Db::new(&conn).prepared(INSERT).unwrap(), Prepared::Cached(_)));
    }

    /// A kept statement given back has no bindings left: the texts SQLite copied are freed, and
    /// a later use that binds nothing sees `NULL`.
    #[test]
    fn a_kept_statement_is_given_back_without_its_bindings() {
        static HOT: [&str; 1] = [INSERT];
        let conn = Connection::open_in_memory().unwrap();
        conn.execute_batch("CREATE TABLE t (n INTEGER)").unwrap();
        let db = Db::keeping(&conn, &HOT);
        db.prepared(INSERT).unwrap().execute([7]).unwrap();
        let mut stmt = db.prepared(INSERT).unwrap();
        assert!(matches!(stmt, Prepared::Kept(_)));
        stmt.raw_execute().unwrap();
        drop(stmt);
        assert_eq!(super::super::column::<Option<i64>>(&conn, "SELECT n FROM t"), [Some(7), None]);
    }
}
