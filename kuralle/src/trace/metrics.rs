//! The GenAI client metrics, `gen_ai.client.token.usage` and `gen_ai.client.operation.duration`,
//! through the `metrics` facade: a histogram call costs next to nothing until the application
//! installs a recorder (Prometheus, OpenTelemetry, StatsD, ...), and kuralle depends on no
//! exporter. Only requests actually sent are measured: a replayed step spent no tokens and
//! took no time.

use std::{cell::RefCell, rc::Rc, sync::Once, time::Duration};

use metrics::{Key, Label, Level, Metadata, Unit};

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

/// The keys of one request's metrics: the labels every GenAI client metric carries, with the
/// token type (two histograms) or not. Built once per thread for each operation, provider,
/// model and server, and reused while those stay the same (a service's requests mostly go to
/// one model): with no recorder installed the keys were all the metrics cost, seven
/// allocations per model request.
pub(super) struct Labels(Rc<Keys>);

struct Keys {
    operation: &'static str,
    provider: String,
    model: String,
    server: Option<(String, u16)>,
    input: Key,
    output: Key,
    duration: Key,
    labels: Vec<Label>,
}

thread_local! {
    static LAST: RefCell<Option<Rc<Keys>>> = const { RefCell::new(None) };
}

/// Where the histograms say they come from (what `metrics::histogram!` would give them).
static METADATA: Metadata<'static> = Metadata::new(module_path!(), Level::INFO, Some(module_path!()));

impl Labels {
    pub(super) fn new(operation: &'static str, provider: &str, model: &str, server: Option<&(String, u16)>) -> Self {
        let kept = LAST.try_with(|last| {
            let mut last = last.borrow_mut();
            if let Some(keys) = last.as_ref().filter(|keys| keys.is(operation, provider, model, server)) {
                return Self(Rc::clone(keys));
            }
            let keys = Rc::new(Keys::new(operation, provider, model, server));
            *last = Some(Rc::clone(&keys));
            Self(keys)
        });
        // A thread that is ending keeps nothing.
        kept.unwrap_or_else(|_| Self(Rc::new(Keys::new(operation, provider, model, server))))
    }
}

impl Keys {
    fn new(operation: &'static str, provider: &str, model: &str, server: Option<&(String, u16)>) -> Self {
        let mut labels = Vec::with_capacity(5);
        labels.push(Label::from_static_parts("gen_ai.operation.name", operation));
        labels.push(Label::new("gen_ai.provider.name", provider.to_owned()));
        labels.push(Label::new("gen_ai.request.model", model.to_owned()));
        if let Some((host, port)) = server {
            labels.push(Label::new("server.address", host.clone()));
            labels.push(Label::new("server.port", port.to_string()));
        }
        let with = |extra: Label| {
            let mut all = labels.clone();
            all.push(extra);
            Key::from_parts(TOKEN_USAGE, all)
        };
        Self {
            operation,
            provider: provider.to_owned(),
            model: model.to_owned(),
            server: server.cloned(),
            input: with(Label::from_static_parts("gen_ai.token.type", "input")),
            output: with(Label::from_static_parts("gen_ai.token.type", "output")),
            duration: Key::from_parts(OPERATION_DURATION, labels.clone()),
            labels,
        }
    }

    fn is(&self, operation: &str, provider: &str, model: &str, server: Option<&(String, u16)>) -> bool {
        self.operation == operation
            && self.provider == provider
            && self.model == model
            && self.server.as_ref() == server
    }
}

fn histogram(key: &Key) -> metrics::Histogram {
    metrics::with_recorder(|recorder| recorder.register_histogram(key, &METADATA))
}

/// Records a response's input and output tokens.
pub(super) fn tokens(labels: &Labels, usage: &Usage) {
    describe();
    // Token counts are far below 2^53: the conversion is exact.
    #[allow(clippy::cast_precision_loss)]
    {
        histogram(&labels.0.input).record(usage.input_tokens as f64);
        histogram(&labels.0.output).record(usage.output_tokens as f64);
    }
}

/// Records how long a request took, with `error.type` when it failed.
pub(super) fn duration(labels: Labels, error_type: Option<String>, took: Duration) {
    describe();
    let seconds = took.as_secs_f64();
    match error_type {
        None => histogram(&labels.0.duration).record(seconds),
        Some(error_type) => {
            let mut all = labels.0.labels.clone();
            all.push(Label::new("error.type", error_type));
            histogram(&Key::from_parts(OPERATION_DURATION, all)).record(seconds);
        }
    }
}
