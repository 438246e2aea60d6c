//! The console in a real browser: Debian's headless chromium, driven over WebDriver by
//! chromedriver. An unauthenticated visitor gets the login form and no runs; a page on another
//! origin that frames the console gets nothing drawn; a person logs in with her token, clicks
//! Approve, and the decision is recorded, and shown, under her name.
//! Skipped, with a notice, where `/usr/bin/chromium` or `/usr/bin/chromedriver` is absent
//! (`.ci/run` installs both).

mod common;

use std::{
    path::{Path, PathBuf},
    process::{Command, Stdio},
    time::Duration,
};

use common::{Killed, PAUSED, console, console_with, seed};
use fantoccini::{ClientBuilder, Locator};
use kuralle::{RunStore, StepKind, stores::SqliteStore};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const CHROMIUM: &str = "/usr/bin/chromium";
const CHROMEDRIVER: &str = "/usr/bin/chromedriver";

/// Starts chromedriver on a free port; returns it and its URL once it accepts connections.
async fn chromedriver() -> (Killed, String) {
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let child = Command::new(CHROMEDRIVER)
        .args([format!("--port={port}"), "--allowed-ips=127.0.0.1".to_owned()])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let driver = Killed(child);
    for _ in 0..200 {
        if tokio::net::TcpStream::connect(("127.0.0.1", port)).await.is_ok() {
            return (driver, format!("http://127.0.0.1:{port}"));
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("chromedriver did not start on port {port}");
}

fn out_dir() -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("console_browser");
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// A site on another origin: `/` frames `target` and, as a control, its own `/inner` page.
async fn framing_site(target: String) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let Ok((mut stream, _)) = listener.accept().await else { return };
            let target = target.clone();
            tokio::spawn(async move {
                let mut buf = vec![0u8; 4096];
                let n = stream.read(&mut buf).await.unwrap_or(0);
                let request = String::from_utf8_lossy(&buf[..n]);
                let html = if request.starts_with("GET /inner") {
                    "<!doctype html><p id=\"inner\">framed fine</p>".to_owned()
                } else {
                    format!(
                        "<!doctype html><h1>win a prize</h1><iframe id=\"console\" src=\"{target}\" width=\"900\" height=\"500\"></iframe><iframe id=\"control\" src=\"/inner\"></iframe>"
                    )
                };
                let response = format!(
                    "HTTP/1.1 200 OK\r\nContent-Type: text/html\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{html}",
                    html.len()
                );
                let _ = stream.write_all(response.as_bytes()).await;
            });
        }
    });
    format!("http://localhost:{}", addr.port())
}

/// The text of frame `index` of the current page (empty when nothing could be read).
async fn frame_text(browser: &fantoccini::Client, index: u16) -> String {
    browser.enter_frame(index).await.unwrap();
    let text = match browser.find(Locator::Css("body")).await {
        Ok(body) => body.text().await.unwrap_or_default(),
        Err(_) => String::new(),
    };
    browser.enter_parent_frame().await.unwrap();
    text
}

#[tokio::test(flavor = "multi_thread")]
async fn the_console_in_a_browser_refuses_strangers_and_frames_and_audits_who_decided() {
    if !Path::new(CHROMIUM).exists() || !Path::new(CHROMEDRIVER).exists() {
        eprintln!(
            "SKIPPED console_browser: {CHROMIUM} or {CHROMEDRIVER} is absent (apt-get install -y chromium chromium-driver)"
        );
        return;
    }
    let dir = out_dir();
    let db = seed(&dir).await;
    let tokens = dir.join("tokens");
    std::fs::write(&tokens, "alice:alice-0123456789abcdef\n").unwrap();
    let args = ["--listen", "127.0.0.1:0", "--token-file", tokens.to_str().unwrap()];
    let (_console, base) = console_with(&db, &args, &[]);
    let (_driver, driver_url) = chromedriver().await;

    let profile = dir.join("chromium-profile");
    let mut caps = serde_json::Map::new();
    caps.insert(
        "goog:chromeOptions".to_owned(),
        serde_json::json!({
            "binary": CHROMIUM,
            "args": [
                "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                "--disable-background-networking", "--disable-component-update", "--disable-sync",
                "--disable-dev-shm-usage", "--window-size=1280,1000",
                format!("--user-data-dir={}", profile.display()),
            ],
        }),
    );
    let browser = ClientBuilder::new(hyper_util::client::legacy::connect::HttpConnector::new())
        .capabilities(caps)
        .connect(&driver_url)
        .await
        .expect("chromedriver starts a chromium session");

    // 1. A stranger: the login form, and no runs.
    browser.goto(&format!("{base}/runs/{PAUSED}")).await.unwrap();
    browser.find(Locator::Css("form#login")).await.expect("the login form");
    assert!(browser.find(Locator::Css("table#steps")).await.is_err(), "no run shown before login");
    assert!(!browser.source().await.unwrap().contains("wire"), "nothing of the run leaks");
    std::fs::write(dir.join("console-login.png"), browser.screenshot().await.unwrap()).unwrap();

    // 2. Another origin frames the console (a console without authentication, so only the
    // anti-framing headers stand in the way): chromium draws nothing of it, while the same
    // page's own frame renders.
    let (_open_console, open_base) = console(&db);
    let site = framing_site(format!("{open_base}/runs/{PAUSED}")).await;
    browser.goto(&site).await.unwrap();
    browser.wait().for_element(Locator::Css("iframe#control")).await.unwrap();
    let mut control = String::new();
    for _ in 0..100 {
        control = frame_text(&browser, 1).await;
        if control.contains("framed fine") {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(control.contains("framed fine"), "the control frame renders: {control:?}");
    let framed = frame_text(&browser, 0).await;
    assert!(!framed.contains("Approve") && !framed.contains(PAUSED), "the console rendered in a frame: {framed:?}");
    std::fs::write(dir.join("console-framed.png"), browser.screenshot().await.unwrap()).unwrap();

    // 3. Alice logs in with her token and approves: the decision is hers, audited.
    browser.goto(&format!("{base}/login")).await.unwrap();
    let login = browser.find(Locator::Css("form#login")).await.unwrap();
    login.find(Locator::Css("input[name=token]")).await.unwrap().send_keys("alice-0123456789abcdef").await.unwrap();
    login.find(Locator::Css("button")).await.unwrap().click().await.unwrap();
    let Ok(list) = browser.wait().at_most(Duration::from_secs(10)).for_element(Locator::Css("table#runs")).await else {
        panic!("no runs after login: {}", browser.source().await.unwrap());
    };
    let list = list.text().await.unwrap();
    assert!(list.contains(PAUSED) && list.contains("paused"), "{list}");
    browser.find(Locator::LinkText(PAUSED)).await.unwrap().click().await.unwrap();
    let who = browser.find(Locator::Css("#who")).await.unwrap().text().await.unwrap();
    assert!(who.contains("alice"), "{who}");
    let steps = browser.find(Locator::Css("table#steps")).await.unwrap().text().await.unwrap();
    assert!(steps.contains("lookup") && steps.contains("model"), "{steps}");
    let approval = browser.find(Locator::Css(".approval")).await.unwrap();
    assert!(approval.text().await.unwrap().contains("wire"));
    assert!(approval.find(Locator::Css("input[name=by]")).await.is_err(), "the decider is not a form field");
    std::fs::write(dir.join("console-paused.png"), browser.screenshot().await.unwrap()).unwrap();
    approval.find(Locator::Css("button.approve")).await.unwrap().click().await.unwrap();

    let notice = browser.wait().for_element(Locator::Css("#notice")).await.unwrap().text().await.unwrap();
    assert!(notice.starts_with("Approved."), "{notice}");
    let audit = browser.find(Locator::Css("table#decisions")).await.unwrap().text().await.unwrap();
    assert!(audit.contains("approved") && audit.contains("alice") && audit.contains("console"), "{audit}");
    let decided = browser.find(Locator::Css(".approval.decided")).await.unwrap().text().await.unwrap();
    assert!(decided.contains("approved by alice"), "{decided}");
    assert!(browser.find(Locator::Css("button.approve")).await.is_err(), "a decided request offers no buttons");
    let shot = dir.join("console-approved.png");
    std::fs::write(&shot, browser.screenshot().await.unwrap()).unwrap();
    browser.close().await.unwrap();

    // The run's record shows the decision, under the authenticated name.
    let store = SqliteStore::open(&db).unwrap();
    let journal = store.steps(PAUSED).await.unwrap();
    let decision = journal.iter().find(|s| s.kind == StepKind::Approval).expect("an approval step");
    let value = decision.result.as_ref().unwrap().to_value();
    assert_eq!(value["approved"], true);
    assert_eq!((value["by"].as_str(), value["channel"].as_str()), (Some("alice"), Some("console")));
    eprintln!("screenshots: {} and {}", dir.join("console-framed.png").display(), shot.display());
}
