//! Exports a run's spans to OpenTelemetry, on the GenAI semantic conventions:
//! `invoke_agent forecaster`, `chat scripted` (kind client) and `execute_tool weather`.
//!
//! With `OTEL_EXPORTER_OTLP_ENDPOINT` set (say `http://127.0.0.1:4318`, an OpenTelemetry
//! Collector, Jaeger or Tempo), the spans go there over OTLP/HTTP. Without it the example needs
//! no collector: it prints the same spans with OpenTelemetry's stdout exporter.
//! `OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT=true` adds the messages and tool
//! arguments to the spans. See docs/telemetry.md.
//!
//! ```text
//! cargo run -p kuralle-examples --example otel
//! OTEL_EXPORTER_OTLP_ENDPOINT=http://127.0.0.1:4318 cargo run -p kuralle-examples --example otel
//! ```

use std::error::Error;

use kuralle::{
    RunRequest, Runtime, agent,
    testing::{ScriptedModel, Turn},
    tool,
};
use opentelemetry::trace::TracerProvider as _;
use opentelemetry_sdk::trace::SdkTracerProvider;
use tracing_subscriber::prelude::*;

/// Today's weather in a city.
#[tool(parallel_safe)]
async fn weather(city: String) -> String {
    format!("{city}: 18 °C, light rain")
}

/// You answer weather questions.
#[agent(id = "forecaster", tools = [Weather])]
struct Forecaster;

fn main() -> Result<(), Box<dyn Error>> {
    // Set up before the async runtime: the OTLP exporter's blocking HTTP client runs on the
    // batch processor's own thread, outside tokio.
    let provider = match std::env::var("OTEL_EXPORTER_OTLP_ENDPOINT") {
        Ok(endpoint) if !endpoint.is_empty() => {
            println!("exporting spans over OTLP/HTTP to {endpoint}");
            let exporter = opentelemetry_otlp::SpanExporter::builder().with_http().build()?;
            SdkTracerProvider::builder().with_batch_exporter(exporter).build()
        }
        _ => {
            println!("OTEL_EXPORTER_OTLP_ENDPOINT is not set: printing the spans instead of exporting them");
            SdkTracerProvider::builder().with_simple_exporter(opentelemetry_stdout::SpanExporter::default()).build()
        }
    };
    tracing_subscriber::registry()
        .with(tracing_opentelemetry::layer().with_tracer(provider.tracer("kuralle-example")))
        .init();

    let answer = tokio::runtime::Runtime::new()?.block_on(async {
        let model = ScriptedModel::by_transcript([
            Turn::tool_calls([("call_1", "weather", r#"{"city":"Lisbon"}"#)]),
            Turn::text("Lisbon: 18 °C with light rain."),
        ]);
        let runtime = Runtime::builder().agent(Forecaster).model(model).build()?;
        let out = runtime.run(RunRequest::new("Weather in Lisbon?")).await?;
        Ok::<_, Box<dyn Error>>(out.text)
    })?;
    println!("answer: {answer}");
    // Flushes what the batch exporter still holds; waits at most 5 s for a collector that
    // accepts the connection but does not answer.
    provider.shutdown().map_err(|e| format!("the spans could not all be exported: {e}"))?;
    Ok(())
}
