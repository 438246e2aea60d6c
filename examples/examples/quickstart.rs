//! The seed's echo example in Rust: one tool, one agent, one run.
//!
//! Offline by default (a scripted model plays the model's part). Set a provider's key to talk
//! to a real model (`kuralle::models::from_env`: `KURALLE_PROVIDER` chooses when several are
//! set, `KURALLE_MODEL` names the model):
//!
//! ```text
//! cargo run -p kuralle-examples --example quickstart
//! ANTHROPIC_API_KEY=sk-ant-… cargo run -p kuralle-examples --example quickstart
//! GEMINI_API_KEY=… cargo run -p kuralle-examples --example quickstart
//! OPENAI_API_KEY=sk-… cargo run -p kuralle-examples --example quickstart
//! OPENAI_BASE_URL=http://localhost:11434/v1 OPENAI_MODEL=llama3.2 cargo run -p kuralle-examples --example quickstart
//! ```

use std::{error::Error, sync::Arc};

use futures::StreamExt;
use kuralle::{
    Event, Model, Runtime, agent,
    testing::{ScriptedModel, Turn},
    tool,
};
use schemars::JsonSchema;
use serde::Serialize;

/// What `echo` returns.
#[derive(Debug, Serialize, JsonSchema)]
pub struct Echoed {
    /// The text, unchanged.
    pub echoed: String,
}

/// Echo back the provided text.
#[tool(parallel_safe)]
async fn echo(
    /// The text to echo back.
    text: String,
) -> Echoed {
    Echoed { echoed: text }
}

/// Use the echo tool when asked.
#[agent(id = "support", tools = [Echo])]
struct Support;

fn model() -> Result<Arc<dyn Model>, Box<dyn Error>> {
    match kuralle::models::from_env() {
        Some(model) => {
            let model = model?;
            eprintln!("model: {} ({})", model.name(), model.provider());
            Ok(model)
        }
        None => {
            eprintln!(
                "model: scripted (offline; set ANTHROPIC_API_KEY, GEMINI_API_KEY, OPENAI_API_KEY or OPENAI_BASE_URL for a real model)"
            );
            Ok(Arc::new(ScriptedModel::new([
                Turn::tool_calls([("call_1", "echo", r#"{"text":"hello world"}"#)]),
                Turn::text("The echo tool says: hello world"),
            ])))
        }
    }
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn Error>> {
    let runtime = Runtime::builder().agent(Support).model_arc(model()?).build()?;

    let mut handle = runtime.run("Echo \"hello world\"");
    while let Some(event) = handle.next().await {
        match &event {
            Event::TextDelta { delta } => print!("{delta}"),
            Event::ReasoningDelta { delta } => eprint!("{delta}"),
            Event::ToolCall { name, args, .. } => println!("→ {name}({args})"),
            Event::ToolResult { name, result, is_error, .. } => {
                println!("← {name}{}: {result}", if *is_error { " failed" } else { "" });
            }
            Event::Done { .. } => println!("\nDone."),
            _ => {}
        }
    }
    let output = handle.await?;
    eprintln!(
        "run {} {} ({} tokens in, {} out)",
        output.run_id,
        output.status.as_str(),
        output.usage.input_tokens,
        output.usage.output_tokens
    );
    Ok(())
}
