//! The console over plain HTTP: what it refuses (other hosts, cross-site posts, a denial
//! without a reason, unknown runs and requests) and what it serves.

mod common;

use common::{FINISHED, PAUSED, console, seed};
use kuralle::{RunStore, StepKind, stores::SqliteStore};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Sends one HTTP/1.1 request; returns the status code and the body.
async fn http(base: &str, request_line: &str, headers: &[(&str, &str)], body: &str) -> (u16, String) {
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
    let status = raw.split(' ').nth(1).and_then(|s| s.parse().ok()).unwrap_or(0);
    let body = raw.split_once("\r\n\r\n").map(|(_, b)| b.to_owned()).unwrap_or_default();
    (status, body)
}

const FORM: (&str, &str) = ("Content-Type", "application/x-www-form-urlencoded");

#[tokio::test]
async fn the_console_refuses_what_it_must_and_serves_the_rest() {
    let dir = tempfile::tempdir().unwrap();
    let db = seed(dir.path()).await;
    let (_console, base) = console(&db);

    let (status, body) = http(&base, "GET /?status=paused", &[], "").await;
    assert_eq!(status, 200);
    assert!(body.contains(PAUSED) && !body.contains(FINISHED), "the status filter applies");
    let (status, body) = http(&base, "GET /?agent=support", &[], "").await;
    assert_eq!(status, 200);
    assert!(body.contains(FINISHED) && !body.contains(&format!(">{PAUSED}<")));
    assert_eq!(http(&base, "GET /?status=bogus", &[], "").await.0, 400);
    assert_eq!(http(&base, "GET /runs/nope", &[], "").await.0, 404);

    // DNS rebinding: a page served as evil.example that resolves to 127.0.0.1.
    let (status, _) = http(&base, "GET /", &[("Host", "evil.example:7878")], "").await;
    assert_eq!(status, 421);

    let (_, page) = http(&base, &format!("GET /runs/{PAUSED}"), &[], "").await;
    // Tokens for the run, and for each model step of the timeline.
    let run_tokens = page.split("<dd id=\"tokens\">").nth(1).unwrap().split('<').next().unwrap();
    assert!(run_tokens.contains(" in, ") && run_tokens.ends_with(" out"), "{run_tokens}");
    assert_eq!(page.matches("<td class=\"tokens\">").count(), 3, "one cell per step");
    assert_eq!(page.matches("<td class=\"tokens\"></td>").count(), 1, "the tool step has none");
    let request = page.split("name=\"request_id\" value=\"").nth(1).unwrap().split('"').next().unwrap().to_owned();
    let decide = format!("POST /runs/{PAUSED}/decide");
    let approve = format!("request_id={request}&decision=approve&by=mallory");

    // Cross-site form posts are refused and record nothing.
    let origin = [FORM, ("Origin", "http://evil.example")];
    assert_eq!(http(&base, &decide, &origin, &approve).await.0, 403);
    let fetch_site = [FORM, ("Sec-Fetch-Site", "cross-site")];
    assert_eq!(http(&base, &decide, &fetch_site, &approve).await.0, 403);
    // A denial needs a reason; an unknown request or run is named.
    let no_reason = format!("request_id={request}&decision=deny&by=bob&reason=+");
    assert_eq!(http(&base, &decide, &[FORM], &no_reason).await.0, 400);
    let (status, body) = http(&base, &decide, &[FORM], "request_id=approval-x&decision=approve&by=a").await;
    assert_eq!(status, 409);
    assert!(body.contains("has no pending approval"), "{body}");
    let other = "POST /runs/nope/decide";
    assert_eq!(http(&base, other, &[FORM], "request_id=r&decision=approve&by=a").await.0, 404);
    let store = SqliteStore::open(&db).unwrap();
    assert!(store.steps(PAUSED).await.unwrap().iter().all(|s| s.kind != StepKind::Approval));

    // A same-origin post records the decision and redirects to the run.
    let own = base.clone();
    let (status, _) = http(&base, &decide, &[FORM, ("Origin", &own)], &approve).await;
    assert_eq!(status, 303);
    let steps = store.steps(PAUSED).await.unwrap();
    let decision = steps.iter().find(|s| s.kind == StepKind::Approval).unwrap();
    assert_eq!(decision.result.as_ref().unwrap().to_value()["by"], "mallory");
    // Deciding again is a conflict, shown on the run page.
    let (status, body) = http(&base, &decide, &[FORM], &approve).await;
    assert_eq!(status, 409);
    assert!(body.contains("already decided"), "{body}");
}

#[tokio::test]
async fn the_cancel_button_closes_a_paused_run() {
    let dir = tempfile::tempdir().unwrap();
    let db = seed(dir.path()).await;
    let (_console, base) = console(&db);

    let (_, page) = http(&base, &format!("GET /runs/{PAUSED}"), &[], "").await;
    assert!(page.contains(&format!("action=\"/runs/{PAUSED}/cancel\"")), "a paused run has a Cancel button");
    let (_, finished) = http(&base, &format!("GET /runs/{FINISHED}"), &[], "").await;
    assert!(!finished.contains("/cancel\""), "a finished run has none");

    let cancel = format!("POST /runs/{PAUSED}/cancel");
    assert_eq!(http(&base, &cancel, &[FORM, ("Origin", "http://evil.example")], "").await.0, 403);
    assert_eq!(http(&base, &cancel, &[FORM, ("Origin", &base)], "").await.0, 303);
    let store = SqliteStore::open(&db).unwrap();
    assert_eq!(store.get_run(PAUSED).await.unwrap().unwrap().status, kuralle::RunStatus::Cancelled);
    let (status, body) = http(&base, &cancel, &[FORM], "").await;
    assert_eq!(status, 409, "{body}");
    assert!(body.contains("only a running or paused run"), "{body}");
    let (_, page) = http(&base, &format!("GET /runs/{PAUSED}"), &[], "").await;
    assert!(page.contains("badge cancelled"), "the status badge");
    let (_, list) = http(&base, "GET /?status=cancelled", &[], "").await;
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

    let (status, first) = http(&base, "GET /", &[], "").await;
    assert_eq!(status, 200);
    assert_eq!(first.matches("<tr><td><a href=\"/runs/").count(), 50, "one page");
    assert!(first.contains("rel=\"next\"") && !first.contains("rel=\"prev\""), "a next page link only");
    let (_, second) = http(&base, "GET /?page=2", &[], "").await;
    assert_eq!(second.matches("<tr><td><a href=\"/runs/").count(), 12);
    assert!(second.contains("rel=\"prev\"") && !second.contains("rel=\"next\""));

    let (_, found) = http(&base, "GET /?q=bulk-0", &[], "").await;
    assert_eq!(found.matches("<tr><td><a href=\"/runs/").count(), 10, "bulk-00 to bulk-09");
    assert!(found.contains("value=\"bulk-0\""), "the search stays in the form");
    let (_, paused) = http(&base, "GET /?q=pay&status=paused", &[], "").await;
    assert!(paused.contains(&format!(">{PAUSED}<")) && !paused.contains("bulk-"), "{paused}");

    let (_, page) = http(&base, &format!("GET /runs/{FINISHED}"), &[], "").await;
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

    let (_, page) = http(&base, &format!("GET /runs/{FINISHED}"), &[], "").await;
    assert!(page.contains(&format!("action=\"/runs/{FINISHED}/fork\"")), "a fork form");
    assert!(!page.contains("/retry\""), "no Retry on a finished run");
    let fork = format!("POST /runs/{FINISHED}/fork");
    assert_eq!(http(&base, &fork, &[FORM, ("Origin", "http://evil.example")], "at=0").await.0, 403);
    let (status, body) = http(&base, &fork, &[FORM], "at=9").await;
    assert_eq!(status, 400, "{body}");
    assert!(body.contains("cannot fork it at step 9"), "{body}");
    let raw = {
        let addr = base.trim_start_matches("http://");
        let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
        let body = "at=0&instructions=Be+terse.";
        let req = format!(
            "POST /runs/{FINISHED}/fork HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\nContent-Type: application/x-www-form-urlencoded\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        );
        stream.write_all(req.as_bytes()).await.unwrap();
        let mut raw = String::new();
        stream.read_to_string(&mut raw).await.unwrap();
        raw
    };
    assert!(raw.starts_with("HTTP/1.1 303"), "{raw}");
    let location = raw.lines().find_map(|l| l.strip_prefix("location: ")).unwrap();
    let fork_id = location.trim_start_matches("/runs/").split('?').next().unwrap().to_owned();
    let store = SqliteStore::open(&db).unwrap();
    let forked = store.get_run(&fork_id).await.unwrap().unwrap();
    assert_eq!((forked.status, forked.agent_id.as_str()), (kuralle::RunStatus::Running, "support"));
    assert!(forked.state.to_value()["instructions"] == "Be terse.", "the override is kept in the run");

    // Retry: only a failed run has the button; the post makes it runnable.
    let (status, body) = http(&base, &format!("POST /runs/{FINISHED}/retry"), &[FORM], "").await;
    assert_eq!(status, 409, "{body}");
    let lease = store.acquire_lease(FINISHED, "test", std::time::Duration::from_secs(60)).await.unwrap();
    let mut record = store.get_run(FINISHED).await.unwrap().unwrap();
    record.status = kuralle::RunStatus::Failed;
    store.put_run(record, lease.token).await.unwrap();
    store.release_lease(&lease).await.unwrap();
    let (_, page) = http(&base, &format!("GET /runs/{FINISHED}"), &[], "").await;
    assert!(page.contains(&format!("action=\"/runs/{FINISHED}/retry\"")), "a failed run has Retry");
    assert_eq!(http(&base, &format!("POST /runs/{FINISHED}/retry"), &[FORM], "").await.0, 303);
    assert_eq!(store.get_run(FINISHED).await.unwrap().unwrap().status, kuralle::RunStatus::Running);
}
