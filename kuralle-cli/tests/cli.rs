//! `kuralle runs ...` against a real SQLite store written by a real runtime.

mod common;

use std::sync::atomic::Ordering;

use common::{FINISHED, PAUSED, WIRES, kuralle, owner, payments, seed, store_arg};
use kuralle::{RunStatus, RunStore};
use serde_json::Value;

fn ok_json(args: &[&str]) -> Value {
    let out = kuralle(args);
    assert!(out.status.success(), "{args:?} failed: {}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).unwrap()
}

fn ok_text(args: &[&str]) -> String {
    let out = kuralle(args);
    assert!(out.status.success(), "{args:?} failed: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout).unwrap()
}

fn fails(args: &[&str]) -> String {
    let out = kuralle(args);
    assert!(!out.status.success(), "{args:?} should fail");
    String::from_utf8(out.stderr).unwrap()
}

fn ids(list: &Value) -> Vec<&str> {
    list.as_array().unwrap().iter().map(|r| r["run_id"].as_str().unwrap()).collect()
}

#[tokio::test]
async fn list_filters_by_status_agent_and_limit() {
    let dir = tempfile::tempdir().unwrap();
    let db = seed(dir.path()).await;
    let store = store_arg(&db);

    let all = ok_json(&["runs", "list", "--store", &store, "--json"]);
    let mut every = ids(&all);
    every.sort_unstable();
    assert_eq!(every, [FINISHED, PAUSED]);
    let paused = all.as_array().unwrap().iter().find(|r| r["run_id"] == PAUSED).unwrap();
    assert_eq!(paused["agent_id"], "payments");
    assert_eq!(paused["status"], "paused");
    assert_eq!(paused["pending_approvals"], 1);
    assert_eq!(paused["steps"], 3, "model, lookup, model: {paused}");

    assert_eq!(ids(&ok_json(&["runs", "list", "--store", &store, "--status", "paused", "--json"])), [PAUSED]);
    assert_eq!(ids(&ok_json(&["runs", "list", "--store", &store, "--agent", "support", "--json"])), [FINISHED]);
    assert_eq!(ok_json(&["runs", "list", "--store", &store, "--limit", "1", "--json"]).as_array().unwrap().len(), 1);
    // Global flags go before or after the command.
    assert_eq!(ids(&ok_json(&["--store", &store, "--json", "runs", "list", "--status", "paused"])), [PAUSED]);
    assert!(ids(&ok_json(&["runs", "list", "--store", &store, "--status", "failed", "--json"])).is_empty());

    let table = ok_text(&["runs", "list", "--store", &store]);
    assert!(table.starts_with("RUN"), "{table}");
    for column in ["AGENT", "STATUS", "STEPS", "UPDATED", "PENDING", PAUSED, "payments", "paused"] {
        assert!(table.contains(column), "`{column}` missing from:\n{table}");
    }
    assert!(!table.contains('\x1b'), "no colour when stdout is not a terminal:\n{table}");
}

#[tokio::test]
async fn show_lists_steps_with_args_results_and_pending_requests() {
    let dir = tempfile::tempdir().unwrap();
    let db = seed(dir.path()).await;
    let store = store_arg(&db);

    let run = ok_json(&["runs", "show", PAUSED, "--store", &store, "--json"]);
    assert_eq!(run["run_id"], PAUSED);
    assert_eq!(run["status"], "paused");
    let steps = run["steps"].as_array().unwrap();
    let kinds: Vec<&str> = steps.iter().map(|s| s["kind"].as_str().unwrap()).collect();
    assert_eq!(kinds, ["model", "tool", "model"]);
    let lookup = &steps[1];
    assert_eq!(lookup["ordinal"], 1);
    assert_eq!(lookup["name"], "lookup");
    assert_eq!(lookup["status"], "finished");
    assert_eq!(lookup["call_id"], "call_lookup");
    assert_eq!(lookup["args"], serde_json::json!({"order": "A-17"}));
    assert_eq!(lookup["result"], "A-17: delivered");
    assert!(lookup["duration_ms"].is_number());
    assert_eq!(lookup["key"].as_str().unwrap().len(), 64);
    let pending = run["pending"].as_array().unwrap();
    assert_eq!(pending.len(), 1);
    assert_eq!(pending[0]["name"], "wire");
    assert!(pending[0]["request_id"].as_str().unwrap().starts_with("approval-"));

    let text = ok_text(&["runs", "show", PAUSED, "--store", &store]);
    let request = pending[0]["request_id"].as_str().unwrap();
    for expected in
        ["KIND", "DURATION", "KEY", "lookup", r#"{"order":"A-17"}"#, "\"A-17: delivered\"", "calls wire", request]
    {
        assert!(text.contains(expected), "`{expected}` missing from:\n{text}");
    }
    assert!(!text.contains('\x1b'));
}

#[tokio::test]
async fn approve_records_the_decision_and_the_owner_resumes_the_run() {
    let dir = tempfile::tempdir().unwrap();
    let db = seed(dir.path()).await;
    let store = store_arg(&db);
    let run = ok_json(&["runs", "show", PAUSED, "--store", &store, "--json"]);
    let request = run["pending"][0]["request_id"].as_str().unwrap().to_owned();

    let decided = ok_json(&["runs", "approve", PAUSED, &request, "--by", "alice", "--store", &store, "--json"]);
    assert_eq!(decided["decision"], "approved");
    assert_eq!(decided["by"], "alice");

    let run = ok_json(&["runs", "show", PAUSED, "--store", &store, "--json"]);
    let approval = run["steps"].as_array().unwrap().iter().find(|s| s["kind"] == "approval").expect("approval step");
    assert_eq!(approval["result"]["approved"], true);
    assert_eq!(approval["result"]["by"], "alice");
    assert_eq!(approval["args"], serde_json::json!({"amount": 900}));
    // Audited: the channel, the local user, and the store's time.
    let audit = &run["decisions"][0];
    assert_eq!((audit["by"].as_str(), audit["channel"].as_str()), (Some("alice"), Some("cli")));
    assert!(audit["origin"].as_str().unwrap().starts_with("local user "), "{audit}");
    assert_eq!(audit["clock"], "store");
    assert!(audit["at_ms"].as_i64().unwrap() > 0);
    assert_eq!(run["status"], "running", "decided: runnable, for the owner or a worker to resume");
    assert_eq!(run["pending"][0]["decision"]["approved"], true);
    let listed = ok_json(&["runs", "list", "--store", &store, "--json"]);
    let row = listed.as_array().unwrap().iter().find(|r| r["run_id"] == PAUSED).unwrap();
    assert_eq!(row["pending_approvals"], 0, "a decided request no longer counts as pending");

    // A second decision on the same request is refused, and the first one stands.
    let err = fails(&["runs", "deny", PAUSED, &request, "--by", "bob", "--reason", "late", "--store", &store]);
    assert!(err.contains("already decided (approved by alice)"), "{err}");
    let again = ok_json(&["runs", "show", PAUSED, "--store", &store, "--json"]);
    assert_eq!(again["steps"].as_array().unwrap().len(), run["steps"].as_array().unwrap().len());

    // The process that owns the agent picks the decision up: the wire runs, once.
    let before = WIRES.load(Ordering::SeqCst);
    let out = owner(&db).resume(PAUSED).await.unwrap();
    assert_eq!(out.status, RunStatus::Finished);
    assert_eq!(WIRES.load(Ordering::SeqCst), before + 1);
    let text = ok_text(&["runs", "show", PAUSED, "--store", &store]);
    assert!(text.contains("approved by alice"), "{text}");
    let err = fails(&["runs", "approve", PAUSED, &request, "--by", "alice", "--store", &store]);
    assert!(err.contains("was already decided"), "{err}");
}

#[tokio::test]
async fn deny_records_the_reason() {
    let dir = tempfile::tempdir().unwrap();
    let db = seed(dir.path()).await;
    let store = store_arg(&db);
    let run = ok_json(&["runs", "show", PAUSED, "--store", &store, "--json"]);
    let request = run["pending"][0]["request_id"].as_str().unwrap().to_owned();
    let text =
        ok_text(&["runs", "deny", PAUSED, &request, "--by", "bob", "--reason", "over the limit", "--store", &store]);
    assert!(text.contains("denied"), "{text}");
    let run = ok_json(&["runs", "show", PAUSED, "--store", &store, "--json"]);
    let approval = run["steps"].as_array().unwrap().iter().find(|s| s["kind"] == "approval").unwrap();
    assert_eq!(approval["result"]["approved"], false);
    assert_eq!(approval["result"]["reason"], "over the limit");
}

#[tokio::test]
async fn errors_are_clear() {
    let dir = tempfile::tempdir().unwrap();
    let db = seed(dir.path()).await;
    let store = store_arg(&db);

    let missing = dir.path().join("nope.db");
    let err = fails(&["runs", "list", "--store", &format!("sqlite:{}", missing.display())]);
    assert!(err.contains("no store at") && err.contains("nope.db"), "{err}");
    assert!(!missing.exists(), "the CLI must not create a store");

    let err = fails(&["runs", "list"]);
    assert!(err.contains("no store given"), "{err}");

    let err = fails(&["runs", "list", "--store", "mysql://x"]);
    assert!(err.contains("expected `sqlite:PATH` or `postgres://...`"), "{err}");

    let err = fails(&["runs", "show", "no-such-run", "--store", &store]);
    assert!(err.contains("no run `no-such-run`"), "{err}");

    let err = fails(&["runs", "approve", "no-such-run", "approval-x", "--by", "a", "--store", &store]);
    assert!(err.contains("no run `no-such-run`"), "{err}");

    let err = fails(&["runs", "approve", FINISHED, "approval-x", "--by", "a", "--store", &store]);
    assert!(err.contains("has no pending approval `approval-x`") && err.contains("waiting on nothing"), "{err}");

    let err = fails(&["runs", "approve", PAUSED, "approval-x", "--by", "a", "--store", &store]);
    assert!(err.contains("it waits on: approval-"), "{err}");

    let err = fails(&["runs", "deny", PAUSED, "approval-x", "--by", "a", "--store", &store]);
    assert!(err.contains("--reason"), "clap names the missing flag: {err}");

    // While the agent's process owns the run, a decision waits for it to let go.
    let run = ok_json(&["runs", "show", PAUSED, "--store", &store, "--json"]);
    let request = run["pending"][0]["request_id"].as_str().unwrap().to_owned();
    let sqlite = kuralle::stores::SqliteStore::open(&db).unwrap();
    let lease = sqlite.acquire_lease(PAUSED, "agent-process-1", std::time::Duration::from_secs(600)).await.unwrap();
    let err = fails(&["runs", "approve", PAUSED, &request, "--by", "a", "--store", &store]);
    assert!(err.contains("is busy") && err.contains("agent-process-1"), "{err}");
    sqlite.release_lease(&lease).await.unwrap();
    ok_json(&["runs", "approve", PAUSED, &request, "--by", "a", "--store", &store, "--json"]);
}

#[tokio::test]
async fn colour_only_on_a_terminal_and_never_with_no_color() {
    // `script` (util-linux) gives the command a pseudo-terminal as stdout.
    if !std::path::Path::new("/usr/bin/script").exists() {
        eprintln!("SKIPPED colour test: /usr/bin/script is absent");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let db = seed(dir.path()).await;
    let command = format!("{} runs list --store {}", env!("CARGO_BIN_EXE_kuralle"), store_arg(&db));
    let on_tty = |no_color: bool| {
        let mut cmd = std::process::Command::new("/usr/bin/script");
        cmd.args(["-qec", &command, "/dev/null"]).env_remove("KURALLE_STORE");
        if no_color {
            cmd.env("NO_COLOR", "1")
        } else {
            cmd.env_remove("NO_COLOR")
        };
        let out = cmd.output().unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8(out.stdout).unwrap()
    };
    let coloured = on_tty(false);
    assert!(coloured.contains("\x1b[33mpaused"), "paused runs are yellow on a terminal: {coloured:?}");
    assert!(!on_tty(true).contains('\x1b'), "NO_COLOR turns colour off");
}

#[tokio::test]
async fn show_gives_tokens_per_model_step_and_for_the_run() {
    let dir = tempfile::tempdir().unwrap();
    let db = seed(dir.path()).await;
    let store = store_arg(&db);

    let run = ok_json(&["runs", "show", PAUSED, "--store", &store, "--json"]);
    let steps = run["steps"].as_array().unwrap();
    let mut sum = (0, 0);
    for step in steps {
        if step["kind"] == "model" {
            let (i, o) =
                (step["usage"]["input_tokens"].as_u64().unwrap(), step["usage"]["output_tokens"].as_u64().unwrap());
            assert!(i > 0 && o > 0, "{step}");
            sum = (sum.0 + i, sum.1 + o);
        } else {
            assert!(step["usage"].is_null(), "{step}");
        }
    }
    assert_eq!((run["usage"]["input_tokens"].as_u64().unwrap(), run["usage"]["output_tokens"].as_u64().unwrap()), sum);

    let text = ok_text(&["runs", "show", PAUSED, "--store", &store]);
    let line = format!("tokens   {} in, {} out", sum.0, sum.1);
    assert!(text.contains(&line), "`{line}` missing from:\n{text}");
    assert!(text.contains("TOKENS IN/OUT"), "{text}");
}

#[tokio::test]
async fn export_writes_a_run_that_replays_as_a_test() {
    use kuralle::{Runtime, export::RunExport, testing::Replay};

    let dir = tempfile::tempdir().unwrap();
    let db = seed(dir.path()).await;
    let store = store_arg(&db);
    let file = dir.path().join("incident.json");
    let file_arg = file.to_str().unwrap();

    let said = ok_text(&["runs", "export", PAUSED, "-o", file_arg, "--store", &store]);
    assert!(said.contains("written to"), "{said}");
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        assert_eq!(std::fs::metadata(&file).unwrap().permissions().mode() & 0o777, 0o600);
    }
    // An existing file is never replaced.
    let err = fails(&["runs", "export", PAUSED, "-o", file_arg, "--store", &store]);
    assert!(err.contains("cannot write") && err.contains("exists"), "{err}");
    assert!(fails(&["runs", "export", "nope", "--store", &store]).contains("no run `nope`"));
    // Without -o it goes to standard output, the same document.
    let printed = ok_json(&["runs", "export", PAUSED, "--store", &store]);
    assert_eq!(printed["format"], "kuralle.run-export");
    assert_eq!(printed["run"]["run_id"], PAUSED);

    // The file is a test: the same agent, answered by the recording, pauses at the same call.
    let export = RunExport::from_json(&std::fs::read_to_string(&file).unwrap()).unwrap();
    let replay = Replay::from_export(&export).unwrap();
    let runtime = Runtime::builder().agent(payments()).model(replay.clone()).build().unwrap();
    let out = runtime.run(replay.inputs()[0].as_str()).await.unwrap();
    assert_eq!(out.status, RunStatus::Paused);
    assert_eq!(replay.played(), 2);
    replay.check().unwrap();
}

/// Find something.
#[kuralle::tool(parallel_safe)]
async fn find(what: String) -> String {
    format!("found {what}")
}

#[tokio::test]
async fn a_run_stopped_by_a_limit_shows_its_status_and_priced_cost() {
    use kuralle::{
        AgentDef, Pricing, RunLimits, RunRequest, Runtime,
        stores::SqliteStore,
        testing::{ScriptedModel, Turn},
    };
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("runs.db");
    // One tool call allowed; the model asks for two at once, so the batch never starts.
    let capped = Runtime::builder()
        .agent(AgentDef::new("capped", "Look things up.").tool(Find).limits(RunLimits::new().max_tool_calls(1)))
        .model(ScriptedModel::new([Turn::tool_calls([
            ("c1", "find", r#"{"what":"a"}"#),
            ("c2", "find", r#"{"what":"b"}"#),
        ])]))
        .pricing("scripted", Pricing::new(3.0, 15.0))
        .store(SqliteStore::open(&db).unwrap())
        .build()
        .unwrap();
    let stopped = capped.run(RunRequest::new("look up two things").run_id("capped-1")).await;
    assert!(matches!(stopped, Err(kuralle::RunError::LimitExceeded { .. })), "{stopped:?}");
    // An unpriced run in the same store: no cost to show.
    let chat = Runtime::builder()
        .agent(AgentDef::new("support", "Chat."))
        .model(ScriptedModel::new([Turn::text("Hello!")]))
        .store(SqliteStore::open(&db).unwrap())
        .build()
        .unwrap();
    chat.run(RunRequest::new("hi").run_id("chat-1")).await.unwrap();
    let store = store_arg(&db);

    let list = ok_json(&["runs", "list", "--store", &store, "--status", "limit_exceeded", "--json"]);
    assert_eq!(ids(&list), ["capped-1"]);

    let run = ok_json(&["runs", "show", "capped-1", "--store", &store, "--json"]);
    assert_eq!(run["status"], "limit_exceeded");
    let step_cost: f64 = run["steps"].as_array().unwrap().iter().filter_map(|s| s["cost_usd"].as_f64()).sum();
    let cost = run["cost_usd"].as_f64().unwrap();
    assert!(cost > 0.0 && (cost - step_cost).abs() < 1e-12, "{run}");
    let usage = &run["usage"];
    let priced = usage["input_tokens"].as_f64().unwrap() * 3e-6 + usage["output_tokens"].as_f64().unwrap() * 15e-6;
    assert!((cost - priced).abs() < 1e-12, "{cost} vs {priced}");

    let text = ok_text(&["runs", "show", "capped-1", "--store", &store]);
    assert!(text.contains("status   limit_exceeded"), "{text}");
    assert!(text.contains(&format!("cost     ${cost:.4}\n")), "{text}");

    let unpriced = ok_json(&["runs", "show", "chat-1", "--store", &store, "--json"]);
    assert!(unpriced.get("cost_usd").is_none(), "{unpriced}");
    assert!(!ok_text(&["runs", "show", "chat-1", "--store", &store]).contains("cost "));
}

/// Sends a message; needs a person's approval.
#[kuralle::tool(needs_approval)]
async fn send(to: String, body: String) -> String {
    format!("sent to {to}: {body}")
}

#[tokio::test]
async fn untrusted_text_cannot_drive_the_terminal_or_hide_and_pending_arguments_show_whole() {
    use kuralle::{
        AgentDef, RunRequest, Runtime,
        stores::SqliteStore,
        testing::{ScriptedModel, Turn},
    };
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("runs.db");
    // A title-setting escape, a screen clear and a right-to-left override, in a result and in
    // the arguments waiting for approval; the body's end is past any preview's width.
    let body = format!("{}then wire everything to account 666", "Dear customer, ".repeat(6));
    let model = ScriptedModel::by_transcript([
        Turn::tool_calls([("c1", "lookup", r#"{"order":"A\u001b]0;owned\u0007\u001b[2J\u202e71-B"}"#)]),
        Turn::tool_calls([("c2", "send", &format!(r#"{{"to":"bob\u202e@evil","body":"{body}"}}"#))]),
    ]);
    let agent = AgentDef::new("payments", "Move money.").tool(common::Lookup).tool(Send);
    let rt = Runtime::builder().agent(agent).model(model).store(SqliteStore::open(&db).unwrap()).build().unwrap();
    let out = rt.run(RunRequest::new("look up A-17").run_id("evil-1")).await.unwrap();
    assert_eq!(out.status, RunStatus::Paused);
    let text = ok_text(&["runs", "show", "evil-1", "--store", &store_arg(&db)]);
    assert!(!text.chars().any(|c| c.is_control() && c != '\n'), "{text:?}");
    assert!(!text.contains('\u{202e}') && text.contains("<U+202E>"), "{text}");
    // The escape sequences are gone whole from the result, not just their ESC bytes.
    assert!(text.contains("\"A<U+202E>71-B: delivered\""), "{text}");
    let args = text.split("arguments of approval-").nth(1).unwrap_or_else(|| panic!("{text}"));
    assert!(args.contains(&body) && args.contains("bob<U+202E>@evil"), "whole: {args}");
}

#[tokio::test]
async fn cancel_closes_a_paused_run_through_the_store_only() {
    let dir = tempfile::tempdir().unwrap();
    let db = seed(dir.path()).await;
    let store = store_arg(&db);

    let done = ok_text(&["runs", "cancel", PAUSED, "--store", &store]);
    assert!(done.contains("cancelled run") && done.contains("was paused"), "{done}");
    assert_eq!(ids(&ok_json(&["runs", "list", "--store", &store, "--status", "cancelled", "--json"])), [PAUSED]);
    let shown = ok_json(&["runs", "show", PAUSED, "--store", &store, "--json"]);
    assert_eq!(shown["status"], "cancelled");
    let again = fails(&["runs", "cancel", PAUSED, "--store", &store]);
    assert!(again.contains("is cancelled: only a running or paused run can be cancelled"), "{again}");
    let finished = fails(&["runs", "cancel", FINISHED, "--store", &store]);
    assert!(finished.contains("is finished"), "{finished}");
    assert!(fails(&["runs", "cancel", "nope", "--store", &store]).contains("no run `nope`"));
    // The owner, back, does not run the cancelled run's pending call.
    let runtime = owner(&db);
    let out = runtime.resume(PAUSED).await.unwrap();
    assert_eq!(out.status, RunStatus::Cancelled);
    let steps = runtime.store().steps(PAUSED).await.unwrap();
    assert!(steps.iter().all(|s| s.name != "wire" || s.status != kuralle::StepStatus::Finished));
}

#[tokio::test]
async fn retry_and_fork_through_the_store_only() {
    let dir = tempfile::tempdir().unwrap();
    let db = seed(dir.path()).await;
    let store = store_arg(&db);

    // A journal limit too small for the turn fails it.
    let tight = kuralle::Runtime::builder()
        .agent(payments())
        .model(kuralle::testing::ScriptedModel::by_transcript([
            kuralle::testing::Turn::tool_calls([("call_lookup", "lookup", r#"{"order":"A-17"}"#)]),
            kuralle::testing::Turn::tool_calls([("call_lookup2", "lookup", r#"{"order":"A-18"}"#)]),
            kuralle::testing::Turn::text("Both delivered."),
        ]))
        .store(kuralle::stores::SqliteStore::open(&db).unwrap())
        .max_journal_entries(2)
        .build()
        .unwrap();
    assert!(tight.run(kuralle::RunRequest::new("look up both").run_id("look-1")).await.is_err());
    assert_eq!(ok_json(&["runs", "show", "look-1", "--store", &store, "--json"])["status"], "failed");

    let done = ok_text(&["runs", "retry", "look-1", "--store", &store]);
    assert!(done.contains("runnable again"), "{done}");
    assert_eq!(ids(&ok_json(&["runs", "list", "--store", &store, "--status", "running", "--json"])), ["look-1"]);
    let refused = fails(&["runs", "retry", FINISHED, "--store", &store]);
    assert!(refused.contains("is finished: retry applies only to failed runs"), "{refused}");

    // A fork of the finished chat before its answer, with other instructions.
    let forked = ok_json(&[
        "runs",
        "fork",
        FINISHED,
        "--at",
        "0",
        "--new-id",
        "chat-2",
        "--instructions",
        "Be terse.",
        "--store",
        &store,
        "--json",
    ]);
    assert_eq!(forked["run_id"], "chat-2");
    let model = kuralle::testing::ScriptedModel::new([kuralle::testing::Turn::text("Hi.")]);
    let support = kuralle::Runtime::builder()
        .agent(kuralle::AgentDef::new("support", "Chat."))
        .model(model.clone())
        .store(kuralle::stores::SqliteStore::open(&db).unwrap())
        .build()
        .unwrap();
    let out = support.resume("chat-2").await.unwrap();
    assert_eq!((out.status, out.text.as_str()), (RunStatus::Finished, "Hi."));
    assert_eq!(&*model.requests()[0].system, "Be terse.");
    let far = fails(&["runs", "fork", PAUSED, "--at", "9", "--store", &store]);
    assert!(far.contains("cannot fork it at step 9"), "{far}");
}

#[tokio::test]
async fn list_searches_by_id_prefix_and_pages() {
    let dir = tempfile::tempdir().unwrap();
    let db = seed(dir.path()).await;
    let store = store_arg(&db);

    assert_eq!(ids(&ok_json(&["runs", "list", "--store", &store, "--prefix", "pay-", "--json"])), [PAUSED]);
    assert!(ids(&ok_json(&["runs", "list", "--store", &store, "--prefix", "zzz", "--json"])).is_empty());
    let first = ids(&ok_json(&["runs", "list", "--store", &store, "--limit", "1", "--json"]))[0].to_owned();
    let second = ok_json(&["runs", "list", "--store", &store, "--limit", "1", "--offset", "1", "--json"]);
    assert_eq!(ids(&second).len(), 1);
    assert_ne!(ids(&second)[0], first, "the second page starts after the first");
    assert!(ids(&ok_json(&["runs", "list", "--store", &store, "--offset", "2", "--json"])).is_empty());
}

#[tokio::test]
async fn show_prints_the_conversation() {
    let dir = tempfile::tempdir().unwrap();
    let db = seed(dir.path()).await;
    let store = store_arg(&db);
    let run = ok_json(&["runs", "show", FINISHED, "--store", &store, "--json"]);
    let said: Vec<(&str, &str)> = run["conversation"]
        .as_array()
        .unwrap()
        .iter()
        .map(|u| (u["role"].as_str().unwrap(), u["text"].as_str().unwrap()))
        .collect();
    assert_eq!(said, [("user", "hi"), ("assistant", "Hello!")]);
    let paused = ok_json(&["runs", "show", PAUSED, "--store", &store, "--json"]);
    assert_eq!(paused["conversation"][0]["text"], "wire 900 for A-17", "the open turn's input");
    let text = ok_text(&["runs", "show", FINISHED, "--store", &store]);
    assert!(text.contains("user:      hi") && text.contains("assistant: Hello!"), "{text}");
}
