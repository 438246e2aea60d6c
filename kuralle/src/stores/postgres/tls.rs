//! TLS for PostgreSQL connections, on rustls: the connection string's `sslmode` and
//! `sslrootcert` read as libpq reads them, and [`PostgresTls`] for what a URL cannot carry.
//!
//! tokio-postgres knows `sslmode` `disable`, `prefer` and `require` only, and refuses any
//! option it does not know (`sslrootcert`): [`parse`] takes both out of the connection string
//! (URL or `key=value` form) before tokio-postgres reads the rest, and the verification each
//! mode asks for is done by the rustls `ClientConfig` built here.

use std::fmt;
use std::path::PathBuf;
use std::str::FromStr;
use std::sync::Arc;

use rustls::client::WebPkiServerVerifier;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::{CryptoProvider, verify_tls12_signature, verify_tls13_signature};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{CertificateError, ClientConfig, DigitallySignedStruct, RootCertStore, SignatureScheme};
use tokio_postgres::config::Host;
use tokio_postgres_rustls::MakeRustlsConnect;

use crate::store::StoreError;

/// TLS settings that a connection URL cannot carry: the root certificates that verify the
/// server, or a whole rustls configuration. Set on [`PostgresOptions::tls`](super::PostgresOptions::tls).
///
/// The URL's `sslmode` still decides whether TLS is used and how much is verified:
///
/// | `sslmode` | TLS | verified |
/// |---|---|---|
/// | `disable` | never | — |
/// | `prefer` (the default) | if the server offers it, else clear text | the chain, when root certificates are given (`sslrootcert` or [`Roots`](Self::Roots)); else nothing |
/// | `require` | always (a server without TLS is refused) | as `prefer` |
/// | `verify-ca` | always | the chain, against the given roots or else the platform's |
/// | `verify-full` | always | the chain and the host name |
///
/// Over a Unix socket TLS is never used (PostgreSQL does not offer it there).
///
/// ```
/// use kuralle::stores::{PostgresOptions, PostgresTls};
///
/// let ca = "-----BEGIN CERTIFICATE-----\nnot a certificate\n-----END CERTIFICATE-----\n";
/// // A PEM file holds the roots (the same as `?sslrootcert=ca.pem` in the URL).
/// let refused = PostgresTls::roots_from_pem(ca.as_bytes());
/// assert!(matches!(refused, Err(kuralle::StoreError::Tls(_))), "not a certificate");
///
/// let options = PostgresOptions { tls: PostgresTls::FromUrl, ..PostgresOptions::default() };
/// assert_eq!(options.tls, PostgresTls::default());
/// ```
#[derive(Clone, Default)]
#[non_exhaustive]
pub enum PostgresTls {
    /// The URL decides: `sslrootcert=PATH` (a PEM file) verifies the server, or
    /// `sslrootcert=system` or no `sslrootcert` the platform's root certificates (those of the
    /// operating system; `SSL_CERT_FILE` and `SSL_CERT_DIR` are honoured) where the mode verifies.
    #[default]
    FromUrl,
    /// These root certificates verify the server, in place of the URL's `sslrootcert` and of
    /// the platform's roots.
    Roots(Arc<RootCertStore>),
    /// This rustls configuration is used for every TLS connection as it is: its verifier (and
    /// client certificate, if any) decides. The URL's `sslmode` only decides whether TLS is
    /// used (`disable`) and whether a server without TLS is accepted (`prefer`). Build it with
    /// an explicit crypto provider (`ClientConfig::builder_with_provider`), or install a
    /// process-level default provider before.
    ///
    /// ```
    /// use std::sync::Arc;
    /// use kuralle::stores::rustls::{self, ClientConfig, RootCertStore};
    /// use kuralle::stores::{PostgresOptions, PostgresTls};
    ///
    /// let roots = RootCertStore::empty(); // add your CA, or take rustls-native-certs' roots
    /// let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    /// let config = ClientConfig::builder_with_provider(provider)
    ///     .with_safe_default_protocol_versions()
    ///     .unwrap()
    ///     .with_root_certificates(roots)
    ///     .with_no_client_auth(); // or .with_client_auth_cert(chain, key)
    /// let options = PostgresOptions { tls: PostgresTls::Config(Arc::new(config)), ..PostgresOptions::default() };
    /// # let _ = options;
    /// ```
    Config(Arc<ClientConfig>),
}

impl PostgresTls {
    /// [`Roots`](Self::Roots) from the certificates of a PEM text (a CA bundle).
    ///
    /// ```
    /// use kuralle::stores::PostgresTls;
    ///
    /// // The CA file a server's administrator hands out; here, none of it is a certificate.
    /// assert!(PostgresTls::roots_from_pem(b"").is_err());
    /// ```
    ///
    /// # Errors
    /// [`StoreError::Tls`] if the text holds no certificate or one that cannot be a root.
    pub fn roots_from_pem(pem: impl AsRef<[u8]>) -> Result<Self, StoreError> {
        roots_from_pem(pem.as_ref(), "the given PEM text").map(|roots| Self::Roots(Arc::new(roots)))
    }
}

impl fmt::Debug for PostgresTls {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::FromUrl => f.write_str("FromUrl"),
            Self::Roots(roots) => f.debug_tuple("Roots").field(&format_args!("{} certificates", roots.len())).finish(),
            Self::Config(_) => f.write_str("Config(..)"),
        }
    }
}

/// Equal when both are [`FromUrl`](Self::FromUrl), or both share the same roots or configuration
/// (the same `Arc`).
impl PartialEq for PostgresTls {
    fn eq(&self, other: &Self) -> bool {
        match (self, other) {
            (Self::FromUrl, Self::FromUrl) => true,
            (Self::Roots(a), Self::Roots(b)) => Arc::ptr_eq(a, b),
            (Self::Config(a), Self::Config(b)) => Arc::ptr_eq(a, b),
            _ => false,
        }
    }
}

impl Eq for PostgresTls {}

/// libpq's `sslmode`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum SslMode {
    Disable,
    Prefer,
    Require,
    VerifyCa,
    VerifyFull,
}

impl SslMode {
    fn parse(value: &str) -> Result<Self, StoreError> {
        Ok(match value {
            "disable" => Self::Disable,
            // libpq's `allow` tries clear text first; connecting with TLS when offered is the
            // safer reading, and the server's rules decide either way.
            "allow" | "prefer" => Self::Prefer,
            "require" => Self::Require,
            "verify-ca" => Self::VerifyCa,
            "verify-full" => Self::VerifyFull,
            other => {
                return Err(invalid(&format!(
                    "sslmode `{other}` is not one of disable, allow, prefer, require, verify-ca, verify-full"
                )));
            }
        })
    }
}

/// Where root certificates come from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum RootCert {
    /// A PEM file.
    File(PathBuf),
    /// `sslrootcert=system`: the platform's roots.
    System,
}

/// A connection string, read.
#[derive(Debug)]
pub(super) struct Settings {
    /// Everything but TLS verification, for tokio-postgres (its `ssl_mode` set from `mode`).
    pub config: tokio_postgres::Config,
    pub mode: SslMode,
    pub root_cert: Option<RootCert>,
}

fn invalid(message: &str) -> StoreError {
    StoreError::Corrupt(format!("the PostgreSQL connection URL is invalid: {message}").into())
}

/// Reads a connection string (`postgres://…` / `postgresql://…`, or libpq's `key=value`
/// form).
///
/// # Errors
/// [`StoreError::Corrupt`] if it cannot be read (as for any invalid connection URL). The
/// message never holds the string itself: it may hold a password.
pub(super) fn parse(url: &str) -> Result<Settings, StoreError> {
    let (rest, ssl) = if url.starts_with("postgres://") || url.starts_with("postgresql://") {
        split_url(url)?
    } else {
        split_key_values(url)?
    };
    let mut config = tokio_postgres::Config::from_str(&rest).map_err(|e| invalid(&e.to_string()))?;
    let mut mode = None;
    let mut root_cert = None;
    for (key, value) in ssl {
        match key.as_str() {
            "sslmode" => mode = Some(SslMode::parse(&value)?),
            _ if value == "system" => root_cert = Some(RootCert::System),
            // `sslrootcert`
            _ => root_cert = Some(RootCert::File(PathBuf::from(value))),
        }
    }
    let mut mode = mode.unwrap_or(match root_cert {
        // As libpq: the platform's roots are only worth asking for with the host name checked.
        Some(RootCert::System) => SslMode::VerifyFull,
        _ => SslMode::Prefer,
    });
    let hosts = config.get_hosts();
    if !hosts.is_empty() && hosts.iter().all(|h| !matches!(h, Host::Tcp(_))) {
        // PostgreSQL offers no TLS over Unix sockets; libpq does not ask there.
        mode = SslMode::Disable;
    }
    if hosts.is_empty() && !config.get_hostaddrs().is_empty() {
        // tokio-postgres takes the TLS server name from `host` only: with `hostaddr` alone it
        // would refuse TLS. The address is the name to check, as in libpq.
        for addr in config.get_hostaddrs().to_vec() {
            config.host(addr.to_string());
        }
    }
    config.ssl_mode(match mode {
        SslMode::Disable => tokio_postgres::config::SslMode::Disable,
        SslMode::Prefer => tokio_postgres::config::SslMode::Prefer,
        SslMode::Require | SslMode::VerifyCa | SslMode::VerifyFull => tokio_postgres::config::SslMode::Require,
    });
    Ok(Settings { config, mode, root_cert })
}

/// The TLS keys this module reads; tokio-postgres gets the others.
fn is_tls_key(key: &str) -> bool {
    key == "sslmode" || key == "sslrootcert"
}

/// Splits a URL's query into the TLS parameters (decoded) and the URL without them.
fn split_url(url: &str) -> Result<(String, Vec<(String, String)>), StoreError> {
    // As tokio-postgres: credentials end at the first `@`, the query starts at the first `?`
    // after them.
    let after_credentials = url.find('@').map_or(0, |at| at + 1);
    let Some(question) = url[after_credentials..].find('?').map(|q| after_credentials + q) else {
        return Ok((url.to_owned(), Vec::new()));
    };
    let mut kept = Vec::new();
    let mut ssl = Vec::new();
    for pair in url[question + 1..].split('&').filter(|p| !p.is_empty()) {
        let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
        let key_decoded = percent_decode(key)?;
        if is_tls_key(&key_decoded) {
            ssl.push((key_decoded, percent_decode(value)?));
        } else {
            kept.push(pair);
        }
    }
    let mut rest = url[..question].to_owned();
    if !kept.is_empty() {
        rest.push('?');
        rest.push_str(&kept.join("&"));
    }
    Ok((rest, ssl))
}

fn percent_decode(text: &str) -> Result<String, StoreError> {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = bytes.get(i + 1..i + 3).and_then(|h| std::str::from_utf8(h).ok());
            let byte = hex.and_then(|h| u8::from_str_radix(h, 16).ok()).ok_or_else(|| invalid("a bad %-escape"))?;
            out.push(byte);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).map_err(|_| invalid("a %-escape that is not UTF-8"))
}

/// Splits libpq's `key = value …` form (values bare, or quoted with `'`, `\` escaping) into
/// the TLS parameters and the rest, each value of the rest quoted again.
fn split_key_values(text: &str) -> Result<(String, Vec<(String, String)>), StoreError> {
    let mut chars = text.chars().peekable();
    let mut kept = Vec::new();
    let mut ssl = Vec::new();
    loop {
        while chars.next_if(|c| c.is_whitespace()).is_some() {}
        let mut key = String::new();
        while let Some(c) = chars.next_if(|c| !c.is_whitespace() && *c != '=') {
            key.push(c);
        }
        if key.is_empty() {
            if chars.peek().is_some() {
                return Err(invalid("a parameter without a name"));
            }
            break;
        }
        while chars.next_if(|c| c.is_whitespace()).is_some() {}
        if chars.next() != Some('=') {
            return Err(invalid("a parameter without `=`"));
        }
        while chars.next_if(|c| c.is_whitespace()).is_some() {}
        let mut value = String::new();
        if chars.next_if_eq(&'\'').is_some() {
            loop {
                match chars.next() {
                    Some('\'') => break,
                    Some('\\') => value.extend(chars.next()),
                    Some(c) => value.push(c),
                    None => return Err(invalid("an unterminated quoted value")),
                }
            }
        } else {
            while let Some(c) = chars.next_if(|c| !c.is_whitespace()) {
                if c == '\\' {
                    value.extend(chars.next());
                } else {
                    value.push(c);
                }
            }
        }
        if is_tls_key(&key) {
            ssl.push((key, value));
        } else {
            kept.push(format!("{key}='{}'", value.replace('\\', "\\\\").replace('\'', "\\'")));
        }
    }
    Ok((kept.join(" "), ssl))
}

/// The one crypto provider of kuralle's TLS: aws-lc-rs, as reqwest's. Passed explicitly, so
/// that a process-level default is never needed (nor a conflict between two found).
fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::aws_lc_rs::default_provider())
}

fn tls_error(message: String) -> StoreError {
    StoreError::Tls(message.into())
}

fn roots_from_pem(pem: &[u8], what: &str) -> Result<RootCertStore, StoreError> {
    let mut roots = RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(pem) {
        let cert = cert.map_err(|e| tls_error(format!("cannot read the root certificates in {what}: {e}")))?;
        roots
            .add(cert)
            .map_err(|e| tls_error(format!("a root certificate in {what} cannot be used: {e}")).with_source(e))?;
    }
    if roots.is_empty() {
        return Err(tls_error(format!("{what} holds no certificate")));
    }
    Ok(roots)
}

fn platform_roots() -> Result<RootCertStore, StoreError> {
    let found = rustls_native_certs::load_native_certs();
    let mut roots = RootCertStore::empty();
    roots.add_parsable_certificates(found.certs);
    if roots.is_empty() {
        let errors: Vec<String> = found.errors.iter().map(ToString::to_string).collect();
        return Err(tls_error(format!(
            "no root certificates found on this system to verify the PostgreSQL server ({}); \
             give the server's CA with sslrootcert=PATH",
            if errors.is_empty() { "none installed".to_owned() } else { errors.join("; ") }
        )));
    }
    Ok(roots)
}

/// The connector for `settings` and `tls`.
///
/// # Errors
/// [`StoreError::Tls`] if the root certificates cannot be read.
pub(super) fn connector(settings: &Settings, tls: &PostgresTls) -> Result<MakeRustlsConnect, StoreError> {
    if settings.mode == SslMode::Disable {
        // Never used to connect: tokio-postgres does not start TLS under `disable`.
        return Ok(MakeRustlsConnect::new(config(Verify::Nothing)?));
    }
    let roots = match (tls, &settings.root_cert) {
        (PostgresTls::Config(config), _) => return Ok(MakeRustlsConnect::new(ClientConfig::clone(config))),
        (PostgresTls::Roots(roots), _) => Some(Arc::clone(roots)),
        (PostgresTls::FromUrl, Some(RootCert::File(path))) => {
            let pem = std::fs::read(path)
                .map_err(|e| tls_error(format!("cannot read sslrootcert `{}`: {e}", path.display())).with_source(e))?;
            Some(Arc::new(roots_from_pem(&pem, &format!("sslrootcert `{}`", path.display()))?))
        }
        (PostgresTls::FromUrl, Some(RootCert::System)) => Some(Arc::new(platform_roots()?)),
        (PostgresTls::FromUrl, None) => None,
    };
    let verify = match (settings.mode, roots) {
        (SslMode::VerifyFull, Some(roots)) => Verify::Full(roots),
        (SslMode::VerifyFull, None) => Verify::Full(Arc::new(platform_roots()?)),
        (SslMode::VerifyCa, None) => Verify::Chain(Arc::new(platform_roots()?)),
        // As libpq: with root certificates given, `prefer` and `require` verify the chain.
        (_, Some(roots)) => Verify::Chain(roots),
        (_, None) => Verify::Nothing,
    };
    Ok(MakeRustlsConnect::new(config(verify)?))
}

/// What the client checks of the server's certificate.
enum Verify {
    Nothing,
    Chain(Arc<RootCertStore>),
    Full(Arc<RootCertStore>),
}

fn config(verify: Verify) -> Result<ClientConfig, StoreError> {
    let provider = provider();
    let builder = ClientConfig::builder_with_provider(Arc::clone(&provider))
        .with_safe_default_protocol_versions()
        .map_err(|e| tls_error(format!("cannot set up TLS: {e}")))?;
    let webpki = |roots| {
        WebPkiServerVerifier::builder_with_provider(roots, Arc::clone(&provider))
            .build()
            .map_err(|e| tls_error(format!("cannot set up TLS verification: {e}")))
    };
    let verifier: Arc<dyn ServerCertVerifier> = match verify {
        Verify::Nothing => Arc::new(AnyCertificate(Arc::clone(&provider))),
        Verify::Chain(roots) => Arc::new(ChainOnly(webpki(roots)?)),
        Verify::Full(roots) => webpki(roots)?,
    };
    Ok(builder.dangerous().with_custom_certificate_verifier(verifier).with_no_client_auth())
}

/// `sslmode=require` without root certificates (libpq's semantics): any certificate is
/// accepted, but the handshake's signatures are still checked against it, so the session is
/// encrypted with the key of the certificate the server presented.
#[derive(Debug)]
struct AnyCertificate(Arc<CryptoProvider>);

impl ServerCertVerifier for AnyCertificate {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        verify_tls12_signature(message, cert, dss, &self.0.signature_verification_algorithms)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        verify_tls13_signature(message, cert, dss, &self.0.signature_verification_algorithms)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

/// `sslmode=verify-ca`: the chain must lead to a root, the name in the certificate is not
/// checked. WebPKI checks the name last, after the chain, validity and revocation, so a
/// name mismatch means everything else passed.
#[derive(Debug)]
struct ChainOnly(Arc<WebPkiServerVerifier>);

impl ServerCertVerifier for ChainOnly {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        match self.0.verify_server_cert(end_entity, intermediates, server_name, ocsp_response, now) {
            Err(rustls::Error::InvalidCertificate(
                CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. },
            )) => Ok(ServerCertVerified::assertion()),
            other => other,
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.supported_verify_schemes()
    }
}

#[cfg(test)]
mod tests {
    use tokio_postgres::config::SslMode as PgMode;

    use super::*;

    #[test]
    fn tls_parameters_leave_the_url_and_the_rest_stays() {
        let s = parse(
            "postgres://u:p%3Fw@db.example:6432/app?application_name=w%201&sslmode=verify-full&sslrootcert=%2Fetc%2Fca%20x.pem&connect_timeout=3",
        )
        .unwrap();
        assert_eq!(s.mode, SslMode::VerifyFull);
        assert_eq!(s.root_cert, Some(RootCert::File("/etc/ca x.pem".into())));
        assert_eq!(s.config.get_ssl_mode(), PgMode::Require);
        assert_eq!(s.config.get_application_name(), Some("w 1"));
        assert_eq!(s.config.get_connect_timeout(), Some(&std::time::Duration::from_secs(3)));
        assert_eq!(s.config.get_password(), Some(&b"p?w"[..]));
        assert_eq!(s.config.get_dbname(), Some("app"));
        assert_eq!(s.config.get_hosts(), [Host::Tcp("db.example".into())]);

        let s = parse("postgresql://u@h/db?sslmode=verify-ca").unwrap();
        assert_eq!((s.mode, s.root_cert, s.config.get_ssl_mode()), (SslMode::VerifyCa, None, PgMode::Require));
        let s = parse("postgres://u@h/db").unwrap();
        assert_eq!((s.mode, s.config.get_ssl_mode()), (SslMode::Prefer, PgMode::Prefer), "libpq's default");
        let s = parse("postgres://u@h/db?sslmode=disable").unwrap();
        assert_eq!((s.mode, s.config.get_ssl_mode()), (SslMode::Disable, PgMode::Disable));
        let s = parse("postgres://u@h/db?sslrootcert=system").unwrap();
        assert_eq!((s.mode, s.root_cert), (SslMode::VerifyFull, Some(RootCert::System)));
    }

    #[test]
    fn key_value_strings_are_read_the_same_way() {
        let s = parse(
            r"host=db.example user=u password='it\'s \\x' sslmode = require  sslrootcert='/a b/ca.pem' dbname=app",
        )
        .unwrap();
        assert_eq!((s.mode, s.root_cert), (SslMode::Require, Some(RootCert::File("/a b/ca.pem".into()))));
        assert_eq!(s.config.get_password(), Some(&br"it's \x"[..]));
        assert_eq!(s.config.get_dbname(), Some("app"));
        assert_eq!(s.config.get_ssl_mode(), PgMode::Require);
    }

    #[test]
    fn bad_modes_and_strings_are_refused_without_echoing_them() {
        for url in [
            "postgres://u:secret@h/db?sslmode=sometimes",
            "postgres://u:secret@h/db?sslrootcert=%zz",
            "host=h password=secret sslmode",
            "host=h password='secret",
        ] {
            let err = parse(url).unwrap_err();
            assert!(matches!(&err, StoreError::Corrupt(m) if !m.contains("secret")), "{url}: {err:?}");
        }
    }

    #[test]
    fn unix_sockets_never_use_tls_and_bare_addresses_become_the_name() {
        let s = parse("postgres://u@%2Fvar%2Frun%2Fpostgresql/db?sslmode=require").unwrap();
        assert_eq!((s.mode, s.config.get_ssl_mode()), (SslMode::Disable, PgMode::Disable));
        let s = parse("postgres://u@/db?hostaddr=127.0.0.1&sslmode=require").unwrap();
        assert_eq!(s.config.get_hosts(), [Host::Tcp("127.0.0.1".into())]);
        assert_eq!(s.config.get_ssl_mode(), PgMode::Require);
    }

    #[test]
    fn root_certificates_that_cannot_be_read_are_typed_tls_errors() {
        let missing = parse("postgres://u@h/db?sslmode=verify-full&sslrootcert=/nonexistent/ca.pem").unwrap();
        let err = connector(&missing, &PostgresTls::FromUrl).err().unwrap();
        assert!(matches!(&err, StoreError::Tls(m) if m.contains("/nonexistent/ca.pem")), "{err:?}");
        assert!(!err.is_retryable());
        assert!(matches!(PostgresTls::roots_from_pem("no PEM here"), Err(StoreError::Tls(_))));
        // `require` without roots needs none.
        let require = parse("postgres://u@h/db?sslmode=require").unwrap();
        assert!(connector(&require, &PostgresTls::FromUrl).is_ok());
    }
}
