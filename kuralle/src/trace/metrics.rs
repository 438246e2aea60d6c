//! The GenAI client metrics, `gen_ai.client.token.usage` and `gen_ai.client.operation.duration`,
//! through the `metrics` facade: a histogram call costs next to nothing until the application
//! installs a recorder (Prometheus, OpenTelemetry, StatsD, ...), and kuralle depends on no
//! exporter. Only requests actually sent are measured: a replayed step spent no tokens and
//! took no time.

use std::{
    sync::{Arc, Once},
    time::Duration,
};

use metrics::{Label, SharedString, Unit};

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

/// The labels every GenAI client metric of one request carries. The names are shared
/// (`Arc<str>`), so the three histograms of a request copy reference counts, not strings: with
/// no recorder installed these labels are all the metrics cost, once per model request.
pub(super) struct Labels(Vec<Label>);

impl Labels {
    pub(super) fn new(operation: &'static str, provider: &str, model: &str, server: Option<&(String, u16)>) -> Self {
        let shared = |s: &str| SharedString::from_shared(Arc::<str>::from(s));
        // Room for the server's two and one more (the token type or `error.type`): no regrowth.
        let mut labels = Vec::with_capacity(6);
        labels.push(Label::from_static_parts("gen_ai.operation.name", operation));
        labels.push(Label::new("gen_ai.provider.name", shared(provider)));
        labels.push(Label::new("gen_ai.request.model", shared(model)));
        if let Some((host, port)) = server {
            labels.push(Label::new("server.address", shared(host)));
            labels.push(Label::new("server.port", port.to_string()));
        }
        Self(labels)
    }

    /// These labels and `extra`, in a vector of their own (a metric's key owns its labels).
    fn with(&self, extra: Label) -> Vec<Label> {
        let mut labels = Vec::with_capacity(self.0.len() + 1);
        labels.extend(self.0.iter().cloned());
        labels.push(extra);
        labels
    }
}

/// Records a response's input and output tokens.
pub(super) fn tokens(labels: &Labels, usage: &Usage) {
    describe();
    for (kind, n) in [("input", usage.input_tokens), ("output", usage.output_tokens)] {
        let labels = labels.with(Label::from_static_parts("gen_ai.token.type", kind));
        // Token counts are far below 2^53: the conversion is exact.
        #[allow(clippy::cast_precision_loss)]
        metrics::histogram!(TOKEN_USAGE, labels).record(n as f64);
    }
}

/// Records how long a request took, with `error.type` when it failed.
pub(super) fn duration(labels: Labels, error_type: Option<String>, took: Duration) {
    describe();
    let Labels(mut labels) = labels;
    if let Some(error_type) = error_type {
        labels.push(Label::new("error.type", error_type));
    }
    metrics::histogram!(OPERATION_DURATION, labels).record(took.as_secs_f64());
}
