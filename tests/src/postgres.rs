//! PostgreSQL for tests: `DATABASE_URL` names the server; each store gets a schema of its own,
//! dropped when its guard is dropped, so tests run in parallel and rerun on a dirty database.
//! Without `DATABASE_URL` the helpers print a skip notice and return `None`.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use kuralle::stores::{PostgresOptions, PostgresStore};

/// The server's URL, or `None` after printing a skip notice naming `test`.
pub fn database_url(test: &str) -> Option<String> {
    match std::env::var("DATABASE_URL") {
        Ok(url) if !url.is_empty() => Some(url),
        _ => {
            eprintln!("skipping {test}: DATABASE_URL is not set (e.g. postgres://postgres@127.0.0.1:5432/test)");
            None
        }
    }
}

/// A schema name no other test (in this or another process, now or before) uses.
pub fn unique_schema(prefix: &str) -> String {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let nanos = SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_nanos()).unwrap_or(0);
    format!("kt_{prefix}_{}_{}_{nanos}", std::process::id(), NEXT.fetch_add(1, Ordering::Relaxed))
}

/// Drops its schema (and everything in it) when dropped.
#[derive(Debug)]
pub struct SchemaGuard {
    /// The server.
    pub url: String,
    /// The schema.
    pub schema: String,
}

impl Drop for SchemaGuard {
    fn drop(&mut self) {
        let (url, schema) = (self.url.clone(), self.schema.clone());
        // Drop may run inside a runtime: use a thread with a runtime of its own.
        let dropped = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().ok()?;
            rt.block_on(async {
                let client = connect(&url).await.ok()?;
                client.batch_execute(&format!("DROP SCHEMA IF EXISTS \"{schema}\" CASCADE")).await.ok()
            })
        })
        .join();
        if !matches!(dropped, Ok(Some(()))) {
            eprintln!("could not drop test schema {}", self.schema);
        }
    }
}

/// A plain client connection (its connection task runs on the current runtime).
pub async fn connect(url: &str) -> Result<tokio_postgres::Client, tokio_postgres::Error> {
    let (client, connection) = tokio_postgres::connect(url, tokio_postgres::NoTls).await?;
    tokio::spawn(connection);
    Ok(client)
}

/// A store on a fresh schema, or `None` (after a skip notice) without `DATABASE_URL`.
pub async fn store(test: &str) -> Option<(PostgresStore, SchemaGuard)> {
    store_with(test, PostgresOptions::default()).await
}

/// As [`store`], with `options` (its schema is replaced by a fresh one).
pub async fn store_with(test: &str, options: PostgresOptions) -> Option<(PostgresStore, SchemaGuard)> {
    let url = database_url(test)?;
    let schema = unique_schema("s");
    let guard = SchemaGuard { url: url.clone(), schema: schema.clone() };
    let store = PostgresStore::connect_with(&url, PostgresOptions { schema, ..options })
        .await
        .unwrap_or_else(|e| panic!("DATABASE_URL is set but the store cannot connect: {e}"));
    Some((store, guard))
}

/// [`store`] from synchronous code inside a multi-threaded Tokio runtime (the conformance
/// macro's factory).
pub fn store_blocking(test: &str) -> Option<(PostgresStore, SchemaGuard)> {
    tokio::task::block_in_place(|| tokio::runtime::Handle::current().block_on(store(test)))
}

/// A store on the server at `url` in `schema` (created if missing), with a short connect
/// timeout: for fault tests whose servers (private, or behind a proxy) go away.
pub async fn store_at(url: &str, schema: &str) -> std::sync::Arc<dyn kuralle::RunStore> {
    let options = PostgresOptions {
        schema: schema.to_owned(),
        connect_timeout: std::time::Duration::from_secs(5),
        ..PostgresOptions::default()
    };
    std::sync::Arc::new(PostgresStore::connect_with(url, options).await.expect("the store connects"))
}
