//! `PostgresStore` over TLS, against a private PostgreSQL server
//! ([`kuralle_tests::private_pg`], never the shared server): a CA and a server certificate for
//! `localhost` made with rcgen, `ssl = on`, and a `pg_hba.conf` that accepts TCP connections
//! over TLS only (`hostnossl … reject`). Without initdb each test prints a skip notice and
//! passes.
//!
//! The tests that run at the same time share one server; the last one to drop it stops it
//! and removes its directory.

use std::error::Error as _;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::time::Duration;

use kuralle::stores::rustls::pki_types::{CertificateDer, pem::PemObject};
use kuralle::stores::rustls::{self, CertificateError, ClientConfig, RootCertStore};
use kuralle::stores::{PostgresOptions, PostgresStore, PostgresTls};
use kuralle::testing::{ScriptedModel, Turn};
use kuralle::{AgentDef, RunError, RunRequest, RunStatus, RunStore, Runtime, StoreError, WorkerOptions};
use kuralle_tests::FnTool;
use kuralle_tests::postgres::unique_schema;
use kuralle_tests::private_pg::PrivatePostgres;
use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair, KeyUsagePurpose};
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio_postgres::error::SqlState;

/// A private server (see [`PrivatePostgres`]) with TLS, and its certificates.
struct Server {
    pg: PrivatePostgres,
    port: u16,
}

static SERVER: Mutex<Weak<Server>> = Mutex::new(Weak::new());

/// The shared server (started if no running test holds it), or `None` after a skip notice.
fn server(test: &str) -> Option<Arc<Server>> {
    let mut shared = SERVER.lock().unwrap_or_else(PoisonError::into_inner);
    if let Some(server) = shared.upgrade() {
        return Some(server);
    }
    match Server::start() {
        Ok(server) => {
            let server = Arc::new(server);
            *shared = Arc::downgrade(&server);
            Some(server)
        }
        Err(reason) => {
            eprintln!("skipping {test}: {reason}");
            None
        }
    }
}

/// A self-signed CA: its certificate (PEM) and what signs with it.
fn certificate_authority(name: &str) -> (String, Issuer<'static, KeyPair>) {
    let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.distinguished_name.push(DnType::CommonName, name);
    params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign, KeyUsagePurpose::DigitalSignature];
    let key = KeyPair::generate().unwrap();
    let cert = params.self_signed(&key).unwrap();
    (cert.pem(), Issuer::new(params, key))
}

impl Server {
    fn start() -> Result<Self, String> {
        // The CA clients trust, another one they do not, and a server certificate for
        // `localhost` (only) signed by the first.
        let (ca_pem, ca) = certificate_authority("kuralle test CA");
        let (other_pem, _) = certificate_authority("some other CA");
        let server_key = KeyPair::generate().unwrap();
        let mut params = CertificateParams::new(vec!["localhost".to_owned()]).unwrap();
        params.distinguished_name.push(DnType::CommonName, "localhost");
        let server_cert = params.signed_by(&server_key, &ca).unwrap();
        let pg = PrivatePostgres::builder()
            .prefix("kuralle-pg-tls-")
            .data_file("server.crt", server_cert.pem(), 0o644)
            .data_file("server.key", server_key.serialize_pem(), 0o600)
            .conf("ssl = on")
            .conf("ssl_cert_file = 'server.crt'")
            .conf("ssl_key_file = 'server.key'")
            // TCP connections over TLS only.
            .hba("hostssl all all 127.0.0.1/32 trust")
            .hba("hostnossl all all 127.0.0.1/32 reject")
            .start()?;
        std::fs::write(pg.dir().join("ca.pem"), ca_pem).map_err(|e| e.to_string())?;
        std::fs::write(pg.dir().join("other-ca.pem"), other_pem).map_err(|e| e.to_string())?;
        Ok(Self { port: pg.port(), pg })
    }

    fn ca(&self) -> String {
        self.pg.dir().join("ca.pem").display().to_string()
    }

    fn other_ca(&self) -> String {
        self.pg.dir().join("other-ca.pem").display().to_string()
    }

    /// A URL for `user` that reaches the server at 127.0.0.1 under the TLS name `host`.
    fn url_as(&self, user: &str, host: &str, params: &str) -> String {
        format!("postgres://{user}@{host}:{}/postgres?hostaddr=127.0.0.1&{params}", self.port)
    }

    fn url(&self, host: &str, params: &str) -> String {
        self.url_as("postgres", host, params)
    }

    /// A superuser connection over the Unix socket (where TLS plays no part).
    async fn admin(&self) -> tokio_postgres::Client {
        self.pg.admin().await
    }

    /// How many backends run for `application_name`, and whether all of them are on TLS.
    async fn tls_of(&self, application_name: &str) -> (i64, bool) {
        let row = self
            .admin()
            .await
            .query_one(
                "SELECT count(*), coalesce(bool_and(s.ssl), false) FROM pg_stat_ssl s
                 JOIN pg_stat_activity a USING (pid) WHERE a.application_name = $1",
                &[&application_name],
            )
            .await
            .unwrap();
        (row.get(0), row.get(1))
    }

    /// Ends the backends of `application_name` and waits until they are gone.
    async fn terminate(&self, application_name: &str) {
        let admin = self.admin().await;
        for _ in 0..200 {
            let left: i64 = admin
                .query_one(
                    "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE application_name = $1",
                    &[&application_name],
                )
                .await
                .unwrap()
                .get(0);
            if left == 0 {
                return;
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
        panic!("the backends of {application_name} do not end");
    }
}

fn options() -> PostgresOptions {
    PostgresOptions {
        schema: unique_schema("tls"),
        connect_timeout: Duration::from_secs(20),
        ..PostgresOptions::default()
    }
}

async fn refused(url: &str, options: PostgresOptions) -> StoreError {
    PostgresStore::connect_with(url, options).await.expect_err("the connection is refused")
}

/// The rustls error under a store error (store error → tokio-postgres → I/O → rustls).
fn rustls_cause(error: &StoreError) -> Option<&rustls::Error> {
    let postgres = error.source()?.source()?.downcast_ref::<tokio_postgres::Error>()?;
    postgres.source()?.downcast_ref::<std::io::Error>()?.get_ref()?.downcast_ref::<rustls::Error>()
}

fn is_unknown_issuer(error: &StoreError) -> bool {
    matches!(rustls_cause(error), Some(rustls::Error::InvalidCertificate(CertificateError::UnknownIssuer)))
}

/// `verify-full` with the server's CA: the store's connections (pooled and `LISTEN`) are
/// encrypted, and a run with a tool call goes through it end to end.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn verify_full_with_the_servers_ca_is_encrypted_end_to_end() {
    let Some(server) = server("verify_full_with_the_servers_ca_is_encrypted_end_to_end") else { return };
    let app = unique_schema("e2e");
    let url =
        server.url("localhost", &format!("sslmode=verify-full&sslrootcert={}&application_name={app}", server.ca()));
    let store = PostgresStore::connect_with(&url, options()).await.expect("verify-full with the right CA connects");

    let model = ScriptedModel::new([Turn::tool_calls([("c1", "echo", r#"{"said":"hi"}"#)]), Turn::text("Done.")]);
    let runtime = Runtime::builder()
        .agent(AgentDef::new("support", "Be brief.").tool(FnTool::new("echo", |args, _| async move { Ok(args) })))
        .model(model)
        .store(store.clone())
        .build()
        .unwrap();
    let out = runtime.run(RunRequest::new("say hi").run_id("r1")).await.unwrap();
    assert_eq!(out.text, "Done.");
    assert_eq!(store.get_run("r1").await.unwrap().unwrap().status, RunStatus::Finished);
    let steps = store.steps("r1").await.unwrap();
    assert!(
        steps
            .iter()
            .any(|s| s.name == "echo"
                && s.result.as_ref().map(kuralle::JsonText::to_value) == Some(json!({"said": "hi"}))),
        "{steps:?}"
    );

    // The LISTEN connection starts on the first wait, with the same TLS.
    store.wait_runnable(Duration::from_millis(1)).await;
    let admin = server.admin().await;
    let mut listening = None;
    for _ in 0..200 {
        let row = admin
            .query_opt(
                "SELECT s.ssl FROM pg_stat_ssl s JOIN pg_stat_activity a USING (pid)
                 WHERE a.application_name = $1 AND a.query = 'LISTEN kuralle_runnable'",
                &[&app],
            )
            .await
            .unwrap();
        if let Some(row) = row {
            listening = Some(row.get::<_, bool>(0));
            break;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    assert_eq!(listening, Some(true), "the LISTEN connection is on TLS");
    let (connections, all_tls) = server.tls_of(&app).await;
    assert!(connections >= 2 && all_tls, "{connections} connections, all on TLS: {all_tls}");
}

/// `verify-full` checks the name: a certificate for `localhost` does not serve another host
/// name, nor the bare address. `verify-ca` checks the chain only and lets both through.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn verify_full_refuses_a_certificate_for_another_host_name() {
    let Some(server) = server("verify_full_refuses_a_certificate_for_another_host_name") else { return };
    for host in ["db.wrong-name.invalid", "127.0.0.1"] {
        let url = server.url(host, &format!("sslmode=verify-full&sslrootcert={}", server.ca()));
        let err = refused(&url, options()).await;
        assert!(matches!(&err, StoreError::Tls(m) if m.contains("not valid for name")), "{host}: {err:?}");
        assert!(
            matches!(
                rustls_cause(&err),
                Some(rustls::Error::InvalidCertificate(
                    CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. }
                ))
            ),
            "{host}: {err:?}"
        );
        assert!(!err.is_retryable());

        let app = unique_schema("ca");
        let url = server.url(host, &format!("sslmode=verify-ca&sslrootcert={}&application_name={app}", server.ca()));
        let store = PostgresStore::connect_with(&url, options()).await.expect("verify-ca ignores the name");
        assert!(store.get_run("none").await.unwrap().is_none());
        assert!(matches!(server.tls_of(&app).await, (n, true) if n >= 1));
    }
}

/// A root that did not sign the server's certificate (from the URL, from the options, or the
/// platform's) is refused under every mode that verifies; the roots given in the options take
/// the place of the URL's, and a whole rustls configuration decides by itself.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_root_that_did_not_sign_the_certificate_is_refused() {
    let Some(server) = server("a_root_that_did_not_sign_the_certificate_is_refused") else { return };
    for mode in ["verify-full", "verify-ca", "require", "prefer"] {
        let url = server.url("localhost", &format!("sslmode={mode}&sslrootcert={}", server.other_ca()));
        let err = refused(&url, options()).await;
        assert!(matches!(err, StoreError::Tls(_)) && is_unknown_issuer(&err), "{mode}: {err:?}");
        assert!(!err.is_retryable());
    }
    // No sslrootcert: the platform's roots, which know nothing of the test CA.
    let err = refused(&server.url("localhost", "sslmode=verify-full"), options()).await;
    assert!(matches!(err, StoreError::Tls(_)), "{err:?}");

    let pem = |path: String| std::fs::read(path).unwrap();
    let roots = |path: String| PostgresOptions { tls: PostgresTls::roots_from_pem(pem(path)).unwrap(), ..options() };
    let with_ca = server.url("localhost", &format!("sslmode=verify-full&sslrootcert={}", server.ca()));
    let err = refused(&with_ca, roots(server.other_ca())).await;
    assert!(is_unknown_issuer(&err), "the options' roots replace the URL's: {err:?}");
    PostgresStore::connect_with(&server.url("localhost", "sslmode=verify-full"), roots(server.ca()))
        .await
        .expect("the options' roots verify the server");

    let config = |path: String| {
        let mut store = RootCertStore::empty();
        for cert in CertificateDer::pem_slice_iter(&pem(path)) {
            store.add(cert.unwrap()).unwrap();
        }
        let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
        let config = ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_root_certificates(store)
            .with_no_client_auth();
        PostgresOptions { tls: PostgresTls::Config(Arc::new(config)), ..options() }
    };
    // Under `require`, which alone would verify nothing, the configuration's verifier decides.
    let require = server.url("localhost", "sslmode=require");
    let err = refused(&require, config(server.other_ca())).await;
    assert!(is_unknown_issuer(&err), "{err:?}");
    PostgresStore::connect_with(&require, config(server.ca())).await.expect("the configuration trusts the CA");
}

/// `require` without a root encrypts without verifying (libpq's meaning), and so does the
/// default (`prefer`) against a server that offers TLS.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn require_without_a_root_connects_encrypted() {
    let Some(server) = server("require_without_a_root_connects_encrypted") else { return };
    for mode in ["sslmode=require&", ""] {
        let app = unique_schema("req");
        let url = server.url("127.0.0.1", &format!("{mode}application_name={app}"));
        let store = PostgresStore::connect_with(&url, options()).await.unwrap_or_else(|e| panic!("{mode}: {e}"));
        let lease = store.acquire_lease("r", "me", Duration::from_secs(30)).await.unwrap();
        assert_eq!(lease.token, 1);
        let (connections, all_tls) = server.tls_of(&app).await;
        assert!(connections >= 1 && all_tls, "{mode}: {connections} connections, all on TLS: {all_tls}");
    }
}

/// A connection without TLS to a server whose `pg_hba.conf` wants TLS is refused with SQLSTATE
/// 28000: a typed, non-retryable error carrying the server's reason (once a corrupt store).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clear_text_against_a_tls_only_server_is_access_denied() {
    let Some(server) = server("clear_text_against_a_tls_only_server_is_access_denied") else { return };
    let err = refused(&server.url("localhost", "sslmode=disable"), options()).await;
    assert!(matches!(&err, StoreError::AccessDenied(m) if m.contains("28000") && m.contains("pg_hba.conf")), "{err:?}");
    assert!(!err.is_retryable());
    let cause = err.source().and_then(|m| m.source()).and_then(|e| e.downcast_ref::<tokio_postgres::Error>());
    assert_eq!(cause.and_then(tokio_postgres::Error::code), Some(&SqlState::INVALID_AUTHORIZATION_SPECIFICATION));
}

/// A role created to log in as `postgres` does, and a runtime on a store connected as it.
async fn runtime_as_role(server: &Server, port: u16, app: &str) -> Runtime {
    server.admin().await.batch_execute(&format!("CREATE ROLE \"{app}\" LOGIN SUPERUSER")).await.unwrap();
    let url = format!(
        "postgres://{app}@localhost:{port}/postgres?hostaddr=127.0.0.1&sslmode=verify-full&sslrootcert={}&application_name={app}",
        server.ca()
    );
    let store = PostgresStore::connect_with(&url, options()).await.unwrap();
    Runtime::builder()
        .agent(AgentDef::new("support", "x"))
        .model(ScriptedModel::new([Turn::text("unused")]))
        .store(store)
        .build()
        .unwrap()
}

/// A worker serving until it fails by itself (or the test gives up on it).
async fn serve_until_it_fails(runtime: &Runtime) -> RunError {
    let options = WorkerOptions { poll_interval: Duration::from_millis(20), ..WorkerOptions::default() };
    let served = tokio::time::timeout(Duration::from_secs(60), runtime.serve_with(std::future::pending(), options));
    served.await.expect("the worker stops by itself instead of retrying forever").expect_err("the worker fails")
}

/// A worker whose store the server stops letting in (its role may no longer log in) returns
/// the typed error instead of retrying forever.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_refused_by_the_server_stops() {
    let Some(server) = server("a_worker_refused_by_the_server_stops") else { return };
    let app = unique_schema("denied");
    let runtime = runtime_as_role(&server, server.port, &app).await;
    server.admin().await.batch_execute(&format!("ALTER ROLE \"{app}\" NOLOGIN")).await.unwrap();
    server.terminate(&app).await;
    let err = serve_until_it_fails(&runtime).await;
    assert!(
        matches!(&err, RunError::Store(StoreError::AccessDenied(m)) if m.contains("not permitted to log in")),
        "{err:?}"
    );
}

/// A worker whose store's TLS stops being possible (the server, reached through a proxy here,
/// answers that it has no TLS) returns the typed TLS error instead of retrying forever.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_whose_tls_is_refused_stops() {
    let Some(server) = server("a_worker_whose_tls_is_refused_stops") else { return };
    let no_tls = Arc::new(AtomicBool::new(false));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let proxy_port = listener.local_addr().unwrap().port();
    let (upstream, flag) = (server.port, no_tls.clone());
    tokio::spawn(async move {
        while let Ok((mut client, _)) = listener.accept().await {
            let no_tls = flag.load(Ordering::SeqCst);
            tokio::spawn(async move {
                if no_tls {
                    // As a server without TLS: `N` to the SSLRequest.
                    let mut request = [0; 8];
                    if client.read_exact(&mut request).await.is_ok() {
                        let _ = client.write_all(b"N").await;
                        let _ = client.read_to_end(&mut Vec::new()).await;
                    }
                } else if let Ok(mut server) = tokio::net::TcpStream::connect(("127.0.0.1", upstream)).await {
                    let _ = tokio::io::copy_bidirectional(&mut client, &mut server).await;
                }
            });
        }
    });
    let app = unique_schema("notls");
    let runtime = runtime_as_role(&server, proxy_port, &app).await;
    no_tls.store(true, Ordering::SeqCst);
    server.terminate(&app).await;
    let err = serve_until_it_fails(&runtime).await;
    assert!(
        matches!(&err, RunError::Store(StoreError::Tls(m)) if m.contains("server does not support TLS")),
        "{err:?}"
    );
}
