//! `kuralle::models::Anthropic` against a local server that sends 100 MB: the limit is
//! enforced while reading, so the client stops reading (and the server stops writing) soon
//! after the limit, whatever the body's shape.

use std::sync::{
    Arc,
    atomic::{AtomicUsize, Ordering},
};

use futures::StreamExt;
use kuralle::{
    Message, Model, ModelError, ModelRequest,
    models::{Anthropic, DEFAULT_MAX_RESPONSE_BYTES},
};
use kuralle_tests::wire_server::{Flood, flood};

const HUNDRED_MB: usize = 100 << 20;

const MESSAGE_START: &str = "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"id\":\"msg_01\",\"type\":\"message\",\"role\":\"assistant\",\"content\":[],\"model\":\"claude-sonnet-4-5\",\"usage\":{\"input_tokens\":9,\"output_tokens\":1}}}\n\n";

/// What the server streams after its headers.
#[derive(Clone, Copy)]
enum Body {
    /// `text_delta` events of about 64 KiB each, in one text block.
    SseEvents,
    /// One `input_json_delta` whose data line never ends.
    SseEndlessLine,
    /// Thinking deltas of about 64 KiB each: reasoning is bounded like text.
    SseThinking,
    /// A whole `message` whose text is 100 MB, close-delimited (no length announced).
    Json,
    /// The same, announced with `Content-Length`.
    JsonWithLength,
}

/// Serves one request with 100 MB of `body`; returns the origin and the bytes the server
/// managed to write before the client went away.
async fn server(body: Body) -> (String, Arc<AtomicUsize>) {
    let delta = |kind: &str, field: &str| {
        format!(
            "event: content_block_delta\ndata: {{\"type\":\"content_block_delta\",\"index\":0,\"delta\":{{\"type\":\"{kind}\",\"{field}\":\"{}\"}}}}\n\n",
            "x".repeat(64 << 10)
        )
        .into_bytes()
    };
    let (content_type, length, first, piece): (&str, Option<usize>, String, Vec<u8>) = match body {
        Body::SseEvents => {
            let start = format!(
                "{MESSAGE_START}event: content_block_start\ndata: {{\"type\":\"content_block_start\",\"index\":0,\"content_block\":{{\"type\":\"text\",\"text\":\"\"}}}}\n\n"
            );
            ("text/event-stream", None, start, delta("text_delta", "text"))
        }
        Body::SseThinking => {
            let start = format!(
                "{MESSAGE_START}event: content_block_start\ndata: {{\"type\":\"content_block_start\",\"index\":0,\"content_block\":{{\"type\":\"thinking\",\"thinking\":\"\",\"signature\":\"\"}}}}\n\n"
            );
            ("text/event-stream", None, start, delta("thinking_delta", "thinking"))
        }
        Body::SseEndlessLine => {
            let start = format!(
                "{MESSAGE_START}event: content_block_start\ndata: {{\"type\":\"content_block_start\",\"index\":0,\"content_block\":{{\"type\":\"tool_use\",\"id\":\"toolu_01\",\"name\":\"f\",\"input\":{{}}}}}}\n\n\
                 event: content_block_delta\ndata: {{\"type\":\"content_block_delta\",\"index\":0,\"delta\":{{\"type\":\"input_json_delta\",\"partial_json\":\""
            );
            ("text/event-stream", None, start, vec![b'y'; 64 << 10])
        }
        Body::Json | Body::JsonWithLength => {
            let head = "{\"id\":\"msg_01\",\"type\":\"message\",\"role\":\"assistant\",\"content\":[{\"type\":\"text\",\"text\":\"".to_owned();
            let length = matches!(body, Body::JsonWithLength).then_some(HUNDRED_MB + head.len() + 3);
            ("application/json", length, head, vec![b'z'; 64 << 10])
        }
    };
    flood(Flood { content_type, length, first, piece, total: HUNDRED_MB }).await
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
async fn error_of(model: &Anthropic) -> ModelError {
    let mut stream = model.stream(request());
    while let Some(item) = stream.next().await {
        if let Err(e) = item {
            return e;
        }
    }
    panic!("a 100 MB response was accepted");
}

async fn check(body: Body, limit: usize) {
    let (origin, written) = server(body).await;
    let mut builder = Anthropic::builder().base_url(origin).api_key("k").model("claude-sonnet-4-5").max_retries(0);
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
async fn a_100_mb_thinking_stream_is_refused_at_the_limit() {
    check(Body::SseThinking, 2 << 20).await;
}

#[tokio::test]
async fn a_100_mb_line_without_an_end_is_refused_at_the_limit() {
    check(Body::SseEndlessLine, 1 << 20).await;
}

#[tokio::test]
async fn a_100_mb_json_message_is_refused_while_reading() {
    check(Body::Json, 1 << 20).await;
}

#[tokio::test]
async fn a_json_message_announced_as_100_mb_is_refused_before_reading() {
    let (origin, written) = server(Body::JsonWithLength).await;
    let model = Anthropic::builder().base_url(origin).api_key("k").model("m").max_retries(0).build().unwrap();
    assert_eq!(error_of(&model).await, ModelError::TooLarge { limit: DEFAULT_MAX_RESPONSE_BYTES });
    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    assert!(written.load(Ordering::SeqCst) < 24 << 20);
}
