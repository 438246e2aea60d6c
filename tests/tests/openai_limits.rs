//! `kuralle::models::OpenAi` against a local server that sends 100 MB: the limit is enforced
//! while reading, so the client stops reading (and the server stops writing) soon after the
//! limit, whatever the body's shape.

use std::sync::{
    Arc,
    atomic::{AtomicUsize, Ordering},
};

use kuralle_tests::wire_server::{Flood, flood};

use futures::StreamExt;
use kuralle::{
    Message, Model, ModelError, ModelRequest,
    models::{DEFAULT_MAX_RESPONSE_BYTES, OpenAi},
};

const HUNDRED_MB: usize = 100 << 20;

/// What the server streams after its headers.
#[derive(Clone, Copy)]
enum Body {
    /// Text-delta events, each about 64 KiB.
    SseEvents,
    /// One event whose data line never ends.
    SseEndlessLine,
    /// A `chat.completion` whose content is 100 MB, close-delimited (no length announced).
    Json,
    /// The same, announced with `Content-Length`.
    JsonWithLength,
}

/// Serves one request with 100 MB of `body`; returns the base URL and the bytes the server
/// managed to write before the client went away.
async fn server(body: Body) -> (String, Arc<AtomicUsize>) {
    let (content_type, length, first, piece): (&str, Option<usize>, String, Vec<u8>) = match body {
        Body::SseEvents => {
            let event = format!(
                "data: {{\"choices\":[{{\"index\":0,\"delta\":{{\"content\":\"{}\"}}}}]}}\n\n",
                "x".repeat(64 << 10)
            );
            ("text/event-stream", None, String::new(), event.into_bytes())
        }
        Body::SseEndlessLine => {
            ("text/event-stream", None, "data: {\"choices\":[{\"delta\":{\"content\":\"".into(), vec![b'y'; 64 << 10])
        }
        Body::Json | Body::JsonWithLength => {
            let head = "{\"choices\":[{\"index\":0,\"message\":{\"role\":\"assistant\",\"content\":\"".to_owned();
            let length = matches!(body, Body::JsonWithLength).then_some(HUNDRED_MB + head.len() + 3);
            ("application/json", length, head, vec![b'z'; 64 << 10])
        }
    };
    let (origin, written) = flood(Flood { content_type, length, first, piece, total: HUNDRED_MB }).await;
    (format!("{origin}/v1"), written)
}

fn request() -> ModelRequest {
    ModelRequest {
        system: "".into(),
        messages: vec![Message::User { content: "hi".into() }].into(),
        tools: Vec::new().into(),
        output: None,
    }
}

/// Reads the stream to its end; returns the error it ended with.
async fn error_of(model: &OpenAi) -> ModelError {
    let mut stream = model.stream(request());
    while let Some(item) = stream.next().await {
        if let Err(e) = item {
            return e;
        }
    }
    panic!("a 100 MB response was accepted");
}

async fn check(body: Body, limit: usize) {
    let (base_url, written) = server(body).await;
    let mut builder = OpenAi::builder().base_url(base_url).model("m").max_retries(0);
    if limit != DEFAULT_MAX_RESPONSE_BYTES {
        builder = builder.max_response_bytes(limit);
    }
    let model = builder.build().unwrap();
    let error = error_of(&model).await;
    assert!(
        matches!(error, ModelError::TooLarge { limit: l } if l == limit)
            || matches!(&error, ModelError::Protocol(m) if m.contains("exceeds")),
        "{error}"
    );
    // The client stopped reading near the limit: what the server got out is the limit plus
    // what the sockets buffer, far below the 100 MB it meant to send.
    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    let sent = written.load(Ordering::SeqCst);
    assert!(sent < limit + (24 << 20), "the server wrote {sent} bytes before the client gave up");
}

#[tokio::test]
async fn a_100_mb_event_stream_is_refused_at_the_default_limit() {
    check(Body::SseEvents, DEFAULT_MAX_RESPONSE_BYTES).await;
}

#[tokio::test]
async fn a_100_mb_line_without_an_end_is_refused_at_the_limit() {
    check(Body::SseEndlessLine, 1 << 20).await;
}

#[tokio::test]
async fn a_100_mb_json_completion_is_refused_while_reading() {
    check(Body::Json, 1 << 20).await;
}

#[tokio::test]
async fn a_json_completion_announced_as_100_mb_is_refused_before_reading() {
    let (base_url, written) = server(Body::JsonWithLength).await;
    let model = OpenAi::builder().base_url(base_url).model("m").max_retries(0).build().unwrap();
    assert_eq!(error_of(&model).await, ModelError::TooLarge { limit: DEFAULT_MAX_RESPONSE_BYTES });
    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    assert!(written.load(Ordering::SeqCst) < 24 << 20);
}
