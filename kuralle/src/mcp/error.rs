//! What can go wrong connecting to, serving or talking MCP.

/// An MCP transport or protocol failure.
///
/// ```
/// let e = kuralle::mcp::McpError::Connect("no such command".into());
/// assert!(e.to_string().contains("no such command"));
/// ```
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum McpError {
    /// The server could not be started or reached, or the handshake failed.
    #[error("could not connect to the MCP server: {0}")]
    Connect(String),
    /// A request to the peer failed (transport closed, protocol error, timeout).
    #[error("MCP request failed: {0}")]
    Request(String),
    /// The server did not answer in time (connecting, or one `tools/list` page).
    #[error("the MCP server did not answer {what} within {after:?}")]
    Timeout {
        /// What was waited for.
        what: &'static str,
        /// The deadline.
        after: std::time::Duration,
    },
    /// A listing passed a limit of [`McpClientOptions`](super::McpClientOptions).
    #[error("MCP listing refused: {0}")]
    Limit(String),
    /// Serving failed (the transport broke, or the listener could not accept).
    #[error("MCP server failed: {0}")]
    Serve(String),
    /// A streamable HTTP server was asked to listen beyond loopback without bearer tokens
    /// ([`McpServer::bearer_token`](super::McpServer::bearer_token)): anyone who could reach
    /// it could call its tools.
    #[error(
        "refusing to serve MCP on {addr} without credentials: give the server a bearer token, or listen on loopback"
    )]
    NoCredentials {
        /// The listener's address.
        addr: std::net::SocketAddr,
    },
    /// Reading or writing the network.
    #[error(transparent)]
    Io(#[from] std::io::Error),
}

impl From<rmcp::ServiceError> for McpError {
    fn from(e: rmcp::ServiceError) -> Self {
        Self::Request(e.to_string())
    }
}
