//! Who is asking: a bearer token, a session cookie from the login form, an identity header
//! from an authenticating reverse proxy the operator named, or (on loopback with none of
//! these configured) the operator. The decider's name comes from here, never from a form.

use std::{
    collections::HashMap,
    path::Path,
    sync::Mutex,
    time::{Duration, Instant},
};

use axum::http::{HeaderMap, HeaderName, header};

use crate::error::CliError;

/// The session cookie's name.
pub const COOKIE: &str = "kuralle_session";

/// How long a session lasts after login.
const SESSION_TTL: Duration = Duration::from_secs(12 * 60 * 60);

/// At most this many sessions are kept; the oldest go first.
const MAX_SESSIONS: usize = 10_000;

/// Shorter tokens are refused at start: they could be guessed.
const MIN_TOKEN_CHARS: usize = 16;

/// How requests are authenticated.
pub struct Auth {
    /// `(name, token)`: who a presented token names.
    tokens: Vec<(String, String)>,
    /// The header an authenticating proxy sets, when the operator trusts one.
    proxy_header: Option<HeaderName>,
    /// Who decides when authentication is off (loopback only).
    operator: String,
    sessions: Mutex<HashMap<String, Session>>,
}

#[derive(Clone)]
struct Session {
    identity: String,
    csrf: String,
    created: Instant,
}

/// An authenticated caller, as handlers see it.
#[derive(Clone, Debug)]
pub struct Caller {
    /// Who: the token's name, the proxy's user, or the operator.
    pub identity: String,
    /// From where, for the audit trail.
    pub origin: String,
    /// The session's anti-forgery token, for forms; `None` for a bearer request (a browser
    /// never adds an `Authorization` header on its own, so it cannot be forged cross-site).
    pub csrf: Option<String>,
    /// A session cookie to set on the response.
    pub new_session: Option<String>,
}

/// Why a request is not let in.
pub enum Refusal {
    /// No credentials, or wrong ones: log in.
    Login(&'static str),
    /// The proxy did not send its header.
    NoProxyUser(String),
}

impl Auth {
    /// Authentication as configured; `tokens` from [`load_tokens`].
    pub fn new(tokens: Vec<(String, String)>, proxy_header: Option<&str>, operator: String) -> Result<Self, CliError> {
        let proxy_header = proxy_header
            .map(|h| {
                HeaderName::try_from(h.trim())
                    .map_err(|_| CliError::Console(format!("--trust-proxy-header `{h}` is not a header name")))
            })
            .transpose()?;
        Ok(Self { tokens, proxy_header, operator, sessions: Mutex::default() })
    }

    /// Whether nothing authenticates requests (allowed on loopback only).
    pub fn is_off(&self) -> bool {
        self.tokens.is_empty() && self.proxy_header.is_none()
    }

    /// Whether a login form makes sense (tokens are configured).
    pub fn has_tokens(&self) -> bool {
        !self.tokens.is_empty()
    }

    /// The name of the token `presented`, comparing against every token in constant time.
    pub fn token_identity(&self, presented: &str) -> Option<String> {
        let mut found = None;
        for (name, token) in &self.tokens {
            if constant_time_eq(presented.as_bytes(), token.as_bytes()) && found.is_none() {
                found = Some(name.clone());
            }
        }
        found
    }

    /// Starts a session for `identity`; returns its id (the cookie's value).
    pub fn start_session(&self, identity: &str) -> (String, String) {
        let id = random_token();
        let csrf = random_token();
        let mut sessions = self.sessions.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        sessions.retain(|_, s| s.created.elapsed() < SESSION_TTL);
        if sessions.len() >= MAX_SESSIONS
            && let Some(oldest) = sessions.iter().min_by_key(|(_, s)| s.created).map(|(k, _)| k.clone())
        {
            sessions.remove(&oldest);
        }
        sessions
            .insert(id.clone(), Session { identity: identity.to_owned(), csrf: csrf.clone(), created: Instant::now() });
        (id, csrf)
    }

    /// Ends the session `id`.
    pub fn end_session(&self, id: &str) {
        self.sessions.lock().unwrap_or_else(std::sync::PoisonError::into_inner).remove(id);
    }

    fn session(&self, id: &str) -> Option<Session> {
        let sessions = self.sessions.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        sessions.get(id).filter(|s| s.created.elapsed() < SESSION_TTL).cloned()
    }

    /// Who sent a request with `headers` from `remote`.
    pub fn caller(&self, headers: &HeaderMap, remote: &str) -> Result<Caller, Refusal> {
        let session = session_id(headers).and_then(|id| self.session(&id).map(|s| (id, s)));
        // A session for `identity`: the cookie's if it is that identity's, else a new one.
        let with_session = |identity: String, origin: String| {
            if let Some((_, s)) = session.as_ref().filter(|(_, s)| s.identity == identity) {
                return Caller { identity, origin, csrf: Some(s.csrf.clone()), new_session: None };
            }
            let (id, csrf) = self.start_session(&identity);
            Caller { identity, origin, csrf: Some(csrf), new_session: Some(id) }
        };
        if let Some(name) = &self.proxy_header {
            let user = headers.get(name).and_then(|v| v.to_str().ok()).map(str::trim).filter(|u| !u.is_empty());
            if let Some(user) = user {
                let forwarded = headers.get("x-forwarded-for").and_then(|v| v.to_str().ok());
                let origin = match forwarded {
                    Some(f) => format!("{} via proxy {remote} ({name})", f.trim()),
                    None => format!("proxy {remote} ({name})"),
                };
                return Ok(with_session(user.to_owned(), origin));
            }
            if !self.has_tokens() {
                return Err(Refusal::NoProxyUser(name.to_string()));
            }
        }
        if let Some(auth) = headers.get(header::AUTHORIZATION).and_then(|v| v.to_str().ok()) {
            let presented = auth.strip_prefix("Bearer ").map(str::trim).unwrap_or_default();
            return match self.token_identity(presented) {
                Some(identity) => Ok(Caller { identity, origin: remote.to_owned(), csrf: None, new_session: None }),
                None => Err(Refusal::Login("that token is not valid")),
            };
        }
        if self.is_off() {
            return Ok(with_session(self.operator.clone(), remote.to_owned()));
        }
        match session {
            Some((_, s)) => {
                Ok(Caller { identity: s.identity, origin: remote.to_owned(), csrf: Some(s.csrf), new_session: None })
            }
            None => Err(Refusal::Login("log in to use this console")),
        }
    }
}

/// `Set-Cookie` for session `id`: never readable by scripts, never sent cross-site.
pub fn session_cookie(id: &str) -> String {
    format!("{COOKIE}={id}; Path=/; HttpOnly; SameSite=Strict; Max-Age={}", SESSION_TTL.as_secs())
}

/// `Set-Cookie` that removes the session cookie.
pub fn clear_cookie() -> String {
    format!("{COOKIE}=; Path=/; HttpOnly; SameSite=Strict; Max-Age=0")
}

/// The session cookie's value, if sent.
pub fn session_id(headers: &HeaderMap) -> Option<String> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .find_map(|c| c.trim().strip_prefix(COOKIE)?.strip_prefix('=').map(str::to_owned))
        .filter(|v| !v.is_empty())
}

/// Tokens from `--token-file` and `KURALLE_CONSOLE_TOKEN` (`env`), as `(name, token)`.
pub fn load_tokens(file: Option<&Path>, env: Option<&str>, operator: &str) -> Result<Vec<(String, String)>, CliError> {
    let mut tokens = Vec::new();
    if let Some(path) = file {
        let text = std::fs::read_to_string(path)
            .map_err(|e| CliError::Console(format!("cannot read --token-file `{}`: {e}", path.display())))?;
        for (n, line) in text.lines().enumerate() {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let (name, token) = line
                .split_once(':')
                .ok_or_else(|| CliError::Console(format!("{}:{}: expected `NAME:TOKEN`", path.display(), n + 1)))?;
            tokens.push(checked(name, token, &format!("{}:{}", path.display(), n + 1))?);
        }
    }
    if let Some(value) = env.map(str::trim).filter(|v| !v.is_empty()) {
        let (name, token) = value.split_once(':').unwrap_or((operator, value));
        tokens.push(checked(name, token, "KURALLE_CONSOLE_TOKEN")?);
    }
    Ok(tokens)
}

fn checked(name: &str, token: &str, at: &str) -> Result<(String, String), CliError> {
    let (name, token) = (name.trim(), token.trim());
    if name.is_empty() {
        return Err(CliError::Console(format!("{at}: the token has no name (expected `NAME:TOKEN`)")));
    }
    if token.chars().count() < MIN_TOKEN_CHARS {
        return Err(CliError::Console(format!(
            "{at}: the token for `{name}` is shorter than {MIN_TOKEN_CHARS} characters; use a random one (e.g. `openssl rand -hex 32`)"
        )));
    }
    Ok((name.to_owned(), token.to_owned()))
}

/// Equality whose time depends on the lengths only, not on where the bytes differ.
pub fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// 244 random bits from the operating system's generator, as hex.
fn random_token() -> String {
    format!("{}{}", uuid::Uuid::new_v4().simple(), uuid::Uuid::new_v4().simple())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_load_with_names_and_weak_ones_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("tokens");
        std::fs::write(&file, "# operators\nalice:0123456789abcdef0123\n\nbob: fedcba9876543210fedc \n").unwrap();
        let tokens = load_tokens(Some(&file), Some("0000111122223333"), "ops").unwrap();
        let names: Vec<&str> = tokens.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(names, ["alice", "bob", "ops"]);
        std::fs::write(&file, "carol:short\n").unwrap();
        assert!(load_tokens(Some(&file), None, "ops").unwrap_err().to_string().contains("shorter than 16"));
        std::fs::write(&file, "no-name-0123456789abcdef\n").unwrap();
        assert!(load_tokens(Some(&file), None, "ops").is_err());
    }

    #[test]
    fn a_token_names_its_holder() {
        let auth = Auth::new(vec![("alice".into(), "0123456789abcdef0123".into())], None, "ops".into()).unwrap();
        assert_eq!(auth.token_identity("0123456789abcdef0123").as_deref(), Some("alice"));
        assert_eq!(auth.token_identity("0123456789abcdef0124"), None);
        assert_eq!(auth.token_identity(""), None);
        assert!(
            constant_time_eq(b"abc", b"abc") && !constant_time_eq(b"abc", b"abd") && !constant_time_eq(b"a", b"ab")
        );
    }

    #[test]
    fn the_session_cookie_is_read_among_others() {
        let mut h = HeaderMap::new();
        h.insert(header::COOKIE, "a=1; kuralle_session=xyz; b=2".parse().unwrap());
        assert_eq!(session_id(&h).as_deref(), Some("xyz"));
        assert!(session_cookie("xyz").contains("HttpOnly; SameSite=Strict"));
    }
}
