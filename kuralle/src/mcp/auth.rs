//! Bearer tokens for the streamable HTTP server: a server that listens beyond loopback
//! refuses to start without them, and every request must carry one.

use axum::{
    extract::Request,
    http::{HeaderValue, StatusCode, header},
    middleware::Next,
    response::{IntoResponse, Response},
};

/// The tokens a server accepts (`Authorization: Bearer <token>`).
#[derive(Clone, Default)]
pub(super) struct Tokens(Vec<Vec<u8>>);

impl std::fmt::Debug for Tokens {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Tokens({} configured)", self.0.len())
    }
}

impl Tokens {
    pub(super) fn push(&mut self, token: String) {
        self.0.push(token.into_bytes());
    }

    pub(super) fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Whether `presented` is one of the tokens. Every token is compared, each in time that
    /// depends on its length only, so the answer's timing does not tell how much matched.
    fn accepts(&self, presented: &[u8]) -> bool {
        self.0.iter().fold(false, |found, token| found | same(token, presented))
    }

    /// The middleware: a request without an accepted token gets 401 and never reaches MCP.
    pub(super) async fn require(self, request: Request, next: Next) -> Response {
        let presented = request
            .headers()
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "))
            .map(str::as_bytes);
        match presented {
            Some(token) if self.accepts(token) => next.run(request).await,
            _ => {
                let mut refused = (StatusCode::UNAUTHORIZED, "a bearer token is required\n").into_response();
                refused.headers_mut().insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
                refused
            }
        }
    }
}

/// Constant-time equality for equal lengths; unequal lengths differ at once (a token's length
/// is not the secret).
fn same(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_configured_token_is_accepted() {
        let mut tokens = Tokens::default();
        tokens.push("s3cret-token-for-ci".into());
        tokens.push("another-token-value".into());
        assert!(tokens.accepts(b"s3cret-token-for-ci") && tokens.accepts(b"another-token-value"));
        assert!(!tokens.accepts(b"s3cret-token-for-cj") && !tokens.accepts(b"s3cret") && !tokens.accepts(b""));
    }
}
