//! What OpenTelemetry receives from a run: kuralle's `tracing` spans exported through
//! `tracing-opentelemetry` into the OpenTelemetry SDK's in-memory exporter, checked against
//! the GenAI semantic conventions (span names and kinds, required attributes, `error.type`,
//! replay, opt-in content), on ScriptedModel and on each provider wire against a local
//! recorded-wire server; and the `gen_ai.client.*` metrics through a debugging recorder.
//!
//! `cargo test -p kuralle-tests --test telemetry -- --nocapture` prints a span dump.

use std::{
    collections::{BTreeMap, HashMap},
    sync::{Mutex, MutexGuard, PoisonError},
};

use kuralle::{
    AgentDef, Decision, Model, Policy, RunRequest, RunStatus, Runtime,
    models::{Anthropic, Gemini, OpenAi, OpenAiResponses},
    testing::{ScriptedModel, Turn},
};
use kuralle_tests::{
    echo_tool, ops_runtime,
    wire_server::{Reply, Server},
};
use metrics::{SharedString, Unit};
use metrics_util::{
    CompositeKey,
    debugging::{DebugValue, DebuggingRecorder},
};
use opentelemetry::{
    Value as OtelValue,
    trace::{SpanId, SpanKind, Status, TracerProvider as _},
};
use opentelemetry_sdk::trace::{InMemorySpanExporter, SdkTracerProvider, SpanData};
use serde_json::{Value, json};
use tracing::subscriber::DefaultGuard;
use tracing_subscriber::prelude::*;

/// The SDK pipeline of a test: spans end up in `exporter` as they close.
struct Otel {
    exporter: InMemorySpanExporter,
    _provider: SdkTracerProvider,
    _guard: DefaultGuard,
    _serial: MutexGuard<'static, ()>,
}

/// One test of this file runs a runtime at a time. `tracing` caches whether anyone listens at
/// a span's call site: a run on a thread with no subscriber (the metrics tests) can cache "no
/// one" while another test is installing its subscriber, and that test then sees no spans.
static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(PoisonError::into_inner)
}

fn otel() -> Otel {
    let serial = serial();
    let exporter = InMemorySpanExporter::default();
    let provider = SdkTracerProvider::builder().with_simple_exporter(exporter.clone()).build();
    let layer = tracing_opentelemetry::layer().with_tracer(provider.tracer("kuralle-tests"));
    let guard = tracing_subscriber::registry().with(layer).set_default();
    Otel { exporter, _provider: provider, _guard: guard, _serial: serial }
}

impl Otel {
    /// Every span finished since the last call, in close order.
    fn take(&self) -> Vec<SpanData> {
        let spans = self.exporter.get_finished_spans().unwrap();
        self.exporter.reset();
        spans
    }
}

fn attrs(span: &SpanData) -> BTreeMap<String, OtelValue> {
    span.attributes.iter().map(|kv| (kv.key.as_str().to_owned(), kv.value.clone())).collect()
}

fn attr(span: &SpanData, key: &str) -> Option<String> {
    attrs(span).get(key).map(ToString::to_string)
}

fn named<'a>(spans: &'a [SpanData], name: &str) -> Vec<&'a SpanData> {
    spans.iter().filter(|s| s.name == name).collect()
}

fn one<'a>(spans: &'a [SpanData], name: &str) -> &'a SpanData {
    let found = named(spans, name);
    assert_eq!(
        found.len(),
        1,
        "one `{name}` span expected among {:?}",
        spans.iter().map(|s| &s.name).collect::<Vec<_>>()
    );
    found[0]
}

/// The span with `key` = `value`, by attribute.
fn with<'a>(spans: &'a [SpanData], key: &str, value: &str) -> &'a SpanData {
    spans
        .iter()
        .find(|s| attr(s, key).as_deref() == Some(value))
        .unwrap_or_else(|| panic!("no span with {key}={value}"))
}

fn assert_required(span: &SpanData, keys: &[&str]) {
    for key in keys {
        assert!(attr(span, key).is_some(), "`{}` lacks `{key}`: {:?}", span.name, attrs(span));
    }
}

/// The dump the closing note quotes: each span's name, kind, parent, status and the
/// conventions' and kuralle's attributes (not tracing-opentelemetry's code locations, thread and timings).
fn dump(spans: &[SpanData]) -> String {
    let names: HashMap<SpanId, &str> = spans.iter().map(|s| (s.span_context.span_id(), s.name.as_ref())).collect();
    let mut out = String::new();
    for s in spans {
        let parent = names.get(&s.parent_span_id).copied().unwrap_or("-");
        out.push_str(&format!("{} [{:?}] parent={parent} status={:?}\n", s.name, s.span_kind, s.status));
        for (k, v) in attrs(s) {
            if !k.starts_with("code.")
                && !k.starts_with("thread.")
                && !["busy_ns", "idle_ns", "target"].contains(&k.as_str())
            {
                out.push_str(&format!("    {k} = {v}\n"));
            }
        }
    }
    out
}

/// Tools, a denied call (an error), a pending approval, then the resumed turn that replays.
#[tokio::test]
async fn a_run_with_tools_an_error_and_a_replay_exports_the_conventions() {
    let otel = otel();
    let rt = ops_runtime();

    let out = rt.run(RunRequest::new("go").run_id("run-7")).await.unwrap();
    assert_eq!(out.status, RunStatus::Paused);
    let spans = otel.take();

    let agent = one(&spans, "invoke_agent ops");
    assert_eq!(agent.span_kind, SpanKind::Internal);
    assert_required(
        agent,
        &["gen_ai.operation.name", "gen_ai.provider.name", "gen_ai.agent.name", "run_id", "outcome"],
    );
    assert_eq!(attr(agent, "gen_ai.operation.name").unwrap(), "invoke_agent");
    assert_eq!(attr(agent, "gen_ai.provider.name").unwrap(), "scripted");
    assert_eq!(attr(agent, "gen_ai.request.model").unwrap(), "scripted");
    assert_eq!(attr(agent, "gen_ai.conversation.id").unwrap(), "run-7");
    assert_eq!(attr(agent, "status").unwrap(), "paused");
    let agent_id = agent.span_context.span_id();

    let chats = named(&spans, "chat scripted");
    assert_eq!(chats.len(), 2);
    for chat in &chats {
        assert_eq!(chat.span_kind, SpanKind::Client);
        assert_eq!(chat.parent_span_id, agent_id);
        assert_required(
            chat,
            &[
                "gen_ai.operation.name",
                "gen_ai.provider.name",
                "gen_ai.request.model",
                "gen_ai.response.finish_reasons",
                "gen_ai.usage.input_tokens",
                "gen_ai.usage.output_tokens",
                "run_id",
                "replayed",
                "outcome",
                "duration_ms",
            ],
        );
        assert_eq!(attr(chat, "gen_ai.operation.name").unwrap(), "chat");
        assert_eq!(attr(chat, "replayed").unwrap(), "false");
        assert_eq!(attr(chat, "gen_ai.response.finish_reasons").unwrap(), r#"["tool_call"]"#);
        // Counts go out as integers, which backends sum and chart (not as strings).
        assert!(matches!(attrs(chat)["gen_ai.usage.input_tokens"], OtelValue::I64(n) if n > 0), "{:?}", attrs(chat));
        // No server behind ScriptedModel.
        assert_eq!(attr(chat, "server.address"), None);
    }

    let tools = named(&spans, "execute_tool lookup")
        .into_iter()
        .chain(named(&spans, "execute_tool drop_db"))
        .chain(named(&spans, "execute_tool wire"))
        .cloned()
        .collect::<Vec<_>>();
    assert_eq!(tools.len(), 3, "{}", dump(&spans));
    for t in &tools {
        assert_eq!(t.span_kind, SpanKind::Internal);
        assert_eq!(t.parent_span_id, agent_id);
        assert_required(
            t,
            &[
                "gen_ai.operation.name",
                "gen_ai.tool.name",
                "gen_ai.tool.call.id",
                "gen_ai.tool.type",
                "run_id",
                "outcome",
            ],
        );
        assert_eq!(attr(t, "gen_ai.operation.name").unwrap(), "execute_tool");
        assert_eq!(attr(t, "gen_ai.tool.type").unwrap(), "function");
    }
    let lookup = with(&tools, "gen_ai.tool.call.id", "c1");
    assert_eq!(attr(lookup, "gen_ai.tool.name").unwrap(), "lookup");
    assert_eq!((attr(lookup, "outcome").unwrap(), attr(lookup, "error.type")), ("ok".into(), None));
    assert_eq!(lookup.status, Status::Unset);
    let denied = with(&tools, "gen_ai.tool.call.id", "c2");
    assert_eq!(attr(denied, "error.type").unwrap(), "denied");
    assert!(matches!(denied.status, Status::Error { .. }), "{:?}", denied.status);
    assert_eq!(attr(with(&tools, "gen_ai.tool.call.id", "c3"), "outcome").unwrap(), "pending_approval");

    // The resumed turn replays the first model step and `lookup`; `wire` runs live.
    let out = rt.deliver("run-7", Decision::approve("alice")).await.unwrap();
    assert_eq!(out.status, RunStatus::Finished);
    let spans = otel.take();
    println!("--- span dump (resumed turn) ---\n{}", dump(&spans));
    let chats = named(&spans, "chat scripted");
    assert_eq!(chats.iter().map(|c| attr(c, "replayed").unwrap()).collect::<Vec<_>>(), ["true", "true", "false"]);
    for replayed in &chats[..2] {
        // Marked, and no fresh timing or spend: nothing was asked of the model.
        assert_eq!(attr(replayed, "duration_ms"), None);
        assert_eq!(attr(replayed, "gen_ai.usage.input_tokens"), None);
        assert_eq!(attr(replayed, "outcome").unwrap(), "ok");
    }
    assert_eq!(attr(chats[2], "gen_ai.response.finish_reasons").unwrap(), r#"["stop"]"#);
    let lookup = one(&spans, "execute_tool lookup");
    assert_eq!(attr(lookup, "replayed").unwrap(), "true");
    assert_eq!(attr(lookup, "duration_ms"), None);
    let wire = one(&spans, "execute_tool wire");
    assert_eq!((attr(wire, "replayed").unwrap(), attr(wire, "outcome").unwrap()), ("false".into(), "ok".into()));
    assert!(attr(wire, "duration_ms").is_some());
    let agent = one(&spans, "invoke_agent ops");
    assert_eq!(attr(agent, "status").unwrap(), "finished");
    assert_required(agent, &["gen_ai.usage.input_tokens", "gen_ai.usage.output_tokens"]);
}

#[tokio::test]
async fn a_failed_model_request_carries_error_type_on_chat_and_agent() {
    let otel = otel();
    let rt = Runtime::builder()
        .agent(AgentDef::new("ops", "x"))
        .model(ScriptedModel::new([Turn::error("upstream exploded")]))
        .build()
        .unwrap();
    rt.run(RunRequest::new("go").run_id("run-err")).await.unwrap_err();
    let spans = otel.take();
    let chat = one(&spans, "chat scripted");
    assert_eq!(attr(chat, "error.type").unwrap(), "provider_error");
    assert_eq!(attr(chat, "outcome").unwrap(), "error");
    assert!(matches!(chat.status, Status::Error { .. }));
    let agent = one(&spans, "invoke_agent ops");
    assert_eq!(attr(agent, "error.type").unwrap(), "provider_error");
    assert!(matches!(agent.status, Status::Error { .. }));
}

fn content_run(capture: bool) -> (Runtime, ScriptedModel) {
    let model = ScriptedModel::by_transcript([
        Turn::tool_calls([("c1", "lookup", r#"{"q":"secret"}"#)]),
        Turn::text("The answer."),
    ]);
    let rt = Runtime::builder()
        .agent(AgentDef::new("ops", "Be terse.").tool(echo_tool("lookup")))
        .model(model.clone())
        .capture_content(capture)
        .build()
        .unwrap();
    (rt, model)
}

#[tokio::test]
async fn content_goes_on_the_spans_only_when_opted_in() {
    let otel = otel();
    let (rt, _) = content_run(true);
    rt.run(RunRequest::new("find the secret").run_id("run-c")).await.unwrap();
    let spans = otel.take();
    let chats = named(&spans, "chat scripted");
    let input: Value = serde_json::from_str(&attr(chats[0], "gen_ai.input.messages").unwrap()).unwrap();
    assert_eq!(input, json!([{ "role": "user", "parts": [{ "type": "text", "content": "find the secret" }] }]));
    let system: Value = serde_json::from_str(&attr(chats[0], "gen_ai.system_instructions").unwrap()).unwrap();
    assert_eq!(system, json!([{ "type": "text", "content": "Be terse." }]));
    let output: Value = serde_json::from_str(&attr(chats[0], "gen_ai.output.messages").unwrap()).unwrap();
    assert_eq!(
        output,
        json!([{ "role": "assistant", "finish_reason": "tool_call",
                 "parts": [{ "type": "tool_call", "id": "c1", "name": "lookup", "arguments": { "q": "secret" } }] }])
    );
    // The second request sends the call and its result back.
    let input: Value = serde_json::from_str(&attr(chats[1], "gen_ai.input.messages").unwrap()).unwrap();
    assert_eq!(
        input[2],
        json!({ "role": "tool", "parts": [{ "type": "tool_call_response", "id": "c1",
        "response": { "ok": { "q": "secret" } } }] })
    );
    let lookup = one(&spans, "execute_tool lookup");
    assert_eq!(attr(lookup, "gen_ai.tool.call.arguments").unwrap(), r#"{"q":"secret"}"#);
    assert_eq!(attr(lookup, "gen_ai.tool.call.result").unwrap(), r#"{"ok":{"q":"secret"}}"#);

    let (rt, _) = content_run(false);
    rt.run(RunRequest::new("find the secret").run_id("run-d")).await.unwrap();
    let spans = otel.take();
    println!("--- span dump (one tool call, content not captured) ---\n{}", dump(&spans));
    for span in &spans {
        for key in [
            "gen_ai.input.messages",
            "gen_ai.output.messages",
            "gen_ai.system_instructions",
            "gen_ai.tool.call.arguments",
            "gen_ai.tool.call.result",
        ] {
            assert_eq!(attr(span, key), None, "`{}` carries `{key}` without opting in", span.name);
        }
    }
    // Nor anywhere else: no attribute of any span holds the input or the tool's arguments.
    assert!(!dump(&spans).contains("secret"), "{}", dump(&spans));
}

/// Charge a card.
#[kuralle::tool]
async fn charge(card: kuralle::Secret<String>, cents: u64) -> String {
    let _ = card;
    format!("charged {cents}")
}

/// A session token.
#[kuralle::tool]
async fn session_token() -> kuralle::Secret<String> {
    kuralle::Secret::new("tok_live_77".to_owned())
}

#[tokio::test]
async fn captured_content_never_holds_a_secret() {
    let otel = otel();
    let model = ScriptedModel::new([
        Turn::tool_calls([
            ("c1", "charge", r#"{"card":"4111111111111111","cents":250}"#),
            ("c2", "session_token", "{}"),
        ]),
        Turn::text("Done."),
    ]);
    let rt = Runtime::builder()
        .agent(AgentDef::new("billing", "Bill.").tool(Charge).tool(SessionToken))
        .model(model)
        .capture_content(true)
        .build()
        .unwrap();
    rt.run(RunRequest::new("charge it").run_id("run-s")).await.unwrap();
    let spans = otel.take();
    let dumped = dump(&spans);
    assert!(!dumped.contains("4111111111111111") && !dumped.contains("tok_live_77"), "{dumped}");
    // What is not secret is still captured.
    let charge = one(&spans, "execute_tool charge");
    assert_eq!(attr(charge, "gen_ai.tool.call.arguments").unwrap(), r#"{"card":"[redacted]","cents":250}"#);
    assert_eq!(attr(one(&spans, "execute_tool session_token"), "gen_ai.tool.call.result").unwrap(), r#""[redacted]""#);
    let chats = named(&spans, "chat scripted");
    let input = attr(chats[1], "gen_ai.input.messages").unwrap();
    assert!(input.contains("charged 250") && input.contains("[redacted]"), "{input}");
}

/// What `run` records through the `metrics` facade, run alone on a runtime of its own.
fn measured(run: impl Future<Output = ()>) -> Vec<(CompositeKey, Option<Unit>, Option<SharedString>, DebugValue)> {
    let _serial = serial();
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    metrics::with_local_recorder(&recorder, || {
        tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(run);
    });
    snapshotter.snapshot().into_vec()
}

/// Fresh requests are measured, replayed ones are not, on `gen_ai.client.token.usage` and
/// `gen_ai.client.operation.duration` with the conventions' attributes.
#[test]
fn metrics_measure_fresh_requests_only() {
    let metrics = measured(async {
        let model = ScriptedModel::by_transcript([
            Turn::tool_calls([("c1", "wire", r#"{"amount":900}"#)]),
            Turn::text("Done."),
        ]);
        let agent = AgentDef::new("ops", "x").tool(echo_tool("wire")).policy(Policy::new().ask("wire"));
        let runtime = Runtime::builder().agent(agent).model(model).build().unwrap();
        let out = runtime.run(RunRequest::new("go").run_id("run-m")).await.unwrap();
        assert_eq!(out.status, RunStatus::Paused);
        // Resuming replays the first request and sends the second.
        let out = runtime.deliver("run-m", Decision::approve("alice")).await.unwrap();
        assert_eq!(out.status, RunStatus::Finished);
    });
    let mut durations = 0;
    let mut tokens = BTreeMap::new();
    for (key, _, _, value) in metrics {
        let key = key.key();
        let labels: BTreeMap<&str, &str> = key.labels().map(|l| (l.key(), l.value())).collect();
        assert_eq!(labels["gen_ai.operation.name"], "chat");
        assert_eq!(labels["gen_ai.provider.name"], "scripted");
        assert_eq!(labels["gen_ai.request.model"], "scripted");
        let DebugValue::Histogram(values) = value else { panic!("{key:?} is not a histogram") };
        match key.name() {
            "gen_ai.client.operation.duration" => durations += values.len(),
            "gen_ai.client.token.usage" => {
                tokens.insert(labels["gen_ai.token.type"].to_owned(), values.len());
            }
            other => panic!("unexpected metric {other}"),
        }
    }
    // Two requests were sent (the first turn's, and the resumed turn's second): the replayed
    // first request is not measured again.
    assert_eq!(durations, 2);
    assert_eq!(tokens, BTreeMap::from([("input".to_owned(), 2), ("output".to_owned(), 2)]));
}

/// A failed request is timed with its `error.type`, and spent no tokens to count.
#[test]
fn a_failed_request_is_timed_with_its_error_type() {
    let metrics = measured(async {
        let runtime = Runtime::builder()
            .agent(AgentDef::new("ops", "x"))
            .model(ScriptedModel::new([Turn::error("upstream exploded")]))
            .build()
            .unwrap();
        runtime.run(RunRequest::new("go").run_id("run-me")).await.unwrap_err();
    });
    let names: Vec<&str> = metrics.iter().map(|(k, ..)| k.key().name()).collect();
    assert_eq!(names, ["gen_ai.client.operation.duration"]);
    let (key, _, _, value) = &metrics[0];
    let labels: BTreeMap<&str, &str> = key.key().labels().map(|l| (l.key(), l.value())).collect();
    assert_eq!(labels["error.type"], "provider_error");
    assert!(matches!(value, DebugValue::Histogram(v) if v.len() == 1), "{value:?}");
}

// ---------------------------------------------------------------------------------------------
// Each provider wire, against a local server answering with that wire's recorded format.

/// Runs one turn of `model` against the served reply; returns the `chat` span.
async fn wire_run(model: impl Model, server: &Server) -> SpanData {
    let otel = otel();
    let rt = Runtime::builder().agent(AgentDef::new("ops", "x")).model(model).build().unwrap();
    let out = rt.run(RunRequest::new("hi").run_id("run-w")).await.unwrap();
    assert_eq!((out.status, out.text.as_str()), (RunStatus::Finished, "Hello."));
    assert_eq!(server.requests().len(), 1);
    let spans = otel.take();
    let agent = one(&spans, "invoke_agent ops");
    let chat =
        spans.iter().find(|s| s.parent_span_id == agent.span_context.span_id() && s.span_kind == SpanKind::Client);
    chat.unwrap_or_else(|| panic!("no client span: {}", dump(&spans))).clone()
}

/// The attributes every wire's chat span carries, checked against the local server.
fn assert_wire(chat: &SpanData, server: &Server, expect: [(&str, &str); 6]) {
    let port = server.origin.rsplit(':').next().unwrap();
    assert_eq!(attr(chat, "server.address").unwrap(), "127.0.0.1");
    assert_eq!(attrs(chat)["server.port"], OtelValue::I64(port.parse().unwrap()));
    for (key, value) in expect {
        assert_eq!(attr(chat, key).as_deref(), Some(value), "{key}: {:?}", attrs(chat));
    }
    assert_eq!(attr(chat, "replayed").unwrap(), "false");
}

#[tokio::test]
async fn openai_chat_completions_wire() {
    let chunk = |delta: Value, finish: Value, usage: Value| {
        json!({"id": "chatcmpl-B9MHDbslfkBeAs8l4bebGdFOJ6PeG", "object": "chat.completion.chunk", "created": 1_741_570_283,
               "model": "gpt-4o-mini-2024-07-18", "system_fingerprint": "fp_06737a9306",
               "choices": if usage.is_null() { json!([{"index": 0, "delta": delta, "finish_reason": finish}]) } else { json!([]) },
               "usage": usage})
    };
    let body: String = [
        chunk(json!({"role": "assistant", "content": ""}), Value::Null, Value::Null),
        chunk(json!({"content": "Hello."}), Value::Null, Value::Null),
        chunk(json!({}), json!("stop"), Value::Null),
        chunk(json!({}), Value::Null, json!({"prompt_tokens": 12, "completion_tokens": 3, "total_tokens": 15})),
    ]
    .iter()
    .map(|c| format!("data: {c}\n\n"))
    .chain(["data: [DONE]\n\n".to_owned()])
    .collect();
    let server = Server::start(vec![Reply::Sse { body, chunked: true, piece: 29 }]).await;
    let model = OpenAi::builder().base_url(&server.base_url).api_key("sk-test").model("gpt-4o-mini").build().unwrap();
    let chat = wire_run(model, &server).await;
    assert_eq!(chat.name, "chat gpt-4o-mini");
    assert_wire(
        &chat,
        &server,
        [
            ("gen_ai.operation.name", "chat"),
            ("gen_ai.provider.name", "openai"),
            ("gen_ai.request.model", "gpt-4o-mini"),
            ("gen_ai.response.model", "gpt-4o-mini-2024-07-18"),
            ("gen_ai.response.id", "chatcmpl-B9MHDbslfkBeAs8l4bebGdFOJ6PeG"),
            ("gen_ai.usage.input_tokens", "12"),
        ],
    );
}

#[tokio::test]
async fn openai_responses_wire() {
    let response = |status: &str, output: Value, usage: Value| {
        json!({"id": "resp_68af4030592c81938ec0a5fbab4a3e9f", "object": "response", "status": status,
               "model": "o4-mini-2025-04-16", "output": output, "usage": usage, "error": null, "incomplete_details": null})
    };
    let item = json!({"id": "msg_1", "type": "message", "status": "completed", "role": "assistant",
                      "content": [{"type": "output_text", "annotations": [], "text": "Hello."}]});
    let events = [
        json!({"type": "response.created", "response": response("in_progress", json!([]), Value::Null)}),
        json!({"type": "response.output_item.added", "output_index": 0,
               "item": {"id": "msg_1", "type": "message", "status": "in_progress", "content": [], "role": "assistant"}}),
        json!({"type": "response.output_text.delta", "item_id": "msg_1", "output_index": 0, "content_index": 0, "delta": "Hello."}),
        json!({"type": "response.output_item.done", "output_index": 0, "item": item}),
        json!({"type": "response.completed", "response": response("completed", json!([item]),
               json!({"input_tokens": 20, "input_tokens_details": {"cached_tokens": 0}, "output_tokens": 4,
                      "output_tokens_details": {"reasoning_tokens": 2}, "total_tokens": 24}))}),
    ];
    let body: String =
        events.iter().map(|e| format!("event: {}\ndata: {e}\n\n", e["type"].as_str().unwrap())).collect();
    let server = Server::start(vec![Reply::Sse { body, chunked: true, piece: 31 }]).await;
    let model =
        OpenAiResponses::builder().base_url(&server.base_url).api_key("sk-test").model("o4-mini").build().unwrap();
    let chat = wire_run(model, &server).await;
    assert_eq!(chat.name, "chat o4-mini");
    assert_wire(
        &chat,
        &server,
        [
            ("gen_ai.operation.name", "chat"),
            ("gen_ai.provider.name", "openai"),
            ("gen_ai.request.model", "o4-mini"),
            ("gen_ai.response.model", "o4-mini-2025-04-16"),
            ("gen_ai.response.id", "resp_68af4030592c81938ec0a5fbab4a3e9f"),
            ("gen_ai.usage.reasoning.output_tokens", "2"),
        ],
    );
}

#[tokio::test]
async fn anthropic_messages_wire() {
    let events = [
        json!({"type": "message_start", "message": {"id": "msg_01XFDUDYJgAACzvnptvVoYEL", "type": "message",
               "role": "assistant", "content": [], "model": "claude-sonnet-4-5-20250929", "stop_reason": null,
               "usage": {"input_tokens": 10, "cache_creation_input_tokens": 0, "cache_read_input_tokens": 30, "output_tokens": 1}}}),
        json!({"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}),
        json!({"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "Hello."}}),
        json!({"type": "content_block_stop", "index": 0}),
        json!({"type": "message_delta", "delta": {"stop_reason": "end_turn", "stop_sequence": null}, "usage": {"output_tokens": 5}}),
        json!({"type": "message_stop"}),
    ];
    let body: String =
        events.iter().map(|e| format!("event: {}\ndata: {e}\n\n", e["type"].as_str().unwrap())).collect();
    let server = Server::start(vec![Reply::Sse { body, chunked: true, piece: 23 }]).await;
    let model = Anthropic::builder()
        .base_url(&server.origin)
        .api_key("sk-ant-test")
        .model("claude-sonnet-4-5")
        .build()
        .unwrap();
    let chat = wire_run(model, &server).await;
    assert_eq!(chat.name, "chat claude-sonnet-4-5");
    assert_wire(
        &chat,
        &server,
        [
            ("gen_ai.operation.name", "chat"),
            ("gen_ai.provider.name", "anthropic"),
            ("gen_ai.request.model", "claude-sonnet-4-5"),
            ("gen_ai.response.model", "claude-sonnet-4-5-20250929"),
            ("gen_ai.response.id", "msg_01XFDUDYJgAACzvnptvVoYEL"),
            // Cache reads count in the input, and apart.
            ("gen_ai.usage.cache_read.input_tokens", "30"),
        ],
    );
    assert_eq!(attr(&chat, "gen_ai.usage.input_tokens").unwrap(), "40");
}

#[tokio::test]
async fn gemini_generate_content_wire() {
    let chunk = json!({
        "candidates": [{"content": {"parts": [{"text": "Hello."}], "role": "model"}, "finishReason": "STOP", "index": 0}],
        "usageMetadata": {"promptTokenCount": 8, "candidatesTokenCount": 2, "totalTokenCount": 10},
        "modelVersion": "gemini-2.5-flash-001",
        "responseId": "yTsuaK2mDoK1nvgPo7KbyQ4",
    });
    let server =
        Server::start(vec![Reply::Sse { body: format!("data: {chunk}\r\n\r\n"), chunked: true, piece: 23 }]).await;
    let model =
        Gemini::builder().base_url(&server.origin).api_key("AIza-test").model("gemini-2.5-flash").build().unwrap();
    let chat = wire_run(model, &server).await;
    // The conventions' own operation for Gemini's Generate Content API.
    assert_eq!(chat.name, "generate_content gemini-2.5-flash");
    assert_wire(
        &chat,
        &server,
        [
            ("gen_ai.operation.name", "generate_content"),
            ("gen_ai.provider.name", "gcp.gemini"),
            ("gen_ai.request.model", "gemini-2.5-flash"),
            ("gen_ai.response.model", "gemini-2.5-flash-001"),
            ("gen_ai.response.id", "yTsuaK2mDoK1nvgPo7KbyQ4"),
            ("gen_ai.usage.output_tokens", "2"),
        ],
    );
}
