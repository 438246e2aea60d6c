use kuralle::{Agent, tool};

/// Echo back the text.
#[tool]
async fn echo(text: String) -> String {
    text
}

/// Look an order up.
#[tool]
async fn lookup_order(order_id: String) -> String {
    order_id
}

#[derive(serde::Deserialize, schemars::JsonSchema)]
struct Ticket {
    summary: String,
}

/// You are a support agent.
///
/// Use the echo tool when asked.
#[kuralle::agent(
    id = "support-1",
    tools = [Echo, LookupOrder],
    max_steps = 4,
    max_tool_concurrency = 2,
    max_tool_result_tokens = 2000,
    model = kuralle::testing::ScriptedModel::new([kuralle::testing::Turn::text("hi")]),
    output = Ticket,
    output_mode = "prompted",
    output_retries = 1,
    limits = kuralle::RunLimits::new().max_tool_calls(3)
)]
struct Support;

fn main() {
    let def = Support.definition();
    assert_eq!(def.id, "support-1");
    assert_eq!(def.instructions, "You are a support agent.\n\nUse the echo tool when asked.");
    assert_eq!(def.tools.len(), 2);
    assert_eq!(def.max_steps, 4);
    assert_eq!(def.max_tool_concurrency, 2);
    assert_eq!(def.max_tool_result_tokens, 2000);
    assert!(def.model.is_some());
    let output = def.output.unwrap();
    assert_eq!((output.mode, output.retries), (kuralle::OutputMode::Prompted, 1));
    assert_eq!(def.limits, kuralle::RunLimits::new().max_tool_calls(3));
}
