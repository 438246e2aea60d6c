//! How long an [`McpClient`](super::McpClient) waits and how much it accepts: a server that
//! never answers, lists tools without end or offers tools a model provider would reject must
//! not hang or break a run.

use std::{future::Future, time::Duration};

use rmcp::model::Tool;
use serde_json::Value;

use super::McpError;

/// Deadlines and limits of an [`McpClient`](super::McpClient).
///
/// Defaults: 30 s to connect (start and handshake), 30 s per `tools/list` page, 300 s per
/// `tools/call`, at most 64 pages, 512 tools and 8 MiB of tool definitions per listing.
///
/// ```
/// use std::time::Duration;
/// let options = kuralle::mcp::McpClientOptions::new()
///     .connect_timeout(Duration::from_secs(5))
///     .call_timeout(Duration::from_secs(60))
///     .max_tools(100);
/// # let _ = options;
/// ```
#[derive(Debug, Clone)]
pub struct McpClientOptions {
    pub(crate) connect_timeout: Duration,
    pub(crate) list_timeout: Duration,
    pub(crate) call_timeout: Duration,
    pub(crate) max_list_pages: usize,
    pub(crate) max_tools: usize,
    pub(crate) max_list_bytes: usize,
    // A `Secret`, so the options' `Debug` never prints it.
    pub(crate) bearer_token: Option<crate::Secret<String>>,
}

impl Default for McpClientOptions {
    fn default() -> Self {
        Self {
            connect_timeout: Duration::from_secs(30),
            list_timeout: Duration::from_secs(30),
            call_timeout: Duration::from_secs(300),
            max_list_pages: 64,
            max_tools: 512,
            max_list_bytes: 8 << 20,
            bearer_token: None,
        }
    }
}

impl McpClientOptions {
    /// The defaults.
    pub fn new() -> Self {
        Self::default()
    }

    /// Sends `Authorization: Bearer <token>` with every streamable HTTP request (a server
    /// with [`McpServer::bearer_token`](super::McpServer::bearer_token) requires it).
    ///
    /// ```
    /// let options = kuralle::mcp::McpClientOptions::new().bearer_token("s3cret-token-for-ci");
    /// # let _ = options;
    /// ```
    #[must_use]
    pub fn bearer_token(mut self, token: impl Into<String>) -> Self {
        self.bearer_token = Some(crate::Secret::new(token.into()));
        self
    }

    /// The longest wait to start or reach the server and finish the handshake (default 30 s).
    #[must_use]
    pub fn connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = timeout;
        self
    }

    /// The longest wait for one `tools/list` page (default 30 s).
    #[must_use]
    pub fn list_timeout(mut self, timeout: Duration) -> Self {
        self.list_timeout = timeout;
        self
    }

    /// The longest wait for a `tools/call` answer (default 300 s); past it the server is told
    /// to cancel and the call ends with [`ToolError::Timeout`](crate::ToolError::Timeout).
    #[must_use]
    pub fn call_timeout(mut self, timeout: Duration) -> Self {
        self.call_timeout = timeout;
        self
    }

    /// The most `tools/list` pages followed (default 64).
    #[must_use]
    pub fn max_list_pages(mut self, pages: usize) -> Self {
        self.max_list_pages = pages;
        self
    }

    /// The most tools a listing may hold (default 512).
    #[must_use]
    pub fn max_tools(mut self, tools: usize) -> Self {
        self.max_tools = tools;
        self
    }

    /// The most bytes of tool definitions (as JSON) a listing may hold (default 8 MiB).
    #[must_use]
    pub fn max_list_bytes(mut self, bytes: usize) -> Self {
        self.max_list_bytes = bytes;
        self
    }
}

/// Follows `tools/list` pages from `page(cursor)` within the options' limits: each page under
/// `list_timeout`, at most `max_list_pages` pages (a cursor seen twice is a loop), `max_tools`
/// tools and `max_list_bytes` bytes in all.
pub(crate) async fn gather<F, Fut>(options: &McpClientOptions, mut page: F) -> Result<Vec<Tool>, McpError>
where
    F: FnMut(Option<String>) -> Fut,
    Fut: Future<Output = Result<(Vec<Tool>, Option<String>), McpError>>,
{
    let mut tools = Vec::new();
    let mut bytes = 0usize;
    let mut cursor = None;
    let mut seen = std::collections::HashSet::new();
    for _ in 0..options.max_list_pages {
        let (listed, next) = tokio::time::timeout(options.list_timeout, page(cursor.take()))
            .await
            .map_err(|_| McpError::Timeout { what: "tools/list", after: options.list_timeout })??;
        for tool in listed {
            bytes = bytes.saturating_add(serde_json::to_vec(&tool).map_or(0, |v| v.len()));
            tools.push(tool);
            if tools.len() > options.max_tools {
                return Err(McpError::Limit(format!("the server lists more than {} tools", options.max_tools)));
            }
            if bytes > options.max_list_bytes {
                return Err(McpError::Limit(format!(
                    "the server's tool definitions exceed {} bytes",
                    options.max_list_bytes
                )));
            }
        }
        match next {
            None => return Ok(tools),
            Some(next) if !seen.insert(next.clone()) => {
                return Err(McpError::Limit(format!("the server's tools/list cursor `{next}` repeats")));
            }
            Some(next) => cursor = Some(next),
        }
    }
    Err(McpError::Limit(format!("the server's tools/list goes on past {} pages", options.max_list_pages)))
}

/// Why a listed tool would be refused by a model provider, if it would: a name outside
/// `[a-zA-Z0-9_-]{1,64}` (what OpenAI, Anthropic and Gemini all accept), or an input schema
/// that is not an object schema.
pub(crate) fn unusable(tool: &Tool) -> Option<String> {
    let name = tool.name.as_ref();
    let valid_name = !name.is_empty()
        && name.len() <= 64
        && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-');
    if !valid_name {
        return Some(format!("its name `{name}` is not 1-64 characters of a-z, A-Z, 0-9, _ and -"));
    }
    match tool.input_schema.get("type") {
        Some(Value::String(t)) if t == "object" => None,
        other => Some(format!("its input schema's type is {other:?}, not \"object\"")),
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use serde_json::json;

    use super::*;

    fn tool(name: &str, schema: Value) -> Tool {
        let Value::Object(schema) = schema else { panic!("an object") };
        Tool::new(name.to_owned(), "d", Arc::new(schema))
    }

    fn object() -> Value {
        json!({"type": "object", "properties": {}})
    }

    #[tokio::test]
    async fn a_listing_that_never_ends_is_refused_at_the_page_limit() {
        let options = McpClientOptions::new().max_list_pages(5);
        let mut pages = 0;
        let err = gather(&options, |_| {
            pages += 1;
            let n = pages;
            async move { Ok((vec![tool(&format!("t{n}"), object())], Some(format!("cursor-{n}")))) }
        })
        .await
        .unwrap_err();
        assert!(matches!(&err, McpError::Limit(m) if m.contains("5 pages")), "{err}");
        assert_eq!(pages, 5);
    }

    #[tokio::test]
    async fn a_repeated_cursor_is_a_loop() {
        let err =
            gather(&McpClientOptions::new(), |_| async { Ok((vec![], Some("same".to_owned()))) }).await.unwrap_err();
        assert!(matches!(&err, McpError::Limit(m) if m.contains("repeats")), "{err}");
    }

    #[tokio::test]
    async fn too_many_tools_or_bytes_are_refused() {
        let many = |n: usize| (0..n).map(|i| tool(&format!("t{i}"), object())).collect::<Vec<_>>();
        let err = gather(&McpClientOptions::new().max_tools(3), |_| async { Ok((many(4), None)) }).await.unwrap_err();
        assert!(matches!(&err, McpError::Limit(m) if m.contains("3 tools")), "{err}");
        let big = json!({"type": "object", "description": "x".repeat(10_000)});
        let err = gather(&McpClientOptions::new().max_list_bytes(5_000), |_| {
            let big = big.clone();
            async move { Ok((vec![tool("big", big)], None)) }
        })
        .await
        .unwrap_err();
        assert!(matches!(&err, McpError::Limit(m) if m.contains("5000 bytes")), "{err}");
        let ok = gather(&McpClientOptions::new(), |c| async move {
            Ok(match c.as_deref() {
                None => (many(2), Some("p2".to_owned())),
                _ => (many(1), None),
            })
        })
        .await
        .unwrap();
        assert_eq!(ok.len(), 3, "pages are followed to the end");
    }

    #[tokio::test(start_paused = true)]
    async fn a_page_that_never_comes_times_out() {
        let options = McpClientOptions::new().list_timeout(Duration::from_secs(2));
        let err = gather(&options, |_| std::future::pending()).await.unwrap_err();
        assert!(matches!(err, McpError::Timeout { what: "tools/list", after } if after == Duration::from_secs(2)));
    }

    #[test]
    fn names_and_schemas_a_provider_would_refuse() {
        assert_eq!(unusable(&tool("get_weather-2", object())), None);
        for bad in ["", "has space", "dots.not.ok", "ünïcode", &"x".repeat(65)] {
            assert!(unusable(&tool(bad, object())).is_some(), "{bad:?}");
        }
        assert!(unusable(&tool("t", json!({"type": "string"}))).is_some());
        assert!(unusable(&tool("t", json!({}))).is_some());
    }
}
