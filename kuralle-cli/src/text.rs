//! Text output for people: aligned tables, colour only on a terminal (and never with
//! `NO_COLOR`).

use std::io::IsTerminal;

use kuralle::{RunStatus, StepStatus};

use crate::{
    clean,
    time::{duration, timestamp},
    view::{self, RunDetail, RunRow},
};

/// Whether to colour output.
#[derive(Debug, Clone, Copy)]
pub struct Style {
    color: bool,
}

impl Style {
    /// Colour when stdout is a terminal and `NO_COLOR` is unset.
    pub fn detect() -> Self {
        Self { color: std::io::stdout().is_terminal() && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty()) }
    }

    fn paint(self, code: &str, text: &str) -> String {
        if self.color { format!("\x1b[{code}m{text}\x1b[0m") } else { text.to_owned() }
    }

    fn run_status(self, status: RunStatus, padded: &str) -> String {
        match status {
            RunStatus::Paused => self.paint("33", padded),
            RunStatus::Failed | RunStatus::LimitExceeded => self.paint("31", padded),
            RunStatus::Cancelled => self.paint("35", padded),
            RunStatus::Finished => self.paint("32", padded),
            _ => padded.to_owned(),
        }
    }

    fn step_status(self, status: StepStatus, padded: &str) -> String {
        match status {
            StepStatus::Failed => self.paint("31", padded),
            StepStatus::Running => self.paint("33", padded),
            StepStatus::Finished => padded.to_owned(),
        }
    }

    fn dim(self, text: &str) -> String {
        self.paint("2", text)
    }
}

/// Lays out rows under a header with columns padded to their widest cell. `paint` styles a
/// padded cell (column index, row index, text). Cells are untrusted: escapes and control
/// characters are removed before they are measured, hidden characters shown.
fn table(header: &[&str], rows: &[Vec<String>], paint: impl Fn(usize, usize, &str) -> String) -> String {
    let rows: Vec<Vec<String>> = rows.iter().map(|r| r.iter().map(|c| clean::terminal(c, false)).collect()).collect();
    let rows = rows.as_slice();
    let mut widths: Vec<usize> = header.iter().map(|h| h.chars().count()).collect();
    for row in rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let pad = |cell: &str, w: usize| format!("{cell}{}", " ".repeat(w.saturating_sub(cell.chars().count())));
    let mut out = String::new();
    let head: Vec<String> = header.iter().zip(&widths).map(|(h, &w)| pad(h, w)).collect();
    out.push_str(head.join("  ").trim_end());
    out.push('\n');
    for (r, row) in rows.iter().enumerate() {
        let cells: Vec<String> =
            row.iter().zip(&widths).enumerate().map(|(c, (cell, &w))| paint(c, r, &pad(cell, w))).collect();
        out.push_str(cells.join("  ").trim_end());
        out.push('\n');
    }
    out
}

/// `runs list` as a table.
pub fn runs(rows: &[RunRow], style: Style) -> String {
    if rows.is_empty() {
        return "no runs match\n".to_owned();
    }
    let cells: Vec<Vec<String>> = rows
        .iter()
        .map(|r| {
            vec![
                r.run_id.clone(),
                r.agent_id.clone(),
                r.status.as_str().to_owned(),
                r.steps.to_string(),
                timestamp(r.updated_at_ms),
                r.pending_approvals.to_string(),
            ]
        })
        .collect();
    table(&["RUN", "AGENT", "STATUS", "STEPS", "UPDATED", "PENDING"], &cells, |c, r, cell| {
        if c == 2 { style.run_status(rows[r].status, cell) } else { cell.to_owned() }
    })
}

/// `runs show` as a header, the steps, and the pending approvals.
pub fn run(detail: &RunDetail, style: Style) -> String {
    let mut out = format!(
        "run      {}\nagent    {}\nstatus   {}\nepoch    {}\ncreated  {}\nupdated  {}\ntokens   {}\n{}\n",
        clean::terminal(&detail.run_id, false),
        clean::terminal(&detail.agent_id, false),
        style.run_status(detail.status, detail.status.as_str()),
        detail.epoch,
        timestamp(detail.created_at_ms),
        timestamp(detail.updated_at_ms),
        view::tokens(&detail.usage),
        detail.cost_usd.map(|c| format!("cost     {}\n", view::dollars(c))).unwrap_or_default(),
    );
    if !detail.conversation.is_empty() {
        for u in &detail.conversation {
            out.push_str(&format!("{:<10} {}\n", format!("{}:", u.role), view::clip(&u.text, 100)));
        }
        out.push('\n');
    }
    if detail.steps.is_empty() {
        out.push_str("no steps journaled\n");
    } else {
        let cells: Vec<Vec<String>> = detail
            .steps
            .iter()
            .map(|s| {
                vec![
                    s.ordinal.to_string(),
                    s.kind.as_str().to_owned(),
                    s.name.clone(),
                    s.status.as_str().to_owned(),
                    s.duration_ms.map(duration).unwrap_or_else(|| "-".to_owned()),
                    s.key_prefix().to_owned(),
                    s.args_preview(40),
                    s.result_preview(48),
                    s.usage.map(|u| format!("{}/{}", u.input_tokens, u.output_tokens)).unwrap_or_default(),
                ]
            })
            .collect();
        let steps = &detail.steps;
        out.push_str(&table(
            &["#", "KIND", "NAME", "STATUS", "DURATION", "KEY", "ARGS", "RESULT", "TOKENS IN/OUT"],
            &cells,
            |c, r, cell| match c {
                3 => style.step_status(steps[r].status, cell),
                5 => style.dim(cell),
                _ => cell.to_owned(),
            },
        ));
    }
    if !detail.decisions.is_empty() {
        out.push_str("\ndecisions:\n");
        let cells: Vec<Vec<String>> = detail
            .decisions
            .iter()
            .map(|d| {
                let r = &d.decision;
                vec![
                    d.ordinal.to_string(),
                    d.request_id.clone(),
                    d.tool.clone(),
                    if r.approved { "approved" } else { "denied" }.to_owned(),
                    r.by.clone(),
                    r.channel.clone().unwrap_or_else(|| "-".to_owned()),
                    r.origin.clone().unwrap_or_else(|| "-".to_owned()),
                    r.at_ms.map(timestamp).unwrap_or_else(|| "-".to_owned()),
                    r.reason.clone().unwrap_or_default(),
                ]
            })
            .collect();
        out.push_str(&table(
            &["#", "REQUEST", "TOOL", "DECISION", "BY", "VIA", "FROM", "AT", "REASON"],
            &cells,
            |_, _, cell| cell.to_owned(),
        ));
        if detail.decisions.iter().any(|d| d.decision.clock == Some(kuralle::inspect::DecisionClock::Process)) {
            out.push_str("(times by the store's clock, except where the deciding process's clock was all it had)\n");
        }
    }
    if !detail.pending.is_empty() {
        out.push_str("\npending approvals:\n");
        let cells: Vec<Vec<String>> = detail
            .pending
            .iter()
            .map(|p| {
                vec![
                    p.request.request_id.clone(),
                    p.request.name.clone(),
                    p.request.call_id.clone(),
                    crate::view::preview(&p.request.args, 60),
                    p.decision_text().unwrap_or_else(|| "undecided".to_owned()),
                ]
            })
            .collect();
        out.push_str(&table(&["REQUEST", "TOOL", "CALL", "ARGS", "DECISION"], &cells, |_, _, cell| cell.to_owned()));
        // What is being approved, whole: a clipped argument can hide the part that matters.
        for p in &detail.pending {
            let args = serde_json::to_string_pretty(&p.request.args).unwrap_or_default();
            out.push_str(&format!(
                "\narguments of {} ({}):\n{}\n",
                clean::terminal(&p.request.request_id, false),
                clean::terminal(&p.request.name, false),
                clean::terminal(&args, true)
            ));
        }
        if detail.pending.iter().all(|p| p.decision.is_some()) {
            out.push_str("\ndecided; the run's owner (or a worker) resumes it\n");
            return out;
        }
        out.push_str(&format!(
            "\ndecide with: kuralle runs approve {id} REQUEST --by NAME\n         or: kuralle runs deny {id} REQUEST --by NAME --reason TEXT\n",
            id = clean::terminal(&detail.run_id, false)
        ));
    }
    out
}
