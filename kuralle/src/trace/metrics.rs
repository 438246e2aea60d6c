//! The GenAI client metrics, `gen_ai.client.token.usage` and `gen_ai.client.operation.duration`,
//! through the `metrics` facade: a histogram call costs next to nothing until the application
//! installs a recorder (Prometheus, OpenTelemetry, StatsD, ...), and kuralle depends on no
//! exporter. Only requests actually sent are measured: a replayed step spent no tokens and
//! took no time.

use std::{sync::Once, time::Duration};

use metrics::{Label, Unit};

use crate::model::Usage;

/// `gen_ai.client.token.usage`: tokens per request, by `gen_ai.token.type`.
pub(crate) const TOKEN_USAGE: &str = "gen_ai.client.token.usage";
/// `gen_ai.client.operation.duration`: seconds per request.
pub(crate) const OPERATION_DURATION: &str = "gen_ai.client.operation.duration";

/// Describes both histograms to the recorder installed when the first request ends (a
/// recorder installed later sees them undescribed: names and values are unaffected).
fn describe() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        metrics::describe_histogram!(TOKEN_USAGE, Unit::Count, "Number of input and output tokens used.");
        metrics::describe_histogram!(OPERATION_DURATION, Unit::Seconds, "GenAI operation duration.");
    });
}

fn labels(operation: &'static str, provider: &str, model: &str, server: Option<&(String, u16)>) -> Vec<Label> {
    let mut labels = vec![
        Label::from_static_parts("gen_ai.operation.name", operation),
        Label::new("gen_ai.provider.name", provider.to_owned()),
        Label::new("gen_ai.request.model", model.to_owned()),
    ];
    if let Some((host, port)) = server {
        labels.push(Label::new("server.address", host.clone()));
        labels.push(Label::new("server.port", port.to_string()));
    }
    labels
}

/// Records a response's input and output tokens.
pub(super) fn tokens(
    operation: &'static str,
    provider: &str,
    model: &str,
    server: Option<&(String, u16)>,
    usage: &Usage,
) {
    describe();
    for (kind, n) in [("input", usage.input_tokens), ("output", usage.output_tokens)] {
        let mut labels = labels(operation, provider, model, server);
        labels.push(Label::from_static_parts("gen_ai.token.type", kind));
        // Token counts are far below 2^53: the conversion is exact.
        #[allow(clippy::cast_precision_loss)]
        metrics::histogram!(TOKEN_USAGE, labels).record(n as f64);
    }
}

/// Records how long a request took, with `error.type` when it failed.
pub(super) fn duration(
    operation: &'static str,
    provider: &str,
    model: &str,
    server: Option<&(String, u16)>,
    error_type: Option<String>,
    took: Duration,
) {
    describe();
    let mut labels = labels(operation, provider, model, server);
    if let Some(error_type) = error_type {
        labels.push(Label::new("error.type", error_type));
    }
    metrics::histogram!(OPERATION_DURATION, labels).record(took.as_secs_f64());
}
