use futures::{Stream, StreamExt};
use kuralle::{Tool, ToolContext, ToolEvent, Yielded};

/// Count to `to`.
#[kuralle::tool]
fn count(to: u32) -> impl Stream<Item = Yielded<u32, String>> + Send {
    async_stream::stream! {
        for i in 1..=to {
            yield Yielded::Progress(i);
        }
        yield Yielded::Return(format!("counted to {to}"));
    }
}

fn main() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let events: Vec<_> = rt.block_on(Count.execute(&serde_json::json!({"to": 2}), ToolContext::detached()).collect());
    assert_eq!(events.last(), Some(&ToolEvent::Outcome(Ok(serde_json::json!("counted to 2")))));
    assert_eq!(events.len(), 3);
}
