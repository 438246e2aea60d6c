//! What every request passes besides authentication: the `Host` it names, the origin of a form
//! post and its anti-forgery token, and the headers every response carries.

use axum::{
    extract::Request,
    http::{HeaderMap, HeaderValue, header},
    middleware::Next,
    response::Response,
};

use super::auth::{Caller, constant_time_eq};

/// No scripts, no plugins, no framing by anyone; styles only inline (the pages carry theirs).
const CSP: &str = "default-src 'none'; style-src 'unsafe-inline'; img-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'";

/// Adds the security headers to every response: framing refused (clickjacking of the Approve
/// button), content types not sniffed, nothing cached, no `Referer` to other sites. (Not
/// `no-referrer`: under it a browser sends `Origin: null` with a form post, which the
/// same-origin check must refuse.)
pub async fn security_headers(request: Request, next: Next) -> Response {
    let mut response = next.run(request).await;
    let h = response.headers_mut();
    h.insert(header::CONTENT_SECURITY_POLICY, HeaderValue::from_static(CSP));
    h.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    h.insert(header::X_CONTENT_TYPE_OPTIONS, HeaderValue::from_static("nosniff"));
    h.insert(header::REFERRER_POLICY, HeaderValue::from_static("same-origin"));
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    response
}

/// The `Host`s the console answers: loopback names, and those given with `--allowed-host`.
pub struct Hosts {
    allowed: Vec<String>,
}

impl Hosts {
    /// Loopback names plus `allowed` (`name` for any port, `name:port` for one).
    pub fn new(allowed: &[String]) -> Self {
        Self { allowed: allowed.iter().map(|h| h.trim().to_ascii_lowercase()).filter(|h| !h.is_empty()).collect() }
    }

    /// Whether a request with `Host: host` is answered.
    pub fn allows(&self, host: &str) -> bool {
        let host = host.trim().to_ascii_lowercase();
        let name = match host.strip_prefix('[') {
            Some(v6) => v6.split(']').next().unwrap_or_default(),
            None => host.rsplit_once(':').map_or(host.as_str(), |(name, _)| name),
        };
        if name == "localhost" || name.parse::<std::net::IpAddr>().is_ok_and(|ip| ip.is_loopback()) {
            return true;
        }
        !host.is_empty() && self.allowed.iter().any(|a| *a == host || a == name)
    }
}

/// A form post must come from this console's own pages.
pub fn same_origin(headers: &HeaderMap) -> Result<(), String> {
    if headers.get("sec-fetch-site").and_then(|v| v.to_str().ok()) == Some("cross-site") {
        return Err("cross-site form posts are refused".to_owned());
    }
    let host = headers.get(header::HOST).and_then(|h| h.to_str().ok()).unwrap_or_default();
    match headers.get(header::ORIGIN).and_then(|o| o.to_str().ok()) {
        Some(origin) if origin == format!("http://{host}") || origin == format!("https://{host}") => Ok(()),
        Some(origin) => Err(format!("a form post from origin `{origin}` is refused")),
        None => Ok(()),
    }
}

/// A form post must carry the anti-forgery token of the caller's session (a bearer request
/// has none, and needs none: no browser adds its `Authorization` header by itself).
pub fn csrf(caller: &Caller, presented: &str) -> Result<(), String> {
    match &caller.csrf {
        None => Ok(()),
        Some(expected) if constant_time_eq(expected.as_bytes(), presented.as_bytes()) => Ok(()),
        Some(_) => Err("the form's anti-forgery token is missing or stale: reload the page and try again".to_owned()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loopback_and_listed_hosts_only() {
        let hosts = Hosts::new(&["console.example.com".to_owned(), "ops.example:8443".to_owned()]);
        for ok in [
            "127.0.0.1:7878",
            "localhost:80",
            "localhost",
            "[::1]:7878",
            "127.1.2.3",
            "console.example.com",
            "Console.Example.com:443",
            "ops.example:8443",
        ] {
            assert!(hosts.allows(ok), "{ok}");
        }
        for bad in ["evil.example:7878", "10.0.0.1:7878", "", "[2001:db8::1]:80", "ops.example:80", "example.com"] {
            assert!(!hosts.allows(bad), "{bad}");
        }
    }

    #[test]
    fn only_same_origin_posts() {
        let mut h = HeaderMap::new();
        h.insert(header::HOST, "127.0.0.1:7878".parse().unwrap());
        assert!(same_origin(&h).is_ok());
        h.insert(header::ORIGIN, "http://127.0.0.1:7878".parse().unwrap());
        assert!(same_origin(&h).is_ok());
        h.insert(header::ORIGIN, "http://evil.example".parse().unwrap());
        assert!(same_origin(&h).is_err());
        h.insert(header::ORIGIN, "null".parse().unwrap());
        assert!(same_origin(&h).is_err());
    }

    #[test]
    fn forms_need_the_sessions_token() {
        let caller = |csrf: Option<&str>| Caller {
            identity: "alice".into(),
            origin: "127.0.0.1:1".into(),
            csrf: csrf.map(str::to_owned),
            new_session: None,
        };
        assert!(csrf(&caller(Some("abc")), "abc").is_ok());
        assert!(csrf(&caller(Some("abc")), "abd").is_err());
        assert!(csrf(&caller(Some("abc")), "").is_err());
        assert!(csrf(&caller(None), "").is_ok(), "a bearer request");
    }
}
