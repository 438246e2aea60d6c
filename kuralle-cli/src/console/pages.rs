//! The console's pages, rendered on the server from [`crate::view`].

use std::fmt::Write;

use kuralle::{RunStatus, StepStatus};
use serde_json::Value;

use super::{
    auth::Caller,
    html::{attr, esc, page as page_html, url},
};
use crate::{
    time::{duration, timestamp},
    view::{ListQuery, RunDetail, RunRow, StepView},
};

const STATUSES: [RunStatus; 8] = [
    RunStatus::Paused,
    RunStatus::Running,
    RunStatus::Failed,
    RunStatus::Finished,
    RunStatus::MaxSteps,
    RunStatus::Interrupted,
    RunStatus::LimitExceeded,
    RunStatus::Cancelled,
];

fn badge(status: &str) -> String {
    format!(r#"<span class="badge {s}">{s}</span>"#, s = esc(status))
}

/// The query string of the list with `query`'s filters, at `page`.
fn list_href(query: &ListQuery, status: Option<RunStatus>, page: usize) -> String {
    let mut params = Vec::new();
    if let Some(s) = status {
        params.push(format!("status={}", s.as_str()));
    }
    if let Some(a) = &query.agent {
        params.push(format!("agent={}", url(a)));
    }
    if let Some(q) = &query.prefix {
        params.push(format!("q={}", url(q)));
    }
    if page > 1 {
        params.push(format!("page={page}"));
    }
    format!("/?{}", params.join("&"))
}

/// The runs list with its status filters, id search and paging (`page` is 1-based; `more`
/// says whether a next page exists).
pub fn runs(rows: &[RunRow], query: &ListQuery, page: usize, more: bool) -> String {
    let mut body = String::from("<h1>Runs</h1>\n<p class=\"filters\">status: ");
    let on = |yes: bool| if yes { " class=\"on\"" } else { "" };
    let _ = write!(body, r#"<a href="{}"{}>all</a>"#, esc(&list_href(query, None, 1)), on(query.status.is_none()));
    for s in STATUSES {
        let _ = write!(
            body,
            r#"<a href="{href}"{cls}>{st}</a>"#,
            href = esc(&list_href(query, Some(s), 1)),
            st = s.as_str(),
            cls = on(query.status == Some(s))
        );
    }
    body.push_str("</p>\n");
    let _ = write!(
        body,
        r#"<form method="get" action="/" class="filters">{status}<label>run id <input type="search" name="q" value="{q}" placeholder="prefix"></label> <label>agent <input type="text" name="agent" value="{agent}"></label> <button type="submit">filter</button></form>"#,
        status = query
            .status
            .map(|s| format!(r#"<input type="hidden" name="status" value="{}">"#, s.as_str()))
            .unwrap_or_default(),
        q = attr(query.prefix.as_deref().unwrap_or_default()),
        agent = attr(query.agent.as_deref().unwrap_or_default()),
    );
    if rows.is_empty() {
        body.push_str("<p class=\"muted\">No runs match.</p>");
    } else {
        body.push_str(
            "<table id=\"runs\"><thead><tr><th>run</th><th>agent</th><th>status</th><th>steps</th><th>updated</th><th>pending approvals</th></tr></thead><tbody>\n",
        );
        for r in rows {
            let _ = writeln!(
                body,
                r#"<tr><td><a href="/runs/{href}">{id}</a></td><td>{agent}</td><td>{status}</td><td>{steps}</td><td>{updated}</td><td>{pending}</td></tr>"#,
                href = url(&r.run_id),
                id = esc(&r.run_id),
                agent = esc(&r.agent_id),
                status = badge(r.status.as_str()),
                steps = r.steps,
                updated = timestamp(r.updated_at_ms),
                pending = if r.pending_approvals > 0 {
                    format!("<strong>{}</strong>", r.pending_approvals)
                } else {
                    "0".into()
                },
            );
        }
        body.push_str("</tbody></table>");
    }
    if page > 1 || more {
        body.push_str("<p class=\"pager\" id=\"pager\">");
        if page > 1 {
            let _ = write!(
                body,
                r#"<a href="{}" rel="prev">&larr; newer</a> "#,
                esc(&list_href(query, query.status, page - 1))
            );
        }
        let _ = write!(body, "page {page}");
        if more {
            let _ = write!(
                body,
                r#" <a href="{}" rel="next">older &rarr;</a>"#,
                esc(&list_href(query, query.status, page + 1))
            );
        }
        body.push_str("</p>");
    }
    page_html("Runs", &body)
}

/// A run: its record, pending approvals with decision forms, and the timeline of steps.
/// Steps on one page of a run's timeline.
pub const STEPS_PER_PAGE: usize = 200;

/// A value's pretty-printed characters shown in a timeline cell before it is cut, with a link
/// to the whole value.
const VALUE_CHARS: usize = 4096;

/// A run: its record, pending approvals with decision forms, its decisions, and one page of its
/// timeline (the steps from ordinal `from`, else the last page).
pub fn run(
    detail: &RunDetail,
    caller: &Caller,
    notice: Option<&str>,
    error: Option<&str>,
    from: Option<u64>,
) -> String {
    let mut body = String::new();
    let csrf = caller
        .csrf
        .as_deref()
        .map(|t| format!(r#"<input type="hidden" name="csrf" value="{}">"#, attr(t)))
        .unwrap_or_default();
    let _ = write!(
        body,
        r#"<div class="who" id="who">signed in as <strong>{who}</strong> <form method="post" action="/logout">{csrf}<button type="submit">log out</button></form></div>"#,
        who = esc(&caller.identity),
    );
    let _ = write!(body, "<p><a href=\"/\">&larr; all runs</a></p><h1>Run <code>{}</code></h1>", esc(&detail.run_id));
    if let Some(n) = notice {
        let _ = write!(body, r#"<div class="notice" id="notice">{}</div>"#, esc(n));
    }
    if let Some(e) = error {
        let _ = write!(body, r#"<div class="error" id="error">{}</div>"#, esc(e));
    }
    let _ = write!(
        body,
        r#"<dl class="meta"><dt>agent</dt><dd>{agent}</dd><dt>status</dt><dd id="status">{status}</dd><dt>turn epoch</dt><dd>{epoch}</dd><dt>created</dt><dd>{created}</dd><dt>updated</dt><dd>{updated}</dd><dt>tokens</dt><dd id="tokens">{tokens}</dd>{cost}</dl>"#,
        agent = esc(&detail.agent_id),
        status = badge(detail.status.as_str()),
        epoch = detail.epoch,
        created = timestamp(detail.created_at_ms),
        updated = timestamp(detail.updated_at_ms),
        tokens = esc(&crate::view::tokens(&detail.usage)),
        cost = detail
            .cost_usd
            .map(|c| format!(r#"<dt>cost</dt><dd id="cost">{}</dd>"#, esc(&crate::view::dollars(c))))
            .unwrap_or_default(),
    );

    if matches!(detail.status, RunStatus::Running | RunStatus::Paused) {
        let _ = write!(
            body,
            r#"<form method="post" action="/runs/{href}/cancel" id="cancel">{csrf}<button type="submit" class="deny">Cancel run</button> <span class="muted">a paused run closes now; a running one stops at its next step</span></form>"#,
            href = esc(&url(&detail.run_id)),
        );
    }
    if detail.status == RunStatus::Failed {
        let _ = write!(
            body,
            r#"<form method="post" action="/runs/{href}/retry" id="retry">{csrf}<button type="submit" class="approve">Retry run</button> <span class="muted">the failed turn goes on from its journal (finished steps replay)</span></form>"#,
            href = esc(&url(&detail.run_id)),
        );
    }

    if !detail.pending.is_empty() {
        body.push_str("<h2>Pending approvals</h2>");
        let action = format!("/runs/{}/decide", url(&detail.run_id));
        for pv in &detail.pending {
            let p = &pv.request;
            let args = serde_json::to_string_pretty(&p.args).unwrap_or_default();
            if let Some(decided) = pv
                .decision
                .as_ref()
                .map(|d| format!("{} {}", crate::view::decision_text(d), crate::view::audit_text(d)))
            {
                let _ = write!(
                    body,
                    r#"<div class="approval decided" data-request="{rid}"><div><strong>{tool}</strong> <span class="muted">request <code>{rid}</code>, call <code>{call}</code></span></div><pre class="args">{args}</pre><p class="decision"><strong>{decided}</strong>; waiting for the run's owner to resume it.</p></div>"#,
                    rid = esc(&p.request_id),
                    tool = esc(&p.name),
                    call = esc(&p.call_id),
                    args = esc(&args),
                    decided = esc(&decided),
                );
                continue;
            }
            let _ = write!(
                body,
                r#"<div class="approval" data-request="{rid}"><div><strong>{tool}</strong> <span class="muted">request <code>{rid}</code>, call <code>{call}</code></span></div><pre class="args">{args}</pre>
<form method="post" action="{action}">{csrf}<input type="hidden" name="request_id" value="{rid}"><input type="hidden" name="decision" value="approve"><button type="submit" class="approve">Approve</button></form>
<form method="post" action="{action}">{csrf}<input type="hidden" name="request_id" value="{rid}"><input type="hidden" name="decision" value="deny"><label>reason <input type="text" name="reason" required></label> <button type="submit" class="deny">Deny</button></form>
<p class="muted">You decide as <strong>{who}</strong>; the model is told the decision (and a denial's reason), never who.</p></div>"#,
                rid = esc(&p.request_id),
                tool = esc(&p.name),
                call = esc(&p.call_id),
                args = esc(&args),
                action = attr(&action),
                who = esc(&caller.identity),
            );
        }
        body.push_str(
            r#"<p class="muted">A decision is recorded in the run's journal; the process that owns the run (or a worker) resumes it.</p>"#,
        );
    }

    if !detail.decisions.is_empty() {
        body.push_str("<h2>Decisions</h2><table id=\"decisions\"><thead><tr><th>#</th><th>request</th><th>tool</th><th>decision</th><th>by</th><th>via</th><th>from</th><th>at</th><th>reason</th></tr></thead><tbody>");
        for d in &detail.decisions {
            let r = &d.decision;
            let clock = match r.clock {
                Some(kuralle::inspect::DecisionClock::Store) => " <span class=\"muted\">(store clock)</span>",
                Some(kuralle::inspect::DecisionClock::Process) => {
                    " <span class=\"muted\">(deciding process's clock)</span>"
                }
                None => "",
            };
            let _ = write!(
                body,
                r#"<tr><td>{ord}</td><td><code>{rid}</code></td><td>{tool}</td><td>{what}</td><td class="by">{by}</td><td>{via}</td><td>{from}</td><td>{at}{clock}</td><td>{reason}</td></tr>"#,
                ord = d.ordinal,
                rid = esc(&d.request_id),
                tool = esc(&d.tool),
                what = if r.approved { "approved" } else { "denied" },
                by = esc(&r.by),
                via = esc(r.channel.as_deref().unwrap_or("-")),
                from = esc(r.origin.as_deref().unwrap_or("-")),
                at = r.at_ms.map(timestamp).unwrap_or_else(|| "-".to_owned()),
                reason = esc(r.reason.as_deref().unwrap_or_default()),
            );
        }
        body.push_str("</tbody></table>");
    }

    body.push_str("<div class=\"columns\"><section class=\"conversation\" id=\"conversation\"><h2>Conversation</h2>");
    if detail.conversation.is_empty() {
        body.push_str("<p class=\"muted\">Nothing said yet.</p>");
    }
    for u in &detail.conversation {
        let step = u.ordinal.map(|o| format!(r#" <span class="muted">step {o}</span>"#)).unwrap_or_default();
        let _ = write!(
            body,
            r#"<div class="say {role}"><div class="who">{role}{step}</div><div class="text">{text}</div></div>"#,
            role = esc(u.role),
            text = esc(&u.text),
        );
    }
    body.push_str("</section><section class=\"timeline\"><h2>Timeline</h2>");
    if !detail.steps.is_empty() {
        let _ = write!(
            body,
            r#"<form method="post" action="/runs/{href}/fork" id="fork" class="filters">{csrf}<label>fork at step <input type="number" name="at" min="0" max="{max}" value="{max}" required></label> <label>instructions <input type="text" name="instructions" placeholder="the agent's"></label> <button type="submit">Fork</button> <span class="muted">a new run: steps before this one replay, the rest runs again</span></form>"#,
            href = esc(&url(&detail.run_id)),
            max = detail.steps.len(),
            csrf = csrf,
        );
    }
    if detail.steps.is_empty() {
        body.push_str("<p class=\"muted\">No steps journaled.</p>");
    } else {
        let n = detail.steps.len();
        let start = match from {
            Some(f) => detail.steps.iter().position(|s| s.ordinal >= f).unwrap_or(n),
            None => n.saturating_sub(STEPS_PER_PAGE),
        };
        let end = (start + STEPS_PER_PAGE).min(n);
        let base = format!("/runs/{}", url(&detail.run_id));
        let mut nav = format!(r#"<p class="pages" id="pages">steps {}–{} of {n}"#, start + 1, end);
        if start > 0 {
            let earlier = detail.steps[start.saturating_sub(STEPS_PER_PAGE)].ordinal;
            let _ = write!(
                nav,
                r#" · <a href="{base}?from=0">first</a> · <a href="{base}?from={earlier}" id="earlier">earlier</a>"#
            );
        }
        if end < n {
            let _ = write!(
                nav,
                r#" · <a href="{base}?from={}" id="later">later</a> · <a href="{base}">last</a>"#,
                detail.steps[end].ordinal
            );
        }
        nav.push_str("</p>");
        if n > STEPS_PER_PAGE {
            body.push_str(&nav);
        }
        timeline(&mut body, &detail.run_id, &detail.steps[start..end]);
        body.push_str(
            r#"<p class="muted">replay: <em>replays</em> = journaled, a resumed run is answered from the journal; <em>re-runs</em> = started but not finished, a resumed run executes it again; <em>live</em> = a <code>replay = false</code> tool, executed every time.</p>"#,
        );
    }
    body.push_str("</section></div>");
    page_html(&format!("Run {}", detail.run_id), &body)
}

fn timeline(body: &mut String, run_id: &str, steps: &[StepView]) {
    let t0 = steps.iter().map(|s| s.started_at_ms).min().unwrap_or(0);
    let t1 = steps.iter().map(|s| s.finished_at_ms.unwrap_or(s.started_at_ms)).max().unwrap_or(t0);
    let span = (t1 - t0).max(1) as f64;
    body.push_str(
        "<table id=\"steps\"><thead><tr><th>#</th><th>kind</th><th>name</th><th>status</th><th>duration</th><th>timeline</th><th>key</th><th>replay</th><th>args</th><th>result</th><th>tokens</th></tr></thead><tbody>\n",
    );
    for s in steps {
        let left = (s.started_at_ms - t0) as f64 / span * 100.0;
        let width = s.duration_ms.map_or(0.0, |d| d as f64 / span * 100.0);
        let status_class = match s.status {
            StepStatus::Failed => "failed",
            StepStatus::Running => "running",
            StepStatus::Finished => "finished",
        };
        let result = match (&s.error, &s.result) {
            (Some(e), _) => details(&s.result_preview(50), e, &value_href(run_id, s.ordinal, "error")),
            (None, Some(r)) => details(&s.result_preview(50), r, &value_href(run_id, s.ordinal, "result")),
            (None, None) => String::new(),
        };
        let _ = writeln!(
            body,
            r#"<tr data-ordinal="{ord}" data-kind="{kind}"><td>{ord}</td><td>{kind}</td><td>{name}</td><td><span class="badge {status_class}">{status}</span></td><td>{dur}</td><td><div class="bar"><span style="left:{left:.2}%;width:{width:.2}%"></span></div></td><td><code title="{key}">{prefix}</code></td><td>{replay}</td><td>{args}</td><td>{result}</td><td class="tokens">{tokens}</td></tr>"#,
            ord = s.ordinal,
            kind = s.kind.as_str(),
            name = esc(&s.name),
            status = s.status.as_str(),
            dur = s.duration_ms.map(duration).unwrap_or_else(|| "-".into()),
            key = esc(&s.key),
            prefix = esc(s.key_prefix()),
            replay = s.replay.as_str(),
            args = s
                .args
                .as_ref()
                .map(|a| details(&s.args_preview(40), a, &value_href(run_id, s.ordinal, "args")))
                .unwrap_or_default(),
            tokens = s.usage.map(|u| esc(&crate::view::tokens(&u))).unwrap_or_default(),
        );
    }
    body.push_str("</tbody></table>");
}

/// Where the whole `part` (args, result, error) of step `ordinal` is served.
fn value_href(run_id: &str, ordinal: u64, part: &str) -> String {
    format!("/runs/{}/steps/{ordinal}/{part}", url(run_id))
}

/// A one-line summary that expands to the pretty-printed value, cut after [`VALUE_CHARS`]
/// characters with a link to the whole of it (a page of megabyte results stays light).
fn details(summary: &str, value: &Value, href: &str) -> String {
    let full = serde_json::to_string_pretty(value).unwrap_or_default();
    let total = full.chars().count();
    if total <= VALUE_CHARS {
        return format!("<details><summary>{}</summary><pre>{}</pre></details>", esc(summary), esc(&full));
    }
    let head: String = full.chars().take(VALUE_CHARS).collect();
    format!(
        r#"<details><summary>{}</summary><pre>{}</pre><p class="cut">… {} more characters: <a href="{}">the whole value</a></p></details>"#,
        esc(summary),
        esc(&head),
        total - VALUE_CHARS,
        attr(href),
    )
}

/// One step's whole `part` (args, result or error), pretty-printed.
pub fn value(run_id: &str, ordinal: u64, part: &str, value: &Value) -> String {
    let full = serde_json::to_string_pretty(value).unwrap_or_default();
    let from = (ordinal / STEPS_PER_PAGE as u64) * STEPS_PER_PAGE as u64;
    page_html(
        &format!("Run {run_id} step {ordinal} {part}"),
        &format!(
            r#"<p><a href="/runs/{href}?from={from}">&larr; run {id}</a></p><h1>Step {ordinal}: {part}</h1><pre id="value" class="args">{value}</pre>"#,
            href = url(run_id),
            id = esc(run_id),
            value = esc(&full),
        ),
    )
}

/// The login page: a token field when tokens are configured.
pub fn login(has_tokens: bool, error: Option<&str>) -> String {
    let mut body = String::from("<h1>Log in</h1>");
    if let Some(e) = error {
        let _ = write!(body, r#"<div class="error" id="error">{}</div>"#, esc(e));
    }
    if has_tokens {
        body.push_str(
            r#"<form method="post" action="/login" id="login"><label>token <input type="password" name="token" autocomplete="current-password" required></label> <button type="submit">log in</button></form><p class="muted">Your token names you: decisions are recorded under that name.</p>"#,
        );
    } else {
        body.push_str(r#"<p class="muted">This console is reached through an authenticating proxy.</p>"#);
    }
    page_html("Log in", &body)
}

/// An error page.
pub fn error(title: &str, message: &str) -> String {
    page_html(
        title,
        &format!(
            r#"<p><a href="/">&larr; all runs</a></p><h1>{}</h1><div class="error" id="error">{}</div>"#,
            esc(title),
            esc(message)
        ),
    )
}
