//! Typed final output: the agent answers with an `Invoice`, not a string to parse.
//!
//! Offline: a scripted model plays the model's part. Its first answer gives the total as a
//! string, which `Invoice`'s schema refuses; the error goes back to the model, which repairs
//! the answer, and the run ends with the value (see docs/typed-output.md).
//!
//! ```text
//! cargo run -p kuralle-examples --example typed_output
//! ```

use std::error::Error;

use futures::StreamExt;
use kuralle::{
    Event, Runtime, agent,
    testing::{ScriptedModel, Turn},
};
use schemars::JsonSchema;
use serde::Deserialize;

/// An invoice as the agent reads it.
#[derive(Debug, Deserialize, JsonSchema)]
pub struct Invoice {
    /// The invoice number, as printed.
    pub number: String,
    /// The total, in cents.
    pub total_cents: u64,
    /// The lines, in order.
    pub lines: Vec<Line>,
}

/// One line of an invoice.
#[derive(Debug, Deserialize, JsonSchema)]
pub struct Line {
    /// What was sold.
    pub description: String,
    /// How many.
    pub qty: u32,
}

/// Read the invoice the user pastes and give it back as structured data.
#[agent(id = "billing", output = Invoice, output_retries = 2)]
struct Billing;

#[tokio::main]
async fn main() -> Result<(), Box<dyn Error>> {
    // The model answers by calling the output tool `final_result`, whose arguments are an
    // `Invoice`: first with the total as text, then, told what was wrong, as a number.
    let model = ScriptedModel::new([
        Turn::tool_calls([(
            "call_1",
            "final_result",
            r#"{"number":"A-7","total_cents":"12.50","lines":[{"description":"Widget","qty":2}]}"#,
        )]),
        Turn::tool_calls([(
            "call_2",
            "final_result",
            r#"{"number":"A-7","total_cents":1250,"lines":[{"description":"Widget","qty":2}]}"#,
        )]),
    ]);
    let runtime = Runtime::builder().agent(Billing).model(model).build()?;

    let mut handle = runtime.run("Invoice A-7: 2 × Widget, total 12.50");
    while let Some(event) = handle.next().await {
        if let Event::ToolResult { name, result, is_error, .. } = event {
            let verdict = if is_error { "rejected" } else { "accepted" };
            println!("{name} {verdict}: {result}");
        }
    }
    let out = handle.await?;
    let invoice: Invoice = out.typed()?;
    println!("{invoice:#?}");
    println!("usage: {} input + {} output tokens over 2 answers", out.usage.input_tokens, out.usage.output_tokens);
    Ok(())
}
