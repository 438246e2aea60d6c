//! The MCP streamable HTTP server beyond loopback: it will not start without credentials,
//! and with a bearer token it answers only requests that carry one.

use kuralle::{
    Tool, ToolContext, ToolSet,
    mcp::{McpClient, McpClientOptions, McpError, McpServer},
    tool,
};
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const TOKEN: &str = "mcp-test-token-0123456789";

/// Echo the text back.
#[tool]
async fn echo(text: String) -> String {
    text
}

fn server() -> McpServer {
    McpServer::new(ToolSet::new().with(Echo)).bearer_token("another-client-token").bearer_token(TOKEN)
}

/// Posts an `initialize` request; returns the status line and the `WWW-Authenticate` header.
async fn initialize(addr: std::net::SocketAddr, authorization: Option<&str>) -> (String, Option<String>) {
    let body = json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "raw", "version": "0"}}})
    .to_string();
    let auth = authorization.map(|a| format!("Authorization: {a}\r\n")).unwrap_or_default();
    let request = format!(
        "POST /mcp HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\nContent-Type: application/json\r\nAccept: application/json, text/event-stream\r\n{auth}Content-Length: {}\r\n\r\n{body}",
        body.len()
    );
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut raw = String::new();
    stream.read_to_string(&mut raw).await.unwrap();
    let status = raw.lines().next().unwrap_or_default().to_owned();
    let challenge =
        raw.lines().find_map(|l| l.to_ascii_lowercase().strip_prefix("www-authenticate:").map(|v| v.trim().to_owned()));
    (status, challenge)
}

#[tokio::test]
async fn beyond_loopback_a_server_without_credentials_refuses_to_start() {
    let listener = tokio::net::TcpListener::bind("0.0.0.0:0").await.unwrap();
    let refused = McpServer::new(ToolSet::new().with(Echo)).serve_http(listener, async {}).await;
    let Err(McpError::NoCredentials { addr }) = refused else { panic!("{refused:?}") };
    assert!(addr.ip().is_unspecified());
}

#[tokio::test]
async fn only_requests_with_an_accepted_bearer_token_reach_the_tools() {
    // Beyond loopback, with tokens: it serves (reached here through 127.0.0.1).
    let listener = tokio::net::TcpListener::bind("0.0.0.0:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(server().serve_http(listener, std::future::pending()));
    let addr: std::net::SocketAddr = ([127, 0, 0, 1], port).into();

    let (status, challenge) = initialize(addr, None).await;
    assert!(status.contains(" 401 "), "{status}");
    assert_eq!(challenge.as_deref(), Some("bearer"));
    for wrong in ["Bearer mcp-test-token-0123456788", "Bearer ", "Basic bWNwOnRva2Vu", TOKEN] {
        let (status, _) = initialize(addr, Some(wrong)).await;
        assert!(status.contains(" 401 "), "{wrong}: {status}");
    }
    let (status, _) = initialize(addr, Some(&format!("Bearer {TOKEN}"))).await;
    assert!(status.contains(" 200 "), "{status}");

    let url = format!("http://{addr}/mcp");
    let without = McpClient::http(url.clone()).await;
    assert!(matches!(without, Err(McpError::Connect(_))), "{without:?}");
    let client = McpClient::http_with(url, McpClientOptions::new().bearer_token(TOKEN)).await.unwrap();
    let tools = client.tools().await.unwrap();
    let echo = tools.iter().find(|t| t.name() == "echo").unwrap();
    let out = echo.call(json!({"text": "hi"}), ToolContext::detached()).await;
    assert_eq!(out, Ok(json!("hi")));
    // The token never shows in the client's options as printed.
    assert!(!format!("{:?}", McpClientOptions::new().bearer_token(TOKEN)).contains(TOKEN));
}
