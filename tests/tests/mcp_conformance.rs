//! The official MCP conformance suite (`@modelcontextprotocol/conformance`, pinned in
//! `conformance/package.json`) against `examples/mcp_server` and against kuralle's client.
//! Skips with a notice where node or the installed suite is missing.

mod mcp_common;

use std::process::Command;

use mcp_common::{conformance_cli, root, serve_http};

/// Every server scenario of the suite, pending ones included: the tool scenarios must pass,
/// and the rest fail exactly as `conformance/expected-failures.yml` says (the suite itself
/// fails on an unlisted failure and on a listed scenario that passes).
#[test]
fn server_scenarios_pass_or_are_expected_failures() {
    let Some(cli) = conformance_cli("server_scenarios_pass_or_are_expected_failures") else { return };
    let (_server, url) = serve_http();
    let baseline = root().join("conformance/expected-failures.yml");
    let out = Command::new(&cli)
        .args(["server", "--url", &url, "--suite", "all", "--expected-failures"])
        .arg(&baseline)
        .output()
        .expect("run the conformance suite");
    let report = format!("{}\n{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "conformance server suite failed:\n{report}");
    for scenario in [
        "server-initialize",
        "ping",
        "tools-list",
        "tools-call-simple-text",
        "tools-call-image",
        "tools-call-audio",
        "tools-call-embedded-resource",
        "tools-call-mixed-content",
        "tools-call-with-logging",
        "tools-call-error",
        "tools-call-with-progress",
        "tools-call-sampling",
        "tools-call-elicitation",
        "json-schema-2020-12",
        "server-sse-polling",
        "server-sse-multiple-streams",
        "dns-rebinding-protection",
    ] {
        assert!(report.contains(&format!("✓ {scenario}:")), "scenario {scenario} did not pass:\n{report}");
    }
}

/// The client scenarios, with `examples/mcp_client` (kuralle's `McpClient`, each remote tool
/// called as a `kuralle::Tool`) as the client.
#[test]
fn client_scenarios_pass() {
    let Some(cli) = conformance_cli("client_scenarios_pass") else { return };
    for scenario in ["initialize", "tools_call", "sse-retry"] {
        let out = Command::new(&cli)
            .args(["client", "--command", env!("CARGO_BIN_EXE_mcp_client"), "--scenario", scenario])
            .output()
            .expect("run the conformance suite");
        let report = format!("{}\n{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
        assert!(out.status.success(), "client scenario {scenario} failed:\n{report}");
        assert!(report.contains("OVERALL: PASSED"), "client scenario {scenario} did not pass:\n{report}");
    }
}
