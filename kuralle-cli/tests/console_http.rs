//! The console over plain HTTP: what it refuses (unknown hosts, unauthenticated callers,
//! cross-site posts, forms without the session's anti-forgery token, a denial without a
//! reason, unknown runs and requests), the headers every response carries, and that a decision
//! is recorded under the authenticated name, whatever the form says.

mod common;

use common::{FINISHED, PAUSED, console, console_with, kuralle, seed, store_arg};
use kuralle::{RunStore, StepKind, stores::SqliteStore};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// An HTTP response: status, headers (lower-cased names), body.
struct Reply {
    status: u16,
    headers: Vec<(String, String)>,
    body: String,
}

impl Reply {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers.iter().find(|(k, _)| k == name).map(|(_, v)| v.as_str())
    }

    /// The session cookie set, as `name=value` for a `Cookie` header.
    fn cookie(&self) -> String {
        let set = self.header("set-cookie").unwrap_or_else(|| panic!("no Set-Cookie in {:?}", self.headers));
        set.split(';').next().unwrap().to_owned()
    }

    /// The value of the first hidden form field `name`.
    fn field(&self, name: &str) -> String {
        let marker = format!("name=\"{name}\" value=\"");
        self.body
            .split(&marker)
            .nth(1)
            .unwrap_or_else(|| panic!("no {name} in {}", self.body))
            .split('"')
            .next()
            .unwrap()
            .to_owned()
    }
}

/// Sends one HTTP/1.1 request.
async fn http(base: &str, request_line: &str, headers: &[(&str, &str)], body: &str) -> Reply {
    let addr = base.trim_start_matches("http://");
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    let mut req = format!("{request_line} HTTP/1.1\r\nConnection: close\r\nContent-Length: {}\r\n", body.len());
    if !headers.iter().any(|(k, _)| k.eq_ignore_ascii_case("host")) {
        req.push_str(&format!("Host: {addr}\r\n"));
    }
    for (k, v) in headers {
        req.push_str(&format!("{k}: {v}\r\n"));
    }
    req.push_str("\r\n");
    req.push_str(body);
    stream.write_all(req.as_bytes()).await.unwrap();
    let mut raw = String::new();
    stream.read_to_string(&mut raw).await.unwrap();
    let (head, body) = raw.split_once("\r\n\r\n").unwrap_or((&raw, ""));
    let mut lines = head.lines();
    let status = lines.next().and_then(|l| l.split(' ').nth(1)).and_then(|s| s.parse().ok()).unwrap_or(0);
    let headers = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_owned()))
        .collect();
    Reply { status, headers, body: body.to_owned() }
}

const FORM: (&str, &str) = ("Content-Type", "application/x-www-form-urlencoded");

/// Every response forbids framing and sniffing.
fn assert_hardened(r: &Reply) {
    let csp = r.header("content-security-policy").unwrap_or_default();
    assert!(csp.contains("frame-ancestors 'none'") && csp.contains("default-src 'none'"), "{csp}");
    assert_eq!(r.header("x-frame-options"), Some("DENY"));
    assert_eq!(r.header("x-content-type-options"), Some("nosniff"));
}

#[tokio::test]
async fn on_loopback_the_console_refuses_what_it_must_and_serves_the_rest() {
    let dir = tempfile::tempdir().unwrap();
    let db = seed(dir.path()).await;
    let (_console, base) = console(&db);

    let r = http(&base, "GET /?status=paused", &[], "").await;
    assert_eq!(r.status, 200);
    assert_hardened(&r);
    assert!(r.body.contains(PAUSED) && !r.body.contains(FINISHED), "the status filter applies");
    let r = http(&base, "GET /?agent=support", &[], "").await;
    assert_eq!(r.status, 200);
    assert!(r.body.contains(FINISHED) && !r.body.contains(&format!(">{PAUSED}<")));
    assert_eq!(http(&base, "GET /?status=bogus", &[], "").await.status, 400);
    let missing = http(&base, "GET /runs/nope", &[], "").await;
    assert_eq!(missing.status, 404);
    assert_hardened(&missing);

    // DNS rebinding: a page served as evil.example that resolves to 127.0.0.1.
    let r = http(&base, "GET /", &[("Host", "evil.example:7878")], "").await;
    assert_eq!(r.status, 421);
    assert_hardened(&r);

    // Operator text never comes from the query string.
    let page = http(&base, &format!("GET /runs/{PAUSED}?notice=Call+support&done=%3Cb%3E"), &[], "").await;
    assert!(!page.body.contains("Call support") && !page.body.contains("<b>"));
    assert!(!page.body.contains("id=\"notice\""));

    // Without authentication on loopback, the operator decides; the session carries the form token.
    let cookie = page.cookie();
    assert!(page.header("set-cookie").unwrap().contains("HttpOnly; SameSite=Strict"));
    assert!(page.body.contains("signed in as <strong>console-test</strong>"), "{}", page.body);
    assert!(!page.body.contains("name=\"by\""), "no free-text decider");
    let run_tokens = page.body.split("<dd id=\"tokens\">").nth(1).unwrap().split('<').next().unwrap();
    assert!(run_tokens.contains(" in, ") && run_tokens.ends_with(" out"), "{run_tokens}");
    assert_eq!(page.body.matches("<td class=\"tokens\">").count(), 3, "one cell per step");
    assert_eq!(page.body.matches("<td class=\"tokens\"></td>").count(), 1, "the tool step has none");
    let request = page.field("request_id");
    let csrf = page.field("csrf");
    let decide = format!("POST /runs/{PAUSED}/decide");
    let approve = format!("request_id={request}&decision=approve&by=mallory&csrf={csrf}");
    let with_session = [FORM, ("Cookie", cookie.as_str())];

    // Cross-site form posts are refused and record nothing.
    let origin = [FORM, ("Cookie", &cookie), ("Origin", "http://evil.example")];
    assert_eq!(http(&base, &decide, &origin, &approve).await.status, 403);
    let fetch_site = [FORM, ("Cookie", &cookie), ("Sec-Fetch-Site", "cross-site")];
    assert_eq!(http(&base, &decide, &fetch_site, &approve).await.status, 403);
    // A form without the session's token, or with another session's, is refused.
    let forged = format!("request_id={request}&decision=approve");
    assert_eq!(http(&base, &decide, &with_session, &forged).await.status, 403);
    let other = http(&base, "GET /", &[], "").await.cookie();
    assert_eq!(http(&base, &decide, &[FORM, ("Cookie", &other)], &approve).await.status, 403);
    // A denial needs a reason; an unknown request or run is named.
    let no_reason = format!("request_id={request}&decision=deny&reason=+&csrf={csrf}");
    assert_eq!(http(&base, &decide, &with_session, &no_reason).await.status, 400);
    let r = http(&base, &decide, &with_session, &format!("request_id=approval-x&decision=approve&csrf={csrf}")).await;
    assert_eq!(r.status, 409);
    assert!(r.body.contains("has no pending approval"), "{}", r.body);
    let nope = "POST /runs/nope/decide";
    assert_eq!(
        http(&base, nope, &with_session, &format!("request_id=r&decision=approve&csrf={csrf}")).await.status,
        404
    );
    let store = SqliteStore::open(&db).unwrap();
    assert!(store.steps(PAUSED).await.unwrap().iter().all(|s| s.kind != StepKind::Approval));

    // A same-origin post with the token records the decision under the operator's name (not
    // the form's `by`), and redirects to the run with a fixed message code.
    let own = [FORM, ("Cookie", cookie.as_str()), ("Origin", base.as_str())];
    let r = http(&base, &decide, &own, &approve).await;
    assert_eq!(r.status, 303);
    assert_eq!(r.header("location"), Some(format!("/runs/{PAUSED}?done=approved").as_str()));
    let steps = store.steps(PAUSED).await.unwrap();
    let decision = steps.iter().find(|s| s.kind == StepKind::Approval).unwrap().result.as_ref().unwrap().to_value();
    assert_eq!(decision["by"], "console-test");
    assert_eq!(decision["channel"], "console");
    assert!(decision["origin"].as_str().unwrap().starts_with("127.0.0.1:"), "{decision}");
    assert_eq!(decision["clock"], "store");
    // The run page shows the audit trail; deciding again is a conflict, shown on the run page.
    let page = http(&base, &format!("GET /runs/{PAUSED}?done=approved"), &[("Cookie", &cookie)], "").await;
    assert!(page.body.contains("id=\"notice\">Approved."), "{}", page.body);
    let audit = page.body.split("<table id=\"decisions\">").nth(1).unwrap();
    assert!(audit.contains("<td class=\"by\">console-test</td><td>console</td><td>127.0.0.1:"), "{audit}");
    let r = http(&base, &decide, &with_session, &approve).await;
    assert_eq!(r.status, 409);
    assert!(r.body.contains("already decided"), "{}", r.body);
}

#[tokio::test]
async fn beyond_loopback_the_console_needs_authentication_and_named_hosts() {
    let dir = tempfile::tempdir().unwrap();
    let db = seed(dir.path()).await;
    let store = store_arg(&db);
    let out = kuralle(&["console", "--store", &store, "--listen", "0.0.0.0:0", "--allowed-host", "ops.test"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("--token-file"), "{out:?}");
    let tokens = dir.path().join("tokens");
    std::fs::write(&tokens, "alice:alice-0123456789abcdef\nbob:bob-0123456789abcdef0\n").unwrap();
    let file = tokens.to_str().unwrap();
    let out = kuralle(&["console", "--store", &store, "--listen", "0.0.0.0:0", "--token-file", file]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("--allowed-host"), "{out:?}");
    std::fs::write(dir.path().join("weak"), "eve:short\n").unwrap();
    let weak = dir.path().join("weak");
    let out = kuralle(&["console", "--store", &store, "--token-file", weak.to_str().unwrap()]);
    assert!(String::from_utf8_lossy(&out.stderr).contains("shorter than 16"), "{out:?}");

    let args = ["--listen", "0.0.0.0:0", "--token-file", file, "--allowed-host", "ops.test"];
    let (_console, base) = console_with(&db, &args, &[]);
    let port = base.rsplit(':').next().unwrap().to_owned();
    let named = format!("ops.test:{port}");

    // Unauthenticated: the login form, nothing else.
    let r = http(&base, "GET /", &[], "").await;
    assert_eq!(r.status, 401);
    assert_hardened(&r);
    assert!(r.body.contains("id=\"login\"") && !r.body.contains(PAUSED), "{}", r.body);
    assert_eq!(http(&base, &format!("GET /runs/{PAUSED}"), &[], "").await.status, 401);
    let bad = http(&base, "GET /", &[("Authorization", "Bearer alice-0123456789abcdeX")], "").await;
    assert_eq!(bad.status, 401);
    let forged = format!("POST /runs/{PAUSED}/decide");
    assert_eq!(http(&base, &forged, &[FORM], "request_id=x&decision=approve").await.status, 401);
    // Hosts: loopback and the listed one.
    let bearer = ("Authorization", "Bearer bob-0123456789abcdef0");
    assert_eq!(http(&base, "GET /", &[bearer, ("Host", &named)], "").await.status, 200);
    assert_eq!(http(&base, "GET /", &[bearer, ("Host", "evil.test")], "").await.status, 421);
    let r = http(&base, "GET /", &[bearer], "").await;
    assert_eq!(r.status, 200);
    assert!(r.body.contains(PAUSED));

    // Log in with a token: a session cookie names alice.
    let r = http(&base, "POST /login", &[FORM], "token=nope-0123456789abcdef").await;
    assert_eq!(r.status, 401);
    let r = http(&base, "POST /login", &[FORM], "token=alice-0123456789abcdef").await;
    assert_eq!(r.status, 303);
    let set = r.header("set-cookie").unwrap().to_owned();
    assert!(set.contains("HttpOnly") && set.contains("SameSite=Strict"), "{set}");
    let cookie = r.cookie();
    let page = http(&base, &format!("GET /runs/{PAUSED}"), &[("Cookie", &cookie)], "").await;
    assert_eq!(page.status, 200);
    assert!(page.body.contains("signed in as <strong>alice</strong>"));
    let (request, csrf) = (page.field("request_id"), page.field("csrf"));
    let deny = format!("request_id={request}&decision=deny&reason=too+much&by=mallory&csrf={csrf}");
    let r = http(&base, &forged, &[FORM, ("Cookie", &cookie)], &deny).await;
    assert_eq!(r.status, 303, "{}", r.body);
    let store = SqliteStore::open(&db).unwrap();
    let steps = store.steps(PAUSED).await.unwrap();
    let decision = steps.iter().find(|s| s.kind == StepKind::Approval).unwrap().result.as_ref().unwrap().to_value();
    assert_eq!((decision["by"].as_str(), decision["approved"].as_bool()), (Some("alice"), Some(false)));
    assert_eq!(decision["reason"], "too much");

    // `runs show` reports the audit trail, in text and JSON.
    let out = kuralle(&["runs", "show", PAUSED, "--store", &store_arg(&db)]);
    let text = String::from_utf8_lossy(&out.stdout);
    let decisions = text.split("decisions:").nth(1).unwrap_or_else(|| panic!("{text}"));
    let line = decisions.lines().find(|l| l.contains("denied")).unwrap_or_else(|| panic!("{text}"));
    assert!(line.contains("alice") && line.contains("console") && line.contains("127.0.0.1:"), "{line}");
    assert!(line.contains("too much"), "{line}");
    let out = kuralle(&["runs", "show", PAUSED, "--json", "--store", &store_arg(&db)]);
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(json["decisions"][0]["by"], "alice");
    assert_eq!(json["decisions"][0]["channel"], "console");
    assert_eq!(json["decisions"][0]["clock"], "store");
}

#[tokio::test]
async fn a_trusted_proxy_header_names_the_user() {
    let dir = tempfile::tempdir().unwrap();
    let db = seed(dir.path()).await;
    let args = ["--listen", "0.0.0.0:0", "--trust-proxy-header", "X-Forwarded-User", "--allowed-host", "ops.test"];
    let (_console, base) = console_with(&db, &args, &[]);
    assert_eq!(http(&base, "GET /", &[], "").await.status, 401);
    let r = http(&base, &format!("GET /runs/{PAUSED}"), &[("X-Forwarded-User", "carol")], "").await;
    assert_eq!(r.status, 200);
    assert!(r.body.contains("signed in as <strong>carol</strong>"));
    let (cookie, request, csrf) = (r.cookie(), r.field("request_id"), r.field("csrf"));
    let decide = format!("POST /runs/{PAUSED}/decide");
    let form = format!("request_id={request}&decision=approve&csrf={csrf}");
    // Another user behind the proxy cannot use carol's form token.
    let dave = [FORM, ("Cookie", cookie.as_str()), ("X-Forwarded-User", "dave")];
    assert_eq!(http(&base, &decide, &dave, &form).await.status, 403);
    let carol = [FORM, ("Cookie", cookie.as_str()), ("X-Forwarded-User", "carol"), ("X-Forwarded-For", "198.51.100.4")];
    assert_eq!(http(&base, &decide, &carol, &form).await.status, 303);
    let store = SqliteStore::open(&db).unwrap();
    let steps = store.steps(PAUSED).await.unwrap();
    let decision = steps.iter().find(|s| s.kind == StepKind::Approval).unwrap().result.as_ref().unwrap().to_value();
    assert_eq!(decision["by"], "carol");
    assert!(decision["origin"].as_str().unwrap().starts_with("198.51.100.4 via proxy 127.0.0.1:"), "{decision}");
}

#[tokio::test]
async fn a_large_run_is_paged_and_its_large_values_folded() {
    use kuralle::{
        AgentDef, RunRequest, RunStatus, Runtime,
        testing::{ScriptedModel, Turn},
    };
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("runs.db");
    let big = "x".repeat(20_000);
    let mut calls: Vec<(String, String, String)> =
        (0..230).map(|i| (format!("c{i}"), "lookup".to_owned(), format!(r#"{{"order":"A-{i}"}}"#))).collect();
    // A right-to-left override in the last call: the page shows it as a marker, never raw.
    calls[229].2 = r#"{"order":"A-\u202e71"}"#.to_owned();
    calls.push(("big".to_owned(), "lookup".to_owned(), format!(r#"{{"order":"{big}"}}"#)));
    let turn = Turn::tool_calls(calls.iter().map(|(a, b, c)| (a.as_str(), b.as_str(), c.as_str())));
    let model = ScriptedModel::by_transcript([turn, Turn::text("All looked up.")]);
    let agent = AgentDef::new("support", "Look up.").tool(common::Lookup);
    let rt = Runtime::builder().agent(agent).model(model).store(SqliteStore::open(&db).unwrap()).build().unwrap();
    let out = rt.run(RunRequest::new("look them all up").run_id("big-1")).await.unwrap();
    assert_eq!(out.status, RunStatus::Finished);
    let (_console, base) = console(&db);
    let rendered = http(&base, "GET /", &[], "").await;
    assert!(rendered.body.contains("big-1"));

    // The last page by default, with a way back; each page at most 200 steps.
    let last = http(&base, "GET /runs/big-1", &[], "").await;
    assert_eq!(last.status, 200);
    assert_eq!(last.body.matches("<tr data-ordinal=").count(), 200);
    assert!(last.body.contains("id=\"earlier\"") && !last.body.contains("id=\"later\""));
    assert!(!last.body.contains('\u{202e}') && last.body.contains("A-&lt;U+202E&gt;71"), "hidden characters shown");
    let first = http(&base, "GET /runs/big-1?from=0", &[], "").await;
    assert_eq!(first.body.matches("<tr data-ordinal=").count(), 200);
    assert!(first.body.contains("<tr data-ordinal=\"0\"") && first.body.contains("id=\"later\""));
    // The big value is cut on the page, with a link to all of it.
    let big_row = last.body.lines().find(|l| l.contains(&"x".repeat(100))).expect("the big step on the last page");
    assert!(big_row.len() < 3 * 4096 + 2000, "cut: {} bytes", big_row.len());
    let href = big_row.split("<a href=\"").nth(1).unwrap().split('"').next().unwrap().to_owned();
    assert!(href.starts_with("/runs/big-1/steps/") && href.ends_with("/args"), "{href}");
    let whole = http(&base, &format!("GET {href}"), &[], "").await;
    assert_eq!(whole.status, 200);
    assert!(whole.body.contains(&big));
    assert_hardened(&whole);
    assert_eq!(http(&base, "GET /runs/big-1/steps/0/nothing", &[], "").await.status, 404);
}

#[tokio::test]
async fn the_cancel_button_closes_a_paused_run() {
    let dir = tempfile::tempdir().unwrap();
    let db = seed(dir.path()).await;
    let (_console, base) = console(&db);

    let page = http(&base, &format!("GET /runs/{PAUSED}"), &[], "").await;
    assert!(page.body.contains(&format!("action=\"/runs/{PAUSED}/cancel\"")), "a paused run has a Cancel button");
    let (cookie, csrf) = (page.cookie(), page.field("csrf"));
    let finished = http(&base, &format!("GET /runs/{FINISHED}"), &[], "").await;
    assert!(!finished.body.contains("/cancel\""), "a finished run has none");

    let cancel = format!("POST /runs/{PAUSED}/cancel");
    let form = format!("csrf={csrf}");
    let evil = [FORM, ("Cookie", cookie.as_str()), ("Origin", "http://evil.example")];
    assert_eq!(http(&base, &cancel, &evil, &form).await.status, 403);
    let session = [FORM, ("Cookie", cookie.as_str())];
    assert_eq!(http(&base, &cancel, &session, "").await.status, 403, "no form token");
    let r = http(&base, &cancel, &session, &form).await;
    assert_eq!(r.status, 303);
    assert_eq!(r.header("location"), Some(&*format!("/runs/{PAUSED}?done=cancelled")));
    let store = SqliteStore::open(&db).unwrap();
    assert_eq!(store.get_run(PAUSED).await.unwrap().unwrap().status, kuralle::RunStatus::Cancelled);
    let r = http(&base, &cancel, &session, &form).await;
    assert_eq!(r.status, 409, "{}", r.body);
    assert!(r.body.contains("only a running or paused run"), "{}", r.body);
    let page = http(&base, &format!("GET /runs/{PAUSED}?done=cancelled"), &[("Cookie", &cookie)], "").await;
    assert!(page.body.contains("badge cancelled"), "the status badge");
    assert!(page.body.contains("Cancelled. An owner"), "the fixed notice");
    let list = http(&base, "GET /?status=cancelled", &[], "").await.body;
    assert!(list.contains(PAUSED) && !list.contains(&format!(">{FINISHED}<")), "{list}");
}

#[tokio::test]
async fn the_list_searches_by_run_id_and_pages_and_the_run_page_shows_the_conversation() {
    let dir = tempfile::tempdir().unwrap();
    let db = seed(dir.path()).await;
    {
        // 60 more runs, written as a runtime would (under a lease).
        let store = SqliteStore::open(&db).unwrap();
        for i in 0..60 {
            let id = format!("bulk-{i:02}");
            let lease = store.acquire_lease(&id, "seed", std::time::Duration::from_secs(60)).await.unwrap();
            store.create_run(kuralle::RunRecord::new(&id, "support"), lease.token).await.unwrap();
            store.release_lease(&lease).await.unwrap();
        }
    }
    let (_console, base) = console(&db);

    let first = http(&base, "GET /", &[], "").await;
    assert_eq!(first.status, 200);
    let first = first.body;
    assert_eq!(first.matches("<tr><td><a href=\"/runs/").count(), 50, "one page");
    assert!(first.contains("rel=\"next\"") && !first.contains("rel=\"prev\""), "a next page link only");
    let second = http(&base, "GET /?page=2", &[], "").await.body;
    assert_eq!(second.matches("<tr><td><a href=\"/runs/").count(), 12);
    assert!(second.contains("rel=\"prev\"") && !second.contains("rel=\"next\""));

    let found = http(&base, "GET /?q=bulk-0", &[], "").await.body;
    assert_eq!(found.matches("<tr><td><a href=\"/runs/").count(), 10, "bulk-00 to bulk-09");
    assert!(found.contains("value=\"bulk-0\""), "the search stays in the form");
    let paused = http(&base, "GET /?q=pay&status=paused", &[], "").await.body;
    assert!(paused.contains(&format!(">{PAUSED}<")) && !paused.contains("bulk-"), "{paused}");

    let page = http(&base, &format!("GET /runs/{FINISHED}"), &[], "").await.body;
    let conversation = page.split("id=\"conversation\"").nth(1).unwrap().split("</section>").next().unwrap();
    assert!(conversation.contains("class=\"say user\"") && conversation.contains(">hi<"), "{conversation}");
    assert!(conversation.contains("class=\"say assistant\"") && conversation.contains(">Hello!<"), "{conversation}");
    assert!(page.contains("<section class=\"timeline\">"), "beside the timeline");
}

#[tokio::test]
async fn fork_and_retry_from_the_run_page() {
    let dir = tempfile::tempdir().unwrap();
    let db = seed(dir.path()).await;
    let (_console, base) = console(&db);

    let page = http(&base, &format!("GET /runs/{FINISHED}"), &[], "").await;
    assert!(page.body.contains(&format!("action=\"/runs/{FINISHED}/fork\"")), "a fork form");
    assert!(!page.body.contains("/retry\""), "no Retry on a finished run");
    let (cookie, csrf) = (page.cookie(), page.field("csrf"));
    let session = [FORM, ("Cookie", cookie.as_str())];
    let fork = format!("POST /runs/{FINISHED}/fork");
    let evil = [FORM, ("Cookie", cookie.as_str()), ("Origin", "http://evil.example")];
    assert_eq!(http(&base, &fork, &evil, &format!("at=0&csrf={csrf}")).await.status, 403);
    assert_eq!(http(&base, &fork, &session, "at=0").await.status, 403, "no form token");
    let r = http(&base, &fork, &session, &format!("at=9&csrf={csrf}")).await;
    assert_eq!(r.status, 400, "{}", r.body);
    assert!(r.body.contains("cannot fork it at step 9"), "{}", r.body);
    let r = http(&base, &fork, &session, &format!("at=0&instructions=Be+terse.&csrf={csrf}")).await;
    assert_eq!(r.status, 303, "{}", r.body);
    let location = r.header("location").unwrap();
    assert!(location.ends_with("?done=forked"), "{location}");
    let fork_id = location.trim_start_matches("/runs/").split('?').next().unwrap().to_owned();
    let store = SqliteStore::open(&db).unwrap();
    let forked = store.get_run(&fork_id).await.unwrap().unwrap();
    assert_eq!((forked.status, forked.agent_id.as_str()), (kuralle::RunStatus::Running, "support"));
    assert!(forked.state.to_value()["instructions"] == "Be terse.", "the override is kept in the run");

    // Retry: only a failed run has the button; the post makes it runnable.
    let retry = format!("POST /runs/{FINISHED}/retry");
    let r = http(&base, &retry, &session, &format!("csrf={csrf}")).await;
    assert_eq!(r.status, 409, "{}", r.body);
    let lease = store.acquire_lease(FINISHED, "test", std::time::Duration::from_secs(60)).await.unwrap();
    let mut record = store.get_run(FINISHED).await.unwrap().unwrap();
    record.status = kuralle::RunStatus::Failed;
    store.put_run(record, lease.token).await.unwrap();
    store.release_lease(&lease).await.unwrap();
    let page = http(&base, &format!("GET /runs/{FINISHED}"), &[("Cookie", &cookie)], "").await.body;
    assert!(page.contains(&format!("action=\"/runs/{FINISHED}/retry\"")), "a failed run has Retry");
    assert_eq!(http(&base, &retry, &session, &format!("csrf={csrf}")).await.status, 303);
    assert_eq!(store.get_run(FINISHED).await.unwrap().unwrap().status, kuralle::RunStatus::Running);
}
