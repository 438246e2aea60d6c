use futures::StreamExt;
use kuralle::{Tool, ToolContext, ToolEvent, progress, tool};

/// Parse numbers, reporting each one.
#[tool]
async fn parse_all(items: Vec<String>) -> Result<i64, std::num::ParseIntError> {
    let mut sum = 0;
    for item in &items {
        if item == "stop" {
            return Ok(sum);
        }
        let n: i64 = item.parse()?;
        progress!(n);
        sum += n;
    }
    Ok(sum)
}

fn main() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let events: Vec<_> = rt.block_on(
        ParseAll.execute(&serde_json::json!({"items": ["1", "2", "stop", "x"]}), ToolContext::detached()).collect(),
    );
    assert_eq!(events.len(), 3);
    assert_eq!(events[2], ToolEvent::Outcome(Ok(serde_json::json!(3))));
    let out = rt.block_on(ParseAll.call(serde_json::json!({"items": ["1", "x"]}), ToolContext::detached()));
    assert!(out.is_err());
    // The fn is still callable directly: it is now a stream of `Yielded` items.
    let direct: Vec<_> = rt.block_on(parse_all(vec!["5".into()]).collect());
    assert_eq!(direct.len(), 2);
}
