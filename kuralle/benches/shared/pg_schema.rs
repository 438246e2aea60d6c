//! Dropping a bench's PostgreSQL schema, shared by the benches that make one.

/// Drops `schema` and everything in it, if it is there, on a thread and runtime of its own
/// (the caller may be on a runtime's thread, or on none). It connects in clear text: a server
/// that only takes TLS keeps the schema, and a notice says so. A lock held on it for 10 s
/// fails the drop instead of hanging the bench.
pub fn drop_schema(url: &str, schema: &str) {
    let sql = format!("SET lock_timeout = '10s'; DROP SCHEMA IF EXISTS \"{schema}\" CASCADE");
    let dropped = std::thread::scope(|s| {
        s.spawn(|| {
            let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
            rt.block_on(async {
                let (client, connection) = tokio_postgres::connect(url, tokio_postgres::NoTls).await?;
                let connection = tokio::spawn(connection);
                let dropped = client.batch_execute(&sql).await;
                // The connection ends with a goodbye to the server, not cut off with the runtime.
                drop(client);
                let _ = connection.await;
                dropped
            })
            .map_err(std::io::Error::other)
        })
        .join()
    });
    if !matches!(dropped, Ok(Ok(()))) {
        eprintln!("could not drop the bench schema {schema}: {dropped:?}");
    }
}
