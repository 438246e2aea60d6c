//! Wake-ups for idle workers: `NOTIFY kuralle_runnable, '<schema>'` when a run becomes
//! runnable, heard on one dedicated `LISTEN` connection per store.
//!
//! Only a hint: a notification is lost when no listener is connected (and PostgreSQL never
//! replays it), so workers also poll. `LISTEN` holds server state on its connection, so it
//! needs a direct connection or session-mode pooling; behind a transaction-mode pooler
//! (pgbouncer `pool_mode = transaction`) the hints do not arrive and workers fall back to
//! polling alone.

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use futures::StreamExt;
use tokio::sync::Notify;
use tokio_postgres::AsyncMessage;
use tokio_postgres_rustls::MakeRustlsConnect;

use super::PostgresStore;
use super::errors::{Fail, retrying};
use crate::store::StoreError;

/// The notification channel (shared by all schemas; the payload names the schema).
pub(super) const CHANNEL: &str = "kuralle_runnable";
const LISTEN: &str = "LISTEN kuralle_runnable";

/// The listener of one store: started on first use, reconnects by itself.
#[derive(Default)]
pub(super) struct Listener {
    woken: Arc<Notify>,
    started: OnceLock<()>,
}

impl PostgresStore {
    pub(super) async fn notify_hint(&self) -> Result<(), StoreError> {
        retrying(|| async {
            let client = self.client().await?;
            let schema = &self.inner.options.schema;
            // Cached: a statement given as text is parsed, run and closed on every submit (two
            // awaited round trips and a third exchange) instead of one round trip.
            let stmt = client.prepare_cached("SELECT pg_notify($1, $2)").await.map_err(Fail::read)?;
            client.execute(&stmt, &[&CHANNEL, schema]).await.map_err(Fail::read)?;
            Ok(())
        })
        .await
    }

    /// Resolves on a wake-up hint for this store's schema, or after `poll`, whichever is
    /// first.
    pub(super) async fn wait_hint(&self, poll: Duration) {
        let listener = &self.inner.listener;
        // Register interest before starting the listener, so a hint cannot slip between.
        let woken = listener.woken.notified();
        if listener.started.set(()).is_ok() {
            tokio::spawn(listen(
                self.inner.config.clone(),
                self.inner.tls.clone(),
                self.inner.options.schema.clone(),
                listener.woken.clone(),
            ));
        }
        let _ = tokio::time::timeout(poll, woken).await;
    }
}

/// Keeps a `LISTEN` connection open while the store lives (the `Notify` has other owners),
/// reconnecting after failures.
async fn listen(config: tokio_postgres::Config, tls: MakeRustlsConnect, schema: String, woken: Arc<Notify>) {
    let mut backoff = Duration::from_millis(100);
    while Arc::strong_count(&woken) > 1 {
        match config.connect(tls.clone()).await {
            Ok((client, mut connection)) => {
                backoff = Duration::from_millis(100);
                let mut messages = futures::stream::poll_fn(move |cx| connection.poll_message(cx));
                let listen = client.batch_execute(LISTEN);
                tokio::pin!(listen);
                let mut listening = false;
                loop {
                    tokio::select! {
                        done = &mut listen, if !listening => {
                            if done.is_err() { break; }
                            listening = true;
                            // Hints sent while we were not listening are lost: wake the
                            // workers once so that they poll now.
                            woken.notify_waiters();
                        }
                        message = messages.next() => match message {
                            Some(Ok(AsyncMessage::Notification(n))) if n.payload() == schema => woken.notify_waiters(),
                            Some(Ok(_)) => {}
                            Some(Err(_)) | None => break,
                        },
                        () = tokio::time::sleep(Duration::from_secs(5)) => {
                            if Arc::strong_count(&woken) <= 1 { return; }
                        }
                    }
                }
                tracing::debug!(schema, "the PostgreSQL LISTEN connection closed; reconnecting");
            }
            Err(e) => tracing::debug!(schema, error = %e, "cannot open the PostgreSQL LISTEN connection"),
        }
        tokio::time::sleep(backoff).await;
        backoff = (backoff * 2).min(Duration::from_secs(5));
    }
}
