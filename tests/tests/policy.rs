//! Approval policies: allow / ask / deny from the tool name and raw arguments, and no way
//! around them (`replay = false`, nested `ctx.tool()`, a resumed run).

use std::sync::{
    Arc,
    atomic::{AtomicUsize, Ordering},
};

use futures::StreamExt;
use kuralle::{
    AgentDef, Decision, Event, Message, Policy, RunRequest, RunStatus, RunStore, Runtime, Verdict, agent,
    stores::MemoryStore,
    testing::{ScriptedModel, Turn},
    tool,
};
use kuralle_tests::FnTool;
use serde_json::{Value, json};

/// "Ask for `wire` above 500, deny `delete_*`, allow the rest."
fn payments_policy() -> Policy {
    Policy::new()
        .ask_when("wire", |args| args["amount"].as_f64().is_some_and(|a| a > 500.0))
        .deny("delete_*", "deleting is not allowed")
}

fn counting(name: &str, count: &Arc<AtomicUsize>) -> FnTool {
    let c = count.clone();
    FnTool::new(name, move |args, _| {
        let c = c.clone();
        async move {
            c.fetch_add(1, Ordering::SeqCst);
            Ok(json!({"done": args}))
        }
    })
}

fn runtime(agent: AgentDef, model: ScriptedModel, store: Arc<dyn RunStore>) -> Runtime {
    Runtime::builder().agent(agent).model(model).store_arc(store).build().unwrap()
}

async fn events_of(mut handle: kuralle::RunHandle) -> (Vec<Event>, kuralle::RunOutput) {
    let mut events = Vec::new();
    while let Some(e) = handle.next().await {
        events.push(e);
    }
    (events, handle.await.unwrap())
}

/// The content of the tool message the model received for `call_id`, in its last request.
fn tool_message(model: &ScriptedModel, call_id: &str) -> Value {
    let last = model.requests().pop().expect("the model was asked");
    last.messages
        .to_vec()
        .into_iter()
        .find_map(|m| match m {
            Message::Tool { call_id: id, content, .. } if id == call_id => Some(content),
            _ => None,
        })
        .unwrap_or_else(|| panic!("no tool message for {call_id}"))
}

#[tokio::test]
async fn ask_pauses_durably_and_runs_once_approved() {
    let count = Arc::new(AtomicUsize::new(0));
    let model =
        ScriptedModel::by_transcript([Turn::tool_calls([("c1", "wire", r#"{"amount":900}"#)]), Turn::text("Wired.")]);
    let agent = AgentDef::new("pay", "x").tool(counting("wire", &count)).policy(payments_policy());
    let rt = runtime(agent, model, Arc::new(MemoryStore::new()));

    let (events, out) = events_of(rt.run(RunRequest::new("wire 900").run_id("r"))).await;
    assert_eq!(out.status, RunStatus::Paused);
    assert_eq!(count.load(Ordering::SeqCst), 0, "an asked call must not run before a decision");
    let pending = events
        .iter()
        .find_map(|e| match e {
            Event::Paused { pending, .. } => Some(pending.clone()),
            _ => None,
        })
        .expect("a paused event");
    assert_eq!(pending[0].name, "wire");
    assert_eq!(pending[0].args, json!({"amount": 900}));

    let out = rt.deliver("r", Decision::approve("alice")).await.unwrap();
    assert_eq!(out.status, RunStatus::Finished);
    assert_eq!(count.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn allow_runs_without_asking_when_the_predicate_is_false() {
    let count = Arc::new(AtomicUsize::new(0));
    let model =
        ScriptedModel::by_transcript([Turn::tool_calls([("c1", "wire", r#"{"amount":20}"#)]), Turn::text("Wired.")]);
    let agent = AgentDef::new("pay", "x").tool(counting("wire", &count)).policy(payments_policy());
    let rt = runtime(agent, model, Arc::new(MemoryStore::new()));
    let out = rt.run("wire 20").await.unwrap();
    assert_eq!(out.status, RunStatus::Finished);
    assert_eq!(count.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn deny_gives_the_model_the_denied_result_and_never_runs() {
    let count = Arc::new(AtomicUsize::new(0));
    let model = ScriptedModel::by_transcript([
        Turn::tool_calls([("c1", "delete_user", r#"{"id":7}"#)]),
        Turn::text("I can't do that."),
    ]);
    let seen = model.clone();
    let agent = AgentDef::new("pay", "x").tool(counting("delete_user", &count)).policy(payments_policy());
    let rt = runtime(agent, model, Arc::new(MemoryStore::new()));
    let out = rt.run("delete user 7").await.unwrap();
    assert_eq!(out.status, RunStatus::Finished);
    assert_eq!(count.load(Ordering::SeqCst), 0);
    let content = tool_message(&seen, "c1");
    assert_eq!(content["__denied"], true);
    assert_eq!(content["toolName"], "delete_user");
    assert_eq!(content["deniedBy"], "policy");
    assert!(content["message"].as_str().unwrap().contains("deleting is not allowed"), "{content}");
}

#[tokio::test]
async fn replay_false_does_not_bypass_ask_or_deny() {
    let count = Arc::new(AtomicUsize::new(0));
    let model = ScriptedModel::by_transcript([
        Turn::tool_calls([("c1", "delete_all", "{}"), ("c2", "wire", r#"{"amount":5000}"#)]),
        Turn::text("Done."),
    ]);
    let seen = model.clone();
    let agent = AgentDef::new("pay", "x")
        .tool(counting("wire", &count).no_replay())
        .tool(counting("delete_all", &count).no_replay())
        .policy(payments_policy());
    let rt = runtime(agent, model, Arc::new(MemoryStore::new()));
    let out = rt.run(RunRequest::new("go").run_id("r")).await.unwrap();
    assert_eq!(out.status, RunStatus::Paused, "a non-replayed call still waits for the policy's ask");
    assert_eq!(count.load(Ordering::SeqCst), 0);

    let out = rt.deliver("r", Decision::approve("alice")).await.unwrap();
    assert_eq!(out.status, RunStatus::Finished);
    assert_eq!(count.load(Ordering::SeqCst), 1, "only the approved wire ran; delete_all was denied");
    assert_eq!(tool_message(&seen, "c1")["deniedBy"], "policy");
    assert_eq!(tool_message(&seen, "c2")["done"], json!({"amount": 5000}));
}

#[tokio::test]
async fn a_nested_ctx_tool_call_cannot_bypass_the_policy() {
    let count = Arc::new(AtomicUsize::new(0));
    let outer = FnTool::new("outer", |_, ctx| async move {
        let asked = ctx.tool("wire", json!({"amount": 900})).await;
        let denied = ctx.tool("delete_user", json!({"id": 1})).await;
        let allowed = ctx.tool("wire", json!({"amount": 1})).await;
        Ok(json!({
            "asked": asked.map_err(|e| e.to_string()),
            "denied": denied.map_err(|e| e.to_string()),
            "allowed": allowed.map_err(|e| e.to_string()),
        }))
    });
    let model = ScriptedModel::by_transcript([Turn::tool_calls([("c1", "outer", "{}")]), Turn::text("ok")]);
    let seen = model.clone();
    let agent = AgentDef::new("pay", "x")
        .tool(outer)
        .tool(counting("wire", &count))
        .tool(counting("delete_user", &count))
        .policy(payments_policy());
    let rt = runtime(agent, model, Arc::new(MemoryStore::new()));
    assert_eq!(rt.run("go").await.unwrap().status, RunStatus::Finished);

    let result = tool_message(&seen, "c1");
    let asked = result["asked"]["Err"].as_str().expect("the asked nested call is refused");
    assert!(asked.contains("denied"), "{asked}");
    let denied = result["denied"]["Err"].as_str().expect("the denied nested call is refused");
    assert!(denied.contains("denied by policy"), "{denied}");
    assert_eq!(result["allowed"]["Ok"]["done"], json!({"amount": 1}));
    assert_eq!(count.load(Ordering::SeqCst), 1, "only the allowed nested call ran");
}

#[tokio::test]
async fn a_resumed_run_is_checked_again_and_cannot_bypass_the_policy() {
    let store: Arc<dyn RunStore> = Arc::new(MemoryStore::new());
    let count = Arc::new(AtomicUsize::new(0));
    let script = || {
        ScriptedModel::by_transcript([Turn::tool_calls([("c1", "wire", r#"{"amount":900}"#)]), Turn::text("Wired.")])
    };
    let agent = || AgentDef::new("pay", "x").tool(counting("wire", &count)).policy(payments_policy());
    let first = runtime(agent(), script(), store.clone());
    assert_eq!(first.run(RunRequest::new("wire").run_id("r")).await.unwrap().status, RunStatus::Paused);

    // Another process resumes the run without a decision: it is still waiting.
    let second = runtime(agent(), script(), store.clone());
    assert_eq!(second.resume("r").await.unwrap().status, RunStatus::Paused);
    assert_eq!(count.load(Ordering::SeqCst), 0);

    // A process whose policy now denies the tool: resuming gives the denial, never the call.
    let strict =
        AgentDef::new("pay", "x").tool(counting("wire", &count)).policy(Policy::new().deny("wire", "wires are frozen"));
    let third = runtime(strict, script(), store.clone());
    let out = third.resume("r").await.unwrap();
    assert_eq!(out.status, RunStatus::Finished);
    assert_eq!(count.load(Ordering::SeqCst), 0);
}

#[tokio::test]
async fn policies_compose_and_fail_closed() {
    let team = Policy::new().ask("refund*");
    let strict = Policy::new().deny("refund_all", "too broad").otherwise(Verdict::Allow);
    let both = team.and(strict);
    assert_eq!(both.check("refund_one", &json!({})), Verdict::Ask);
    assert_eq!(both.check("refund_all", &json!({})), Verdict::deny("too broad"));
    assert_eq!(both.check("lookup", &json!({})), Verdict::Allow);

    let broken = Policy::from_fn(|_, args| if args["x"].as_u64().unwrap() > 1 { Verdict::Allow } else { Verdict::Ask });
    assert!(matches!(broken.check("t", &json!({})), Verdict::Deny { .. }), "a panicking policy denies");
}

/// Send money.
#[tool]
async fn wire(amount: f64) -> String {
    format!("sent {amount}")
}

/// You move money.
#[agent(id = "payments", tools = [Wire], policy = payments_policy())]
struct Payments;

#[tokio::test]
async fn the_agent_attribute_sets_the_policy() {
    let model =
        ScriptedModel::by_transcript([Turn::tool_calls([("c1", "wire", r#"{"amount":900}"#)]), Turn::text("Wired.")]);
    let rt = Runtime::builder().agent(Payments).model(model).build().unwrap();
    let out = rt.run(RunRequest::new("wire 900").run_id("r")).await.unwrap();
    assert_eq!(out.status, RunStatus::Paused);
    let denied = rt.deliver("r", Decision::deny("bob", "no")).await.unwrap();
    assert_eq!(denied.status, RunStatus::Finished);
}

/// The MCP path: an agent served over MCP holds every MCP client to the agent's policy (issue
/// 24, item 3). Before, `McpServer::for_agent` dropped the policy and a denied or asked-about
/// call ran for any client.
#[tokio::test]
async fn an_mcp_client_cannot_bypass_the_agents_policy() {
    use kuralle::mcp::{McpClient, McpServer};

    let wires = Arc::new(AtomicUsize::new(0));
    let deletes = Arc::new(AtomicUsize::new(0));
    let agent = AgentDef::new("payments", "x")
        .tool(counting("wire", &wires))
        .tool(counting("delete_user", &deletes))
        .policy(payments_policy());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/mcp", listener.local_addr().unwrap());
    tokio::spawn(McpServer::for_agent(&agent).serve_http(listener, std::future::pending()));
    let client = McpClient::http(url).await.unwrap();
    let tools = client.tools().await.unwrap();
    let call = |name: &'static str, args: Value| {
        let tool = tools.iter().find(|t| kuralle::Tool::name(*t) == name).unwrap().clone();
        async move { kuralle::Tool::call(&tool, args, kuralle::ToolContext::detached()).await }
    };

    let denied = call("delete_user", json!({"id": 1})).await;
    assert!(denied.is_err(), "{denied:?}");
    assert!(format!("{denied:?}").contains("deleting is not allowed"), "{denied:?}");
    assert_eq!(deletes.load(Ordering::SeqCst), 0, "a denied call never runs");

    let asked = call("wire", json!({"amount": 900})).await;
    assert!(asked.is_err(), "a call the policy asks about cannot wait for a human over MCP: {asked:?}");
    assert_eq!(wires.load(Ordering::SeqCst), 0);

    let allowed = call("wire", json!({"amount": 5})).await;
    assert!(allowed.is_ok(), "{allowed:?}");
    assert_eq!(wires.load(Ordering::SeqCst), 1);
}
