//! Peak memory of refusing a 100 MB model response (issue 16): a local server streams 100 MB
//! as server-sent events, then as one JSON completion, to an `OpenAi` client with the default
//! `max_response_bytes` (16 MiB). Prints the process's peak RSS (`VmHWM`) for each, with the
//! peak reset in between (`/proc/self/clear_refs`), and how much the server got to write.
//!
//! Run with `cargo bench -p kuralle --bench response_limits` (Linux).

use std::{
    sync::{
        Arc,
        atomic::{AtomicUsize, Ordering},
    },
    time::Instant,
};

use futures::StreamExt;
use kuralle::{Message, Model, ModelRequest, models::OpenAi};
use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::TcpListener,
};

const BODY: usize = 100 << 20;

fn status_kib(field: &str) -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status.lines().find_map(|l| l.strip_prefix(field)?.trim().strip_suffix("kB")?.trim().parse().ok()).unwrap_or(0)
}

fn reset_peak() {
    // "5" resets the peak resident set size to the current one (Linux ≥ 4.0).
    let _ = std::fs::write("/proc/self/clear_refs", "5");
}

async fn serve(json: bool) -> (String, Arc<AtomicUsize>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/v1", listener.local_addr().unwrap());
    let written = Arc::new(AtomicUsize::new(0));
    let count = Arc::clone(&written);
    tokio::spawn(async move {
        let (mut socket, _) = listener.accept().await.unwrap();
        let mut head = Vec::new();
        let mut buf = [0u8; 8192];
        while !head.windows(4).any(|w| w == b"\r\n\r\n") {
            let n = socket.read(&mut buf).await.unwrap();
            if n == 0 {
                return;
            }
            head.extend_from_slice(&buf[..n]);
        }
        let (content_type, first, piece) = if json {
            (
                "application/json",
                "{\"choices\":[{\"index\":0,\"message\":{\"role\":\"assistant\",\"content\":\"".to_owned(),
                vec![b'z'; 64 << 10],
            )
        } else {
            let event = format!(
                "data: {{\"choices\":[{{\"index\":0,\"delta\":{{\"content\":\"{}\"}}}}]}}\n\n",
                "x".repeat(64 << 10)
            );
            ("text/event-stream", String::new(), event.into_bytes())
        };
        let reply = format!("HTTP/1.1 200 OK\r\ncontent-type: {content_type}\r\nconnection: close\r\n\r\n{first}");
        if socket.write_all(reply.as_bytes()).await.is_err() {
            return;
        }
        let mut sent = 0;
        while sent < BODY {
            if socket.write_all(&piece).await.is_err() {
                return;
            }
            sent += piece.len();
            count.store(sent, Ordering::SeqCst);
        }
    });
    (url, written)
}

async fn scenario(name: &str, json: bool) {
    let (url, written) = serve(json).await;
    let model = OpenAi::builder().base_url(url).model("m").max_retries(0).build().unwrap();
    reset_peak();
    let before = status_kib("VmRSS:");
    let started = Instant::now();
    let request = ModelRequest {
        system: String::new(),
        messages: vec![Message::User { content: "hi".into() }].into(),
        tools: Vec::new().into(),
    };
    let mut stream = model.stream(request);
    let mut outcome = String::from("accepted (!)");
    while let Some(item) = stream.next().await {
        if let Err(e) = item {
            outcome = e.to_string();
            break;
        }
    }
    drop(stream);
    let elapsed = started.elapsed();
    let peak = status_kib("VmHWM:");
    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    println!(
        "{name:<28} RSS before {:>6.1} MiB, peak {:>6.1} MiB (+{:.1} MiB); server wrote {:>5.1} MiB of 100; {elapsed:.2?}; {outcome}",
        before as f64 / 1024.0,
        peak as f64 / 1024.0,
        (peak.saturating_sub(before)) as f64 / 1024.0,
        written.load(Ordering::SeqCst) as f64 / (1 << 20) as f64,
    );
}

fn main() {
    // `cargo test --benches` runs bench binaries with `--bench` absent; do the work only when
    // asked to benchmark, so the test run stays quick.
    if !std::env::args().any(|a| a == "--bench") {
        return;
    }
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    rt.block_on(async {
        scenario("100 MB SSE, default limit", false).await;
        scenario("100 MB JSON, default limit", true).await;
    });
}
