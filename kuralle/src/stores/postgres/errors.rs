//! PostgreSQL and pool errors as typed [`StoreError`]s.
//!
//! Anything that a later attempt may get past (the server or the network is down, the
//! connection was terminated, a lock or serialization conflict, too many connections) is
//! [`StoreError::Unavailable`], except a server out of disk space, which is the (also
//! retryable) [`StoreError::StorageFull`]; data the schema cannot hold is [`StoreError::LimitExceeded`];
//! a schema that is not what this build expects is [`StoreError::Corrupt`]. What only a change
//! of configuration fixes is not retryable: a TLS handshake refused (an untrusted or misnamed
//! certificate, a server without TLS under `require`) is [`StoreError::Tls`], a connection the
//! server's authentication or `pg_hba.conf` refuses (SQLSTATE class 28) is
//! [`StoreError::AccessDenied`].

use std::{error::Error as _, future::Future, time::Duration};

use deadpool_postgres::PoolError;
use tokio_postgres::error::SqlState;

use crate::store::StoreError;

/// Maps a client error.
pub(super) fn map(error: tokio_postgres::Error) -> StoreError {
    classify(&error).with_source(error)
}

fn classify(error: &tokio_postgres::Error) -> StoreError {
    let Some(db) = error.as_db_error() else {
        if let Some(refused) = tls_refused(error) {
            return refused;
        }
        // No server response: I/O, a closed connection, a timeout, or a protocol problem.
        return StoreError::Unavailable(format!("PostgreSQL connection failed: {error}").into());
    };
    let code = db.code().code();
    let detail = format!("{} (SQLSTATE {code})", db.message());
    match &code[..2] {
        // disk_full: the server could not extend a file; the statement did not take effect.
        "53" if *db.code() == SqlState::DISK_FULL => StoreError::StorageFull(
            format!(
                "PostgreSQL is out of disk space; free space on the server, then resume the unfinished runs: {detail}"
            )
            .into(),
        ),
        // connection exception; operator intervention (terminated backend, shutdown);
        // insufficient resources; transaction rollback (serialization, deadlock); lock timeout.
        "08" | "57" | "53" | "40" => StoreError::Unavailable(format!("PostgreSQL: {detail}").into()),
        "55" if *db.code() == SqlState::LOCK_NOT_AVAILABLE => {
            StoreError::Unavailable(format!("PostgreSQL: {detail}").into())
        }
        "25" if *db.code() == SqlState::READ_ONLY_SQL_TRANSACTION => {
            StoreError::Unavailable(format!("PostgreSQL is read-only (a standby?): {detail}").into())
        }
        // invalid authorization specification: pg_hba.conf, password, a role that may not log in.
        "28" => StoreError::AccessDenied(format!("PostgreSQL refused the connection: {detail}").into()),
        "54" => StoreError::LimitExceeded(format!("PostgreSQL: {detail}").into()),
        "22" => StoreError::LimitExceeded(format!("PostgreSQL cannot store the value: {detail}").into()),
        _ => {
            StoreError::Corrupt(format!("unexpected PostgreSQL error (is the kuralle schema intact?): {detail}").into())
        }
    }
}

/// A TLS failure that only configuration fixes, as [`StoreError::Tls`]; `None` for anything
/// else, such as the network failing in the middle of a handshake (retryable).
fn tls_refused(error: &tokio_postgres::Error) -> Option<StoreError> {
    // tokio-postgres says that a failure is its TLS step only in its message (its kinds are
    // private); the unit tests below pin that.
    if !error.to_string().starts_with("error performing TLS handshake") {
        return None;
    }
    let cause = error.source()?;
    if let Some(io) = cause.downcast_ref::<std::io::Error>() {
        // rustls refused (a certificate, an alert from the server, no common protocol), or
        // the server name cannot be one; any other I/O error is the network's.
        let rustls = io.get_ref().is_some_and(|inner| inner.is::<rustls::Error>());
        if !rustls && io.kind() != std::io::ErrorKind::InvalidInput {
            return None;
        }
    }
    // Or tokio-postgres's own: "server does not support TLS", "no hostname provided".
    Some(StoreError::Tls(format!("TLS to PostgreSQL failed: {cause}").into()))
}

/// Maps a failure to get a pooled connection.
pub(super) fn pool(error: PoolError) -> StoreError {
    match error {
        PoolError::Backend(e) => map(e),
        other => {
            StoreError::Unavailable(format!("no PostgreSQL connection available: {other}").into()).with_source(other)
        }
    }
}

/// A failed attempt of one operation, and whether running it again is safe: the server
/// answered that the statement did not run (terminated backend, connection exception,
/// serialization failure), or no statement was sent (no pooled connection), or the operation
/// is a read.
#[derive(Debug)]
pub(super) struct Fail {
    pub error: StoreError,
    pub retry: bool,
}

impl From<StoreError> for Fail {
    fn from(error: StoreError) -> Self {
        Self { error, retry: false }
    }
}

impl Fail {
    /// A write's statement failed: retry only if the server said it did not run. A broken
    /// connection with no answer leaves the write in doubt: it is reported, not repeated.
    pub fn write(error: tokio_postgres::Error) -> Self {
        let retry = error.as_db_error().is_some_and(|db| matches!(&db.code().code()[..2], "08" | "57" | "40"));
        Self { error: map(error), retry }
    }

    /// A read's statement failed: any retryable failure may be retried.
    pub fn read(error: tokio_postgres::Error) -> Self {
        let error = map(error);
        Self { retry: error.is_retryable(), error }
    }

    /// No connection could be had: nothing was sent.
    pub fn pool(error: PoolError) -> Self {
        let error = pool(error);
        Self { retry: error.is_retryable(), error }
    }
}

/// How many times an operation runs at most when its failures are safe to retry.
pub(super) const ATTEMPTS: usize = 4;

/// The pause before the first retry; each later one waits four times as long (5, 20, 80 ms).
///
/// Retrying at once would hand back a pooled connection the server has just terminated but
/// whose connection task has not yet seen the close (the pool's recycle check only sees a
/// closed client), so after the server drops every connection (a restart, an operator's
/// `pg_terminate_backend`) an immediate retry can hit one dead connection after another.
pub(super) const FIRST_RETRY_DELAY: Duration = Duration::from_millis(5);

/// Runs `attempt` until it succeeds, fails for good, or [`ATTEMPTS`] are spent, pausing
/// between attempts (see [`FIRST_RETRY_DELAY`]).
pub(super) async fn retrying<T, F, Fut>(mut attempt: F) -> Result<T, StoreError>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, Fail>>,
{
    let mut tries = 0;
    let mut delay = FIRST_RETRY_DELAY;
    loop {
        tries += 1;
        match attempt().await {
            Ok(value) => return Ok(value),
            Err(fail) if fail.retry && tries < ATTEMPTS => {
                tracing::debug!(error = %fail.error, tries, "retrying a PostgreSQL operation after a pause");
                tokio::time::sleep(delay).await;
                delay *= 4;
            }
            Err(fail) => return Err(fail.error),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;

    /// A stand-in server on loopback: answers each connection's `SSLRequest` with `answer`
    /// (`S`: TLS offered, `N`: no TLS), then hangs up.
    async fn ssl_answering(answer: u8) -> u16 {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        tokio::spawn(async move {
            while let Ok((mut socket, _)) = listener.accept().await {
                let mut request = [0; 8];
                if socket.read_exact(&mut request).await.is_ok() {
                    let _ = socket.write_all(&[answer]).await;
                }
            }
        });
        port
    }

    async fn connect_error(url: &str) -> StoreError {
        let settings = super::super::tls::parse(url).unwrap();
        let tls = super::super::tls::connector(&settings, &super::super::PostgresTls::FromUrl).unwrap();
        map(settings.config.connect(tls).await.err().expect("the stand-in server never lets a connection through"))
    }

    #[tokio::test]
    async fn a_server_without_tls_under_require_is_a_typed_tls_error() {
        let port = ssl_answering(b'N').await;
        let err = connect_error(&format!("postgres://u@127.0.0.1:{port}/db?sslmode=require")).await;
        assert!(matches!(&err, StoreError::Tls(m) if m.contains("server does not support TLS")), "{err:?}");
        assert!(!err.is_retryable());
        // Under `prefer` it goes on in clear text (and then meets the hang-up: retryable).
        let err = connect_error(&format!("postgres://u@127.0.0.1:{port}/db?sslmode=prefer")).await;
        assert!(matches!(err, StoreError::Unavailable(_)), "{err:?}");
    }

    #[tokio::test]
    async fn a_handshake_cut_by_the_network_stays_retryable() {
        let port = ssl_answering(b'S').await;
        let err = connect_error(&format!("postgres://u@127.0.0.1:{port}/db?sslmode=require")).await;
        assert!(matches!(err, StoreError::Unavailable(_)), "{err:?}");
        assert!(err.is_retryable());
    }

    fn unavailable() -> Fail {
        Fail { error: StoreError::Unavailable("terminated".into()), retry: true }
    }

    #[tokio::test(start_paused = true)]
    async fn retries_pause_and_stop_after_the_last_attempt() {
        let tries = AtomicUsize::new(0);
        let started = tokio::time::Instant::now();
        let result: Result<(), StoreError> = retrying(|| async {
            tries.fetch_add(1, Ordering::SeqCst);
            Err(unavailable())
        })
        .await;
        assert_eq!(result, Err(StoreError::Unavailable("terminated".into())));
        assert_eq!(tries.load(Ordering::SeqCst), ATTEMPTS);
        assert_eq!(started.elapsed(), Duration::from_millis(5 + 20 + 80), "paused before each retry");
    }

    #[tokio::test(start_paused = true)]
    async fn a_retry_that_succeeds_ends_it_and_a_final_failure_is_not_retried() {
        let tries = AtomicUsize::new(0);
        let value =
            retrying(|| async { if tries.fetch_add(1, Ordering::SeqCst) < 2 { Err(unavailable()) } else { Ok(7) } })
                .await;
        assert_eq!(value, Ok(7));
        assert_eq!(tries.load(Ordering::SeqCst), 3);

        let tries = AtomicUsize::new(0);
        let result: Result<(), StoreError> = retrying(|| async {
            tries.fetch_add(1, Ordering::SeqCst);
            Err(Fail::from(StoreError::Corrupt("bad schema".into())))
        })
        .await;
        assert!(matches!(result, Err(StoreError::Corrupt(_))));
        assert_eq!(tries.load(Ordering::SeqCst), 1, "a failure retrying cannot fix is returned at once");
    }
}
