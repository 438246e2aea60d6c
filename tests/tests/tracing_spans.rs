//! The `invoke_agent`, `chat` and `execute_tool` spans carry the fields operators filter on
//! (the GenAI conventions' beside kuralle's own `run_id`, `replayed` and `outcome`), with
//! outcome and duration recorded when the work ends. What OpenTelemetry makes of them is
//! tests/telemetry.rs.

use std::{
    collections::BTreeMap,
    sync::{Arc, Mutex},
};

use kuralle::{Decision, RunRequest, RunStatus};
use kuralle_tests::ops_runtime;
use tracing::{
    Subscriber,
    field::{Field, Visit},
    span::{Attributes, Id, Record},
};
use tracing_subscriber::{Layer, layer::Context, prelude::*, registry::LookupSpan};

type Fields = BTreeMap<String, String>;

/// Every closed span: its name and its fields as text, in close order.
#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<(String, Fields)>>>);

struct FieldsOf(Fields);

impl Visit for FieldsOf {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        self.0.insert(field.name().to_owned(), format!("{value:?}"));
    }
    fn record_str(&mut self, field: &Field, value: &str) {
        self.0.insert(field.name().to_owned(), value.to_owned());
    }
}

impl<S: Subscriber + for<'a> LookupSpan<'a>> Layer<S> for Captured {
    fn on_new_span(&self, attrs: &Attributes<'_>, id: &Id, ctx: Context<'_, S>) {
        let mut fields = FieldsOf(Fields::new());
        attrs.record(&mut fields);
        ctx.span(id).expect("the span exists").extensions_mut().insert(fields);
    }

    fn on_record(&self, id: &Id, values: &Record<'_>, ctx: Context<'_, S>) {
        let span = ctx.span(id).expect("the span exists");
        let mut ext = span.extensions_mut();
        if let Some(fields) = ext.get_mut::<FieldsOf>() {
            values.record(fields);
        }
    }

    fn on_close(&self, id: Id, ctx: Context<'_, S>) {
        let span = ctx.span(&id).expect("the span exists");
        let fields = span.extensions().get::<FieldsOf>().map(|f| f.0.clone()).unwrap_or_default();
        self.0.lock().unwrap().push((span.name().to_owned(), fields));
    }
}

impl Captured {
    fn take(&self, name: &str) -> Vec<Fields> {
        let mut all = self.0.lock().unwrap();
        let (mine, rest): (Vec<_>, Vec<_>) = all.drain(..).partition(|(n, _)| n == name);
        *all = rest;
        mine.into_iter().map(|(_, f)| f).collect()
    }
}

#[tokio::test]
async fn spans_carry_run_call_tool_replayed_outcome_and_duration() {
    let captured = Captured::default();
    let _guard = tracing_subscriber::registry().with(captured.clone()).set_default();

    let rt = ops_runtime();

    let out = rt.run(RunRequest::new("go").run_id("run-7")).await.unwrap();
    assert_eq!(out.status, RunStatus::Paused);

    let runs = captured.take("invoke_agent");
    assert_eq!(runs.len(), 1);
    assert_eq!(runs[0]["run_id"], "run-7");
    assert_eq!(runs[0]["gen_ai.agent.name"], "ops");
    assert_eq!(runs[0]["otel.name"], "invoke_agent ops");
    assert_eq!(runs[0]["status"], "paused");
    assert!(runs[0].contains_key("duration_ms"), "{:?}", runs[0]);

    let steps = captured.take("chat");
    assert_eq!(steps.len(), 2);
    assert!(steps.iter().all(|s| s["replayed"] == "false" && s["outcome"] == "ok" && s["run_id"] == "run-7"));
    assert!(steps.iter().all(|s| s.contains_key("duration_ms") && s.contains_key("gen_ai.usage.input_tokens")));

    let calls = captured.take("execute_tool");
    let by_call: BTreeMap<&str, &Fields> = calls.iter().map(|c| (c["gen_ai.tool.call.id"].as_str(), c)).collect();
    assert_eq!(by_call.len(), 3, "{calls:?}");
    for c in &calls {
        for field in ["run_id", "gen_ai.tool.call.id", "gen_ai.tool.name", "replayed", "outcome", "duration_ms"] {
            assert!(c.contains_key(field), "execute_tool span lacks `{field}`: {c:?}");
        }
    }
    assert_eq!(by_call["c1"]["gen_ai.tool.name"], "lookup");
    assert_eq!(by_call["c1"]["outcome"], "ok");
    assert_eq!(by_call["c1"]["replayed"], "false");
    assert_eq!(by_call["c2"]["outcome"], "denied");
    assert_eq!(by_call["c2"]["error.type"], "denied");
    assert_eq!(by_call["c3"]["outcome"], "pending_approval");

    // Resuming replays the first model step and `lookup`; `wire` runs live.
    let out = rt.deliver("run-7", Decision::approve("alice")).await.unwrap();
    assert_eq!(out.status, RunStatus::Finished);
    let steps = captured.take("chat");
    assert_eq!(steps.iter().map(|s| s["replayed"].as_str()).collect::<Vec<_>>(), ["true", "true", "false"]);
    // A replayed step asked nothing of the model: no fresh timing or usage.
    assert!(steps[..2].iter().all(|s| !s.contains_key("duration_ms") && !s.contains_key("gen_ai.usage.input_tokens")));
    let calls = captured.take("execute_tool");
    let by_call: BTreeMap<&str, &Fields> = calls.iter().map(|c| (c["gen_ai.tool.call.id"].as_str(), c)).collect();
    assert_eq!(by_call["c1"]["replayed"], "true");
    assert!(!by_call["c1"].contains_key("duration_ms"));
    assert_eq!(by_call["c1"]["outcome"], "ok");
    assert_eq!(by_call["c3"]["replayed"], "false");
    assert_eq!(by_call["c3"]["outcome"], "ok");
    assert_eq!(captured.take("invoke_agent")[0]["status"], "finished");
}
