//! The console in a real browser: Debian's headless chromium, driven over WebDriver by
//! chromedriver, sees a paused run, clicks Approve, and the run's record shows the decision.
//! Skipped, with a notice, where `/usr/bin/chromium` or `/usr/bin/chromedriver` is absent
//! (`.ci/run` installs both).

mod common;

use std::{
    path::{Path, PathBuf},
    process::{Command, Stdio},
    time::Duration,
};

use common::{Killed, PAUSED, console, seed};
use fantoccini::{ClientBuilder, Locator};
use kuralle::{RunStore, StepKind, stores::SqliteStore};

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

#[tokio::test(flavor = "multi_thread")]
async fn a_person_approves_a_paused_run_in_the_browser() {
    if !Path::new(CHROMIUM).exists() || !Path::new(CHROMEDRIVER).exists() {
        eprintln!(
            "SKIPPED console_browser: {CHROMIUM} or {CHROMEDRIVER} is absent (apt-get install -y chromium chromium-driver)"
        );
        return;
    }
    let dir = out_dir();
    let db = seed(&dir).await;
    let (_console, base) = console(&db);
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

    // The runs list, filtered to paused runs, shows the run.
    browser.goto(&format!("{base}/?status=paused")).await.unwrap();
    let list = browser.find(Locator::Css("table#runs")).await.unwrap().text().await.unwrap();
    assert!(list.contains(PAUSED) && list.contains("paused"), "{list}");
    std::fs::write(dir.join("console-runs.png"), browser.screenshot().await.unwrap()).unwrap();
    browser.find(Locator::LinkText(PAUSED)).await.unwrap().click().await.unwrap();

    // The run page: its timeline, and the pending approval with its buttons.
    let steps = browser.find(Locator::Css("table#steps")).await.unwrap().text().await.unwrap();
    assert!(steps.contains("lookup") && steps.contains("model"), "{steps}");
    let approval = browser.find(Locator::Css(".approval")).await.unwrap();
    assert!(approval.text().await.unwrap().contains("wire"));
    let by = approval.find(Locator::Css("form input[name=by]")).await.unwrap();
    by.clear().await.unwrap();
    by.send_keys("alice").await.unwrap();
    std::fs::write(dir.join("console-paused.png"), browser.screenshot().await.unwrap()).unwrap();
    approval.find(Locator::Css("button.approve")).await.unwrap().click().await.unwrap();

    let notice = browser.wait().for_element(Locator::Css("#notice")).await.unwrap().text().await.unwrap();
    assert!(notice.contains("approved") && notice.contains("alice"), "{notice}");
    let steps = browser.find(Locator::Css("table#steps")).await.unwrap().text().await.unwrap();
    assert!(steps.contains("approved by alice"), "{steps}");
    let decided = browser.find(Locator::Css(".approval.decided")).await.unwrap().text().await.unwrap();
    assert!(decided.contains("approved by alice"), "{decided}");
    assert!(browser.find(Locator::Css("button.approve")).await.is_err(), "a decided request offers no buttons");
    let shot = dir.join("console-approved.png");
    std::fs::write(&shot, browser.screenshot().await.unwrap()).unwrap();
    browser.close().await.unwrap();

    // The run's record shows the decision.
    let store = SqliteStore::open(&db).unwrap();
    let journal = store.steps(PAUSED).await.unwrap();
    let decision = journal.iter().find(|s| s.kind == StepKind::Approval).expect("an approval step");
    let value = decision.result.as_ref().unwrap().to_value();
    assert_eq!(value["approved"], true);
    assert_eq!(value["by"], "alice");
    eprintln!("screenshots: {} and {}", dir.join("console-paused.png").display(), shot.display());
}
