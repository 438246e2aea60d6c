//! Typed final output through the public API, with `ScriptedModel` (issue 25, part 1): the
//! three modes, the output tool beside other tools, repair of answers that fail the schema or
//! serde, the typed errors that end a run (repairs spent, cut off, refused), and durability:
//! the accepted value is journaled, so a resumed or repeated request returns it without asking
//! the model again.

use std::sync::{
    Arc,
    atomic::{AtomicUsize, Ordering},
};

use kuralle::{
    AgentDef, FinishReason, Message, OutputError, OutputMode, RunError, RunRequest, RunStatus, RunStore, Runtime,
    StepKind, StepStatus, ToolChoice, Usage,
    stores::SqliteStore,
    testing::{ScriptedModel, Turn},
};
use kuralle_tests::{FlakyStore, FnTool};
use schemars::JsonSchema;
use serde::Deserialize;
use serde_json::{Value, json};

#[derive(Debug, PartialEq, Deserialize, JsonSchema)]
struct Invoice {
    number: String,
    total_cents: u64,
}

/// A stock-keeping unit: any string to the schema, only `SKU-…` to serde. A value can pass the
/// schema and still fail `Deserialize`.
#[derive(Debug, PartialEq, Deserialize, JsonSchema)]
#[serde(try_from = "String")]
#[schemars(with = "String")]
struct Sku(String);

impl TryFrom<String> for Sku {
    type Error = String;
    fn try_from(s: String) -> Result<Self, String> {
        if s.starts_with("SKU-") { Ok(Self(s)) } else { Err(format!("`{s}` does not start with `SKU-`")) }
    }
}

#[derive(Debug, PartialEq, Deserialize, JsonSchema)]
struct Line {
    sku: Sku,
    qty: u32,
}

fn invoice_agent() -> AgentDef {
    AgentDef::new("billing", "Read the invoice.").output::<Invoice>()
}

fn rt(agent: AgentDef, model: &ScriptedModel) -> Runtime {
    Runtime::builder().agent(agent).model(model.clone()).build().unwrap()
}

fn output_call(id: &str, args: &str) -> Turn {
    Turn::tool_calls([(id, "final_result", args)])
}

/// Every message of the last request the model saw.
fn last_messages(model: &ScriptedModel) -> Vec<Message> {
    model.requests().last().unwrap().messages.iter().cloned().collect()
}

/// The content of every tool result in `messages`, as JSON text.
fn tool_results(messages: &[Message]) -> Vec<String> {
    messages
        .iter()
        .filter_map(|m| match m {
            Message::Tool { content, .. } => Some(content.to_string()),
            _ => None,
        })
        .collect()
}

#[tokio::test]
async fn tool_mode_is_the_default_and_returns_the_value_as_t() {
    let model = ScriptedModel::new([output_call("c1", r#"{"number":"A-7","total_cents":1250}"#)]);
    let out = rt(invoice_agent(), &model).run("Invoice A-7, total 12.50").await.unwrap();

    assert_eq!(out.status, RunStatus::Finished);
    assert_eq!(out.typed::<Invoice>().unwrap(), Invoice { number: "A-7".into(), total_cents: 1250 });
    assert_eq!(serde_json::from_str::<Value>(&out.text).unwrap(), json!({"number": "A-7", "total_cents": 1250}));

    let request = &model.requests()[0];
    let output = request.output.as_ref().expect("the request carries the output");
    assert_eq!(output.mode, OutputMode::Tool);
    // No other tool: the output tool is forced.
    assert_eq!(output.tool_choice, ToolChoice::Tool { name: "final_result".into() });
    let tool = request.tools.iter().find(|t| t.name == "final_result").expect("the output tool is offered");
    assert_eq!(tool.input_schema["required"], json!(["number", "total_cents"]));
    // Another type than the agent's, when it does not fit, is a typed error.
    assert!(matches!(out.typed::<Vec<u8>>(), Err(OutputError::Decode { .. })));
}

#[tokio::test]
async fn the_output_tool_works_beside_other_tools() {
    let lookups = Arc::new(AtomicUsize::new(0));
    let seen = Arc::clone(&lookups);
    let lookup = FnTool::new("lookup_invoice", move |_, _| {
        let seen = Arc::clone(&seen);
        async move {
            seen.fetch_add(1, Ordering::SeqCst);
            Ok(json!({"number": "B-2", "total_cents": 990}))
        }
    });
    let model = ScriptedModel::new([
        Turn::tool_calls([("c1", "lookup_invoice", "{}")]),
        output_call("c2", r#"{"number":"B-2","total_cents":990}"#),
    ]);
    let agent = invoice_agent().tool(lookup);
    let out = rt(agent, &model).run("What does invoice B-2 say?").await.unwrap();

    assert_eq!(out.typed::<Invoice>().unwrap(), Invoice { number: "B-2".into(), total_cents: 990 });
    assert_eq!(lookups.load(Ordering::SeqCst), 1);
    let requests = model.requests();
    assert_eq!(requests.len(), 2);
    // With other tools to call first, any call is required, not the output tool's.
    assert_eq!(requests[0].output.as_ref().unwrap().tool_choice, ToolChoice::Required);
    let names: Vec<&str> = requests[0].tools.iter().map(|t| t.name.as_str()).collect();
    assert_eq!(names, ["lookup_invoice", "final_result"]);
    assert_eq!(tool_results(&last_messages(&model)), [r#"{"number":"B-2","total_cents":990}"#]);
}

#[tokio::test]
async fn calls_beside_the_output_call_in_one_response_run_before_the_run_ends() {
    let ran = Arc::new(AtomicUsize::new(0));
    let seen = Arc::clone(&ran);
    let note = FnTool::new("note", move |_, _| {
        let seen = Arc::clone(&seen);
        async move {
            seen.fetch_add(1, Ordering::SeqCst);
            Ok(json!("noted"))
        }
    });
    let model = ScriptedModel::new([Turn::tool_calls([
        ("c1", "note", "{}"),
        ("c2", "final_result", r#"{"number":"C-3","total_cents":5}"#),
    ])]);
    let runtime = rt(invoice_agent().tool(note), &model);
    let out = runtime.run(RunRequest::new("x").run_id("r")).await.unwrap();
    assert_eq!(out.typed::<Invoice>().unwrap().number, "C-3");
    assert_eq!(ran.load(Ordering::SeqCst), 1);
    assert_eq!(model.requests().len(), 1, "an accepted output ends the turn");
    let steps = runtime.journal("r").await.unwrap();
    let kinds: Vec<(StepKind, &str)> = steps.iter().map(|s| (s.kind, s.name.as_str())).collect();
    assert_eq!(
        kinds,
        [
            (StepKind::Model, "model"),
            (StepKind::Tool, "note"),
            (StepKind::Tool, "final_result"),
            (StepKind::Output, "final_result")
        ]
    );
}

#[tokio::test]
async fn a_value_failing_the_schema_goes_back_with_the_error_and_is_repaired() {
    let model = ScriptedModel::new([
        output_call("c1", r#"{"number":"A-7","total_cents":-1250}"#),
        output_call("c2", r#"{"number":"A-7","total_cents":1250}"#),
    ]);
    let runtime = rt(invoice_agent(), &model);
    let out = runtime.run(RunRequest::new("Invoice A-7").run_id("r")).await.unwrap();
    assert_eq!(out.typed::<Invoice>().unwrap(), Invoice { number: "A-7".into(), total_cents: 1250 });

    // The model saw its first answer rejected, naming the path and the problem.
    let results = tool_results(&last_messages(&model));
    assert_eq!(results.len(), 1);
    let error = &results[0];
    assert!(error.contains("/total_cents") && error.contains("less than the minimum 0"), "{error}");

    // Each attempt is a journaled model response, and the run's usage is their sum.
    let steps = runtime.journal("r").await.unwrap();
    let responses: Vec<Usage> = steps
        .iter()
        .filter(|s| s.kind == StepKind::Model)
        .map(|s| {
            let response: Value = serde_json::from_str(s.result.as_ref().unwrap().as_str()).unwrap();
            serde_json::from_value(response["usage"].clone()).unwrap()
        })
        .collect();
    assert_eq!(responses.len(), 2, "{steps:?}");
    assert!(responses.iter().all(|u| u.output_tokens > 0));
    let mut sum = Usage::default();
    for u in &responses {
        sum += *u;
    }
    assert_eq!(out.usage, sum);
    let output_steps: Vec<_> = steps.iter().filter(|s| s.kind == StepKind::Output).collect();
    assert_eq!(output_steps.len(), 1, "only the accepted value is the output");
}

#[tokio::test]
async fn a_value_failing_serde_but_not_the_schema_is_repaired_with_serdes_message() {
    let model = ScriptedModel::new([
        output_call("c1", r#"{"response":[{"sku":"12-A","qty":2}]}"#),
        output_call("c2", r#"{"response":[{"sku":"SKU-12A","qty":2}]}"#),
    ]);
    // A list is no object: the wire schema wraps it as `response`; `typed` gives the list.
    let agent = AgentDef::new("orders", "List the order's lines.").output::<Vec<Line>>();
    let out = rt(agent, &model).run("2 of 12-A").await.unwrap();
    assert_eq!(out.typed::<Vec<Line>>().unwrap(), [Line { sku: Sku("SKU-12A".into()), qty: 2 }]);
    let error = tool_results(&last_messages(&model)).remove(0);
    assert!(error.contains("`12-A` does not start with `SKU-`"), "{error}");
    assert!(error.contains("[0].sku"), "the serde path is named: {error}");
}

#[tokio::test]
async fn after_the_last_retry_the_run_fails_with_what_was_wrong() {
    let model = ScriptedModel::new([
        output_call("c1", r#"{"number":"A-7"}"#),
        output_call("c2", r#"{"number":"A-7","total_cents":"12.50"}"#),
        output_call("c3", r#"{"number":"A-7","total_cents":1250}"#),
    ]);
    let runtime = rt(invoice_agent().output_retries(1), &model);
    let err = runtime.run(RunRequest::new("Invoice A-7").run_id("r")).await.unwrap_err();

    let RunError::Output(OutputError::Invalid { attempts, message }) = &err else { panic!("{err:?}") };
    assert_eq!(*attempts, 2, "the first answer and one repair");
    assert!(message.contains("/total_cents") && message.contains("expected integer"), "{message}");
    assert!(err.to_string().contains("after 2 attempts"), "{err}");
    assert_eq!(model.requests().len(), 2, "no third request after the budget is spent");
    let record = runtime.get_run("r").await.unwrap().unwrap();
    assert_eq!(record.status, RunStatus::Failed);
    let steps = runtime.journal("r").await.unwrap();
    assert_eq!(steps.iter().filter(|s| s.kind == StepKind::Model).count(), 2);
    assert!(steps.iter().all(|s| s.kind != StepKind::Output));
}

#[tokio::test]
async fn zero_retries_fails_on_the_first_invalid_answer_and_a_text_answer_counts_as_one() {
    let model = ScriptedModel::new([Turn::text("The total is 12.50."), output_call("c1", "{}")]);
    let err = rt(invoice_agent().output_retries(0), &model).run("x").await.unwrap_err();
    let RunError::Output(OutputError::Invalid { attempts: 1, message }) = &err else { panic!("{err:?}") };
    assert!(message.contains("instead of calling the `final_result` tool"), "{message}");
    assert_eq!(model.requests().len(), 1);
}

#[tokio::test]
async fn a_cut_off_answer_is_its_own_error_and_not_repaired() {
    for mode in [OutputMode::Native, OutputMode::Tool] {
        let model = ScriptedModel::new([
            Turn::text(r#"{"number":"A-7","total_ce"#).with_finish(FinishReason::Length),
            Turn::text(r#"{"number":"A-7","total_cents":1}"#),
        ]);
        let err = rt(invoice_agent().output_mode(mode), &model).run("x").await.unwrap_err();
        let RunError::Output(OutputError::Truncated { partial }) = &err else { panic!("{mode:?}: {err:?}") };
        assert_eq!(partial, r#"{"number":"A-7","total_ce"#);
        assert!(err.to_string().contains("finish reason `length`"), "{err}");
        assert_eq!(model.requests().len(), 1, "{mode:?}: asking again gets the same cut");
    }
}

#[tokio::test]
async fn a_cut_off_output_call_is_truncated_too() {
    let model = ScriptedModel::new([output_call("c1", r#"{"number":"A-7","tot"#).with_finish(FinishReason::Length)]);
    let err = rt(invoice_agent(), &model).run("x").await.unwrap_err();
    assert!(matches!(err, RunError::Output(OutputError::Truncated { .. })), "{err:?}");
}

#[tokio::test]
async fn a_refusal_is_its_own_error() {
    let model = ScriptedModel::new([Turn::text("I can't help with that.").with_finish(FinishReason::Refusal)]);
    let runtime = rt(invoice_agent().output_mode(OutputMode::Native), &model);
    let err = runtime.run(RunRequest::new("x").run_id("r")).await.unwrap_err();
    assert_eq!(err.to_string(), "the model refused to give the output: I can't help with that.");
    assert!(matches!(err, RunError::Output(OutputError::Refused { .. })));
    assert_eq!(runtime.get_run("r").await.unwrap().unwrap().status, RunStatus::Failed);
}

#[tokio::test]
async fn native_mode_reads_the_answer_text_and_offers_no_output_tool() {
    let model = ScriptedModel::new([Turn::text(r#"{"number":"N-1","total_cents":100}"#)]);
    let out = rt(invoice_agent().output_mode(OutputMode::Native), &model).run("x").await.unwrap();
    assert_eq!(out.typed::<Invoice>().unwrap().number, "N-1");
    let request = &model.requests()[0];
    assert!(request.tools.is_empty());
    let output = request.output.as_ref().unwrap();
    assert_eq!((output.mode, &output.tool_choice), (OutputMode::Native, &ToolChoice::Auto));
    assert_eq!(output.schema["required"], json!(["number", "total_cents"]));
}

#[tokio::test]
async fn prompted_mode_puts_the_schema_in_the_instructions_and_repairs_prose() {
    let model = ScriptedModel::new([
        Turn::text("Sure! The invoice is A-7."),
        Turn::text("```json\n{\"number\":\"A-7\",\"total_cents\":1250}\n```"),
    ]);
    let out = rt(invoice_agent().output_mode(OutputMode::Prompted), &model).run("x").await.unwrap();
    assert_eq!(out.typed::<Invoice>().unwrap(), Invoice { number: "A-7".into(), total_cents: 1250 });

    let requests = model.requests();
    assert!(requests[0].tools.is_empty());
    assert!(requests[0].system.starts_with("Read the invoice."));
    assert!(requests[0].system.contains("\"total_cents\""), "{}", requests[0].system);
    let Some(Message::User { content }) = requests[1].messages.iter().next_back() else { panic!("{:?}", requests[1]) };
    assert!(content.contains("not JSON"), "{content}");
}

#[tokio::test]
async fn a_macro_agent_with_output_keys_answers_with_its_type() {
    /// Read the invoice.
    #[kuralle::agent(id = "billing", output = Invoice, output_mode = kuralle::OutputMode::Prompted, output_retries = 0)]
    struct Billing;

    let model = ScriptedModel::new([Turn::text(r#"{"number":"M-1","total_cents":3}"#)]);
    let out = Runtime::builder().agent(Billing).model(model.clone()).build().unwrap().run("x").await.unwrap();
    assert_eq!(out.typed::<Invoice>().unwrap(), Invoice { number: "M-1".into(), total_cents: 3 });
    assert_eq!(model.requests()[0].output.as_ref().unwrap().mode, OutputMode::Prompted);

    let model = ScriptedModel::new([Turn::text("no"), Turn::text(r#"{"number":"M-1","total_cents":3}"#)]);
    let err = Runtime::builder().agent(Billing).model(model).build().unwrap().run("x").await.unwrap_err();
    assert!(matches!(err, RunError::Output(OutputError::Invalid { attempts: 1, .. })), "{err:?}");
}

// ---------------------------------------------------------------------------------------------
// Durability, on SQLite: a model that is not asked again is one whose script is empty (any
// request would fail the run with `ScriptExhausted`) and whose request log stays empty.

fn sqlite(dir: &tempfile::TempDir) -> Arc<dyn RunStore> {
    Arc::new(SqliteStore::open(dir.path().join("runs.db")).unwrap())
}

fn on(store: Arc<dyn RunStore>, model: &ScriptedModel) -> Runtime {
    Runtime::builder().agent(invoice_agent()).model(model.clone()).store_arc(store).build().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_repeated_request_returns_the_journaled_value_without_asking_the_model() {
    let dir = tempfile::tempdir().unwrap();
    let first = ScriptedModel::new([
        output_call("c1", r#"{"number":"A-7","total_cents":"x"}"#),
        output_call("c2", r#"{"number":"A-7","total_cents":1250}"#),
    ]);
    let request = || RunRequest::new("Invoice A-7").run_id("r").idempotency_key("msg-1");
    let out = on(sqlite(&dir), &first).run(request()).await.unwrap();
    let expected = Invoice { number: "A-7".into(), total_cents: 1250 };
    assert_eq!(out.typed::<Invoice>().unwrap(), expected);

    let steps = sqlite(&dir).steps("r").await.unwrap();
    let output = steps.iter().find(|s| s.kind == StepKind::Output).expect("the accepted value is journaled");
    assert_eq!(output.status, StepStatus::Finished);
    assert_eq!(
        serde_json::from_str::<Value>(output.result.as_ref().unwrap().as_str()).unwrap(),
        json!({"number": "A-7", "total_cents": 1250})
    );

    // Another process, the same file: the same request, then a resume of the run id.
    let idle = ScriptedModel::new([]);
    let again = on(sqlite(&dir), &idle).run(request()).await.unwrap();
    assert_eq!(again.typed::<Invoice>().unwrap(), expected);
    assert_eq!(again.usage, out.usage);
    let resumed = on(sqlite(&dir), &idle).resume("r").await.unwrap();
    assert_eq!(resumed.typed::<Invoice>().unwrap(), expected);
    assert!(idle.requests().is_empty(), "the model was asked again: {:?}", idle.requests());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_turn_cut_off_after_the_value_was_journaled_resumes_to_the_same_value() {
    for mode in [OutputMode::Tool, OutputMode::Native] {
        let dir = tempfile::tempdir().unwrap();
        let answer = r#"{"number":"D-4","total_cents":40}"#;
        let first = ScriptedModel::new([match mode {
            OutputMode::Tool => output_call("c1", answer),
            _ => Turn::text(answer),
        }]);
        // The journal is written, the run's row cannot say the turn ended: the process dying
        // between the two.
        let flaky = FlakyStore::new(sqlite(&dir));
        flaky.fail_put(true);
        let agent = invoice_agent().output_mode(mode);
        let runtime = Runtime::builder().agent(agent.clone()).model(first.clone()).store(flaky).build().unwrap();
        let err = runtime.run(RunRequest::new("Invoice D-4").run_id("r")).await.unwrap_err();
        assert!(err.is_retryable(), "{err:?}");
        let store = sqlite(&dir);
        assert_eq!(store.get_run("r").await.unwrap().unwrap().status, RunStatus::Running);
        assert!(store.steps("r").await.unwrap().iter().any(|s| s.kind == StepKind::Output), "{mode:?}");

        let idle = ScriptedModel::new([]);
        let runtime = Runtime::builder().agent(agent).model(idle.clone()).store_arc(store).build().unwrap();
        let out = runtime.resume("r").await.unwrap();
        assert_eq!(out.status, RunStatus::Finished);
        assert_eq!(out.typed::<Invoice>().unwrap(), Invoice { number: "D-4".into(), total_cents: 40 });
        assert!(idle.requests().is_empty(), "{mode:?}: the model was asked again");
        assert_eq!(first.requests().len(), 1);
    }
}
