//! What the MCP tests share: finding the peers `.ci/run` installs (the conformance suite under
//! `conformance/node_modules`, the Python SDK in `conformance/.venv`), and running
//! `examples/mcp_server` over HTTP.

#![allow(dead_code)] // each test file uses its own part

use std::{
    io::{BufRead, BufReader},
    path::PathBuf,
    process::{Child, Command, Stdio},
    sync::mpsc,
    time::Duration,
};

/// The workspace root.
pub fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).parent().expect("tests/ sits in the workspace").to_owned()
}

/// The conformance CLI, or `None` (with a printed notice) when node or the package is missing.
pub fn conformance_cli(test: &str) -> Option<PathBuf> {
    let cli = root().join("conformance/node_modules/.bin/conformance");
    let node = Command::new("node").arg("--version").output().is_ok_and(|o| o.status.success());
    if node && cli.exists() {
        return Some(cli);
    }
    eprintln!(
        "SKIP {test}: needs node and `npm ci` in conformance/ (found node: {node}, {} present: {})",
        cli.display(),
        cli.exists()
    );
    None
}

/// The virtualenv's python with the `mcp` SDK, or `None` (with a printed notice).
pub fn python(test: &str) -> Option<PathBuf> {
    let python = root().join("conformance/.venv/bin/python");
    let ok = Command::new(&python).args(["-c", "import mcp"]).output().is_ok_and(|o| o.status.success());
    if ok {
        return Some(python);
    }
    eprintln!(
        "SKIP {test}: needs the Python SDK in conformance/.venv (python3 -m venv conformance/.venv && \
         conformance/.venv/bin/pip install -r conformance/requirements.txt)"
    );
    None
}

/// A child process killed when dropped.
pub struct Running(pub Child);

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Starts `examples/mcp_server --http 127.0.0.1:0`; returns it and its endpoint URL.
pub fn serve_http() -> (Running, String) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_mcp_server"))
        .args(["--http", "127.0.0.1:0"])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start mcp_server");
    let stderr = child.stderr.take().expect("piped stderr");
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let mut lines = BufReader::new(stderr).lines().map_while(Result::ok);
        if let Some(line) = lines.find(|l| l.starts_with("listening on ")) {
            let _ = tx.send(line["listening on ".len()..].to_owned());
        }
        // Keep draining so the server never blocks on a full pipe.
        for _ in lines {}
    });
    let url = rx.recv_timeout(Duration::from_secs(60)).expect("mcp_server announces its address");
    (Running(child), url)
}
