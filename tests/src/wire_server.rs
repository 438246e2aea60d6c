//! A scripted HTTP/1.1 server on a plain `TcpListener`, for testing model clients against
//! each provider's real wire format: it records every request (path, headers, JSON body) and
//! answers with scripted replies (event streams cut into small pieces, error statuses, cut
//! connections, stalls). Every reply closes its connection, so a client never reuses one the
//! server is about to close.

use std::{
    collections::VecDeque,
    sync::{Arc, Mutex},
    time::Duration,
};

use serde_json::Value;
use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::{TcpListener, TcpStream},
    sync::mpsc,
    // Tokio's clock: timing tests run on a paused clock, so what they measure is the client's
    // own waits, exactly, whatever the machine's load.
    time::Instant,
};

/// One request as the server saw it.
#[derive(Debug, Clone)]
pub struct Recorded {
    /// `POST`, say.
    pub method: String,
    /// Path and query.
    pub path: String,
    /// Lower-cased names.
    pub headers: Vec<(String, String)>,
    /// The JSON body (`Null` when it was not JSON).
    pub body: Value,
    /// When it arrived, on tokio's clock.
    pub at: Instant,
}

impl Recorded {
    /// A header's value by lower-case name.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.iter().find(|(n, _)| n == name).map(|(_, v)| v.as_str())
    }
}

/// An OpenAI Responses event stream: each event numbered (`sequence_number`, from 0) and
/// framed as `event: {type}` and `data: {json}`.
pub fn responses_sse(events: &[Value]) -> String {
    events
        .iter()
        .enumerate()
        .map(|(n, e)| {
            let mut e = e.clone();
            e["sequence_number"] = Value::from(n);
            format!("event: {}\ndata: {e}\n\n", e["type"].as_str().expect("a Responses event has a type"))
        })
        .collect()
}

/// How the server answers one request.
#[allow(missing_docs)] // The fields are named for what they hold; the variants say the rest.
pub enum Reply {
    /// `200 OK` with an event stream: the body is cut into `piece`-byte pieces (so frames and
    /// lines span reads), sent chunked or close-delimited.
    Sse { body: String, chunked: bool, piece: usize },
    /// A plain (error or JSON) response, `content-type: application/json`.
    Status { status: u16, reason: &'static str, headers: Vec<(&'static str, &'static str)>, body: String },
    /// A chunked event stream that stops after `body` without the terminating chunk, then closes.
    Cut { body: String },
    /// Accepts the request and never answers.
    Hang,
    /// Streams `body` (chunked), then waits until the client goes away and reports it.
    StreamThenWait { body: String },
}

/// The running server; it stops with the test's runtime.
pub struct Server {
    /// `http://127.0.0.1:PORT/v1` (OpenAI's base URL shape).
    pub base_url: String,
    /// `http://127.0.0.1:PORT` (Anthropic's and Gemini's base URL shape).
    pub origin: String,
    requests: Arc<Mutex<Vec<Recorded>>>,
    /// One message per client that went away during [`Reply::StreamThenWait`].
    pub disconnects: mpsc::UnboundedReceiver<()>,
}

impl Server {
    /// Serves `replies`, one per request, in order (then 500s).
    pub async fn start(replies: Vec<Reply>) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let origin = format!("http://{}", listener.local_addr().unwrap());
        let base_url = format!("{origin}/v1");
        let requests = Arc::new(Mutex::new(Vec::new()));
        let replies = Arc::new(Mutex::new(VecDeque::from(replies)));
        let (disconnected, disconnects) = mpsc::unbounded_channel();
        let recorded = Arc::clone(&requests);
        tokio::spawn(async move {
            loop {
                let Ok((socket, _)) = listener.accept().await else { return };
                let (recorded, replies, disconnected) =
                    (Arc::clone(&recorded), Arc::clone(&replies), disconnected.clone());
                tokio::spawn(async move {
                    let _ = handle(socket, recorded, replies, disconnected).await;
                });
            }
        });
        Self { base_url, origin, requests, disconnects }
    }

    /// Every request so far.
    pub fn requests(&self) -> Vec<Recorded> {
        self.requests.lock().unwrap().clone()
    }
}

async fn handle(
    mut socket: TcpStream,
    recorded: Arc<Mutex<Vec<Recorded>>>,
    replies: Arc<Mutex<VecDeque<Reply>>>,
    disconnected: mpsc::UnboundedSender<()>,
) -> std::io::Result<()> {
    // Request head.
    let mut buf = Vec::new();
    let head_end = loop {
        if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break i;
        }
        let mut chunk = [0u8; 4096];
        let n = socket.read(&mut chunk).await?;
        if n == 0 {
            return Ok(());
        }
        buf.extend_from_slice(&chunk[..n]);
    };
    let head = String::from_utf8(buf[..head_end].to_vec()).unwrap();
    let mut lines = head.split("\r\n");
    let mut request_line = lines.next().unwrap().split(' ');
    let (method, path) = (request_line.next().unwrap().to_owned(), request_line.next().unwrap().to_owned());
    let headers: Vec<(String, String)> = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(n, v)| (n.trim().to_ascii_lowercase(), v.trim().to_owned()))
        .collect();
    let length: usize = headers.iter().find(|(n, _)| n == "content-length").map_or(0, |(_, v)| v.parse().unwrap());
    let mut body = buf[head_end + 4..].to_vec();
    while body.len() < length {
        let mut chunk = [0u8; 4096];
        let n = socket.read(&mut chunk).await?;
        if n == 0 {
            break;
        }
        body.extend_from_slice(&chunk[..n]);
    }
    let body: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    recorded.lock().unwrap().push(Recorded { method, path, headers, body, at: Instant::now() });

    let reply = replies.lock().unwrap().pop_front();
    let reply = reply.unwrap_or(Reply::Status {
        status: 500,
        reason: "Internal Server Error",
        headers: vec![],
        body: "the test script has no reply left".into(),
    });
    match reply {
        Reply::Sse { body, chunked, piece } => {
            let framing = if chunked { "transfer-encoding: chunked\r\nconnection: close" } else { "connection: close" };
            let head = format!(
                "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream; charset=utf-8\r\ncache-control: no-cache\r\n\
                 x-request-id: req_0a1b2c3d4e5f\r\nopenai-processing-ms: 187\r\n{framing}\r\n\r\n"
            );
            socket.write_all(head.as_bytes()).await?;
            for part in body.as_bytes().chunks(piece) {
                write_piece(&mut socket, part, chunked).await?;
            }
            if chunked {
                socket.write_all(b"0\r\n\r\n").await?;
            }
            socket.shutdown().await?;
        }
        Reply::Status { status, reason, headers, body } => {
            let mut head = format!(
                "HTTP/1.1 {status} {reason}\r\ncontent-type: application/json; charset=utf-8\r\n\
                 content-length: {}\r\nconnection: close\r\n",
                body.len()
            );
            for (name, value) in headers {
                head.push_str(&format!("{name}: {value}\r\n"));
            }
            head.push_str("\r\n");
            socket.write_all(head.as_bytes()).await?;
            socket.write_all(body.as_bytes()).await?;
            socket.shutdown().await?;
        }
        Reply::Cut { body } => {
            socket
                .write_all(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\nconnection: close\r\n\r\n")
                .await?;
            write_piece(&mut socket, body.as_bytes(), true).await?;
            tokio::time::sleep(Duration::from_millis(20)).await;
            // Dropping the socket closes the connection mid-body.
        }
        Reply::Hang => {
            tokio::time::sleep(Duration::from_secs(30)).await;
        }
        Reply::StreamThenWait { body } => {
            socket
                .write_all(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\nconnection: close\r\n\r\n")
                .await?;
            write_piece(&mut socket, body.as_bytes(), true).await?;
            let mut sink = [0u8; 1024];
            loop {
                match tokio::time::timeout(Duration::from_secs(10), socket.read(&mut sink)).await {
                    Ok(Ok(0) | Err(_)) => {
                        let _ = disconnected.send(());
                        break;
                    }
                    Ok(Ok(_)) => {}
                    Err(_) => break,
                }
            }
        }
    }
    Ok(())
}

async fn write_piece(socket: &mut TcpStream, part: &[u8], chunked: bool) -> std::io::Result<()> {
    if chunked {
        socket.write_all(format!("{:x}\r\n", part.len()).as_bytes()).await?;
        socket.write_all(part).await?;
        socket.write_all(b"\r\n").await?;
    } else {
        socket.write_all(part).await?;
    }
    socket.flush().await?;
    // Separate reads on the client side, so frames really span chunk boundaries.
    tokio::time::sleep(Duration::from_millis(1)).await;
    Ok(())
}

/// A 100 MB answer, for the size limits: the head, then `first`, then `piece` repeated until
/// `total` bytes were written or the client went away.
pub struct Flood {
    /// The `content-type`.
    pub content_type: &'static str,
    /// A `content-length` to announce (else the body is close-delimited).
    pub length: Option<usize>,
    /// Written once after the head.
    pub first: String,
    /// Written again and again.
    pub piece: Vec<u8>,
    /// How much of `piece` to write in all.
    pub total: usize,
}

/// Serves one request with `flood`; returns the server's origin (`http://127.0.0.1:PORT`) and
/// the bytes it managed to write before the client went away.
pub async fn flood(flood: Flood) -> (String, Arc<std::sync::atomic::AtomicUsize>) {
    use std::sync::atomic::{AtomicUsize, Ordering};
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let origin = format!("http://{}", listener.local_addr().unwrap());
    let written = Arc::new(AtomicUsize::new(0));
    let count = Arc::clone(&written);
    tokio::spawn(async move {
        let (mut socket, _) = listener.accept().await.unwrap();
        // Read the request head and body (small); then answer regardless of its content.
        let mut request = Vec::new();
        let mut buf = [0u8; 8192];
        while !request.windows(4).any(|w| w == b"\r\n\r\n") {
            let n = socket.read(&mut buf).await.unwrap();
            if n == 0 {
                return;
            }
            request.extend_from_slice(&buf[..n]);
        }
        let mut head = format!("HTTP/1.1 200 OK\r\ncontent-type: {}\r\n", flood.content_type);
        match flood.length {
            Some(n) => head.push_str(&format!("content-length: {n}\r\n")),
            None => head.push_str("connection: close\r\n"),
        }
        head.push_str("\r\n");
        head.push_str(&flood.first);
        if socket.write_all(head.as_bytes()).await.is_err() {
            return;
        }
        let mut sent = 0;
        while sent < flood.total {
            if socket.write_all(&flood.piece).await.is_err() {
                return;
            }
            sent += flood.piece.len();
            count.store(sent, Ordering::SeqCst);
        }
    });
    (origin, written)
}
