//! The `RunStore` conformance suite against every store.

mod memory {
    use kuralle::stores::MemoryStore;

    kuralle_tests::store_conformance!(|| (MemoryStore::new(), ()));
}

mod sqlite {
    use kuralle::stores::SqliteStore;

    fn make() -> (SqliteStore, tempfile::TempDir) {
        let dir = tempfile::tempdir().unwrap();
        let store = SqliteStore::open(dir.path().join("runs.db")).unwrap();
        (store, dir)
    }

    kuralle_tests::store_conformance!(make);
}

mod sqlite_in_memory {
    use kuralle::stores::SqliteStore;

    kuralle_tests::store_conformance!(|| (SqliteStore::in_memory().unwrap(), ()));
}

/// `run_all` runs the whole suite in one test, as a new store would call it first.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn run_all_against_memory_store() {
    kuralle_tests::conformance::run_all(|| (kuralle::stores::MemoryStore::new(), ())).await;
}

mod postgres {
    kuralle_tests::store_conformance!(|| kuralle_tests::postgres::store_blocking("postgres conformance"));
}

/// The trait's provided implementations, which a store inherits unless it overrides them.
mod provided {
    kuralle_tests::store_conformance!(|| (kuralle_tests::provided::ProvidedStore::new(), ()));
}
