//! `kuralle console`: a local web page over the store — runs with status filters, a run's
//! timeline, and Approve / Deny forms. Server-side rendered HTML on axum; no JavaScript.
//!
//! It has no authentication, so it binds loopback by default, answers only requests whose
//! `Host` is a loopback name (DNS rebinding), and records a decision only from a same-origin
//! form post (cross-site request forgery).

mod html;
mod pages;

use std::{net::SocketAddr, sync::Arc};

use axum::{
    Form, Router,
    extract::{Path, Query, Request, State},
    http::{HeaderMap, StatusCode, header},
    middleware::{self, Next},
    response::{Html, IntoResponse, Redirect, Response},
    routing::{get, post},
};
use kuralle::{RunStatus, RunStore};
use serde::Deserialize;

use crate::{args::ConsoleArgs, decide, error::CliError, lifecycle, view};

struct Console {
    store: Arc<dyn RunStore>,
    operator: String,
    allow_remote: bool,
}

type Shared = Arc<Console>;

/// Serves the console until Ctrl-C.
pub async fn serve(args: ConsoleArgs, store: Arc<dyn RunStore>) -> Result<(), CliError> {
    if !args.listen.ip().is_loopback() && !args.allow_remote {
        return Err(CliError::Console(format!(
            "{} is not a loopback address and the console has no authentication; to expose it, put it behind an authenticating reverse proxy and pass --allow-remote",
            args.listen
        )));
    }
    let listener = tokio::net::TcpListener::bind(args.listen)
        .await
        .map_err(|e| CliError::Console(format!("cannot listen on {}: {e}", args.listen)))?;
    let addr: SocketAddr = listener.local_addr()?;
    let operator = args
        .operator
        .or_else(|| std::env::var("USER").ok())
        .filter(|o| !o.trim().is_empty())
        .unwrap_or_else(|| "operator".to_owned());
    let state = Arc::new(Console { store, operator, allow_remote: args.allow_remote });
    // Tests and scripts read the address from this line (port 0 picks a free port).
    println!("kuralle console listening on http://{addr}");
    axum::serve(listener, router(state))
        .with_graceful_shutdown(async {
            let _ = tokio::signal::ctrl_c().await;
        })
        .await
        .map_err(|e| CliError::Console(e.to_string()))
}

fn router(state: Shared) -> Router {
    Router::new()
        .route("/", get(list))
        .route("/runs/{id}", get(run_page))
        .route("/runs/{id}/decide", post(decide_form))
        .route("/runs/{id}/cancel", post(cancel_form))
        .route("/runs/{id}/retry", post(retry_form))
        .route("/runs/{id}/fork", post(fork_form))
        .layer(middleware::from_fn_with_state(state.clone(), loopback_host))
        .with_state(state)
}

/// Refuses requests addressed to a non-loopback host name: a page on another site that
/// rebinds its DNS name to 127.0.0.1 must not read or steer runs.
async fn loopback_host(State(state): State<Shared>, request: Request, next: Next) -> Response {
    if state.allow_remote {
        return next.run(request).await;
    }
    let host = request.headers().get(header::HOST).and_then(|h| h.to_str().ok()).unwrap_or_default();
    if is_loopback_host(host) {
        next.run(request).await
    } else {
        refuse(
            StatusCode::MISDIRECTED_REQUEST,
            "Wrong host",
            &format!("this console answers loopback hosts only, not `{host}`"),
        )
    }
}

fn is_loopback_host(host: &str) -> bool {
    let name = match host.strip_prefix('[') {
        Some(v6) => v6.split(']').next().unwrap_or_default(),
        None => host.rsplit_once(':').map_or(host, |(name, _)| name),
    };
    name.eq_ignore_ascii_case("localhost") || name.parse::<std::net::IpAddr>().is_ok_and(|ip| ip.is_loopback())
}

/// A form post must come from this console's own pages.
fn same_origin(headers: &HeaderMap) -> Result<(), String> {
    if headers.get("sec-fetch-site").and_then(|v| v.to_str().ok()) == Some("cross-site") {
        return Err("cross-site form posts are refused".to_owned());
    }
    let host = headers.get(header::HOST).and_then(|h| h.to_str().ok()).unwrap_or_default();
    match headers.get(header::ORIGIN).and_then(|o| o.to_str().ok()) {
        Some(origin) if origin == format!("http://{host}") || origin == format!("https://{host}") => Ok(()),
        Some(origin) => Err(format!("a form post from origin `{origin}` is refused")),
        None => Ok(()),
    }
}

fn refuse(status: StatusCode, title: &str, message: &str) -> Response {
    (status, Html(pages::error(title, message))).into_response()
}

fn failure(e: &CliError) -> Response {
    let status = match e {
        CliError::UnknownRun(_) => StatusCode::NOT_FOUND,
        CliError::NotPending { .. }
        | CliError::AlreadyDecided { .. }
        | CliError::Busy { .. }
        | CliError::NotCancellable { .. }
        | CliError::Run(kuralle::RunError::WrongStatus { .. }) => StatusCode::CONFLICT,
        CliError::Store(s) if s.is_retryable() => StatusCode::SERVICE_UNAVAILABLE,
        CliError::Store(_) => StatusCode::INTERNAL_SERVER_ERROR,
        _ => StatusCode::BAD_REQUEST,
    };
    refuse(status, "Error", &e.to_string())
}

#[derive(Deserialize)]
struct ListParams {
    status: Option<String>,
    agent: Option<String>,
    /// A run id prefix.
    q: Option<String>,
    /// 1-based.
    page: Option<usize>,
}

/// Runs per page of the list.
const PAGE: usize = 50;

async fn list(State(state): State<Shared>, Query(params): Query<ListParams>) -> Response {
    let status = match params.status.as_deref().filter(|s| !s.is_empty()) {
        None => None,
        Some(s) => match RunStatus::parse(s) {
            Some(st) => Some(st),
            None => return refuse(StatusCode::BAD_REQUEST, "Bad filter", &format!("unknown status `{s}`")),
        },
    };
    let page = params.page.unwrap_or(1).max(1);
    let mut query = view::ListQuery {
        status,
        agent: params.agent.filter(|a| !a.trim().is_empty()),
        prefix: params.q.map(|q| q.trim().to_owned()).filter(|q| !q.is_empty()),
        offset: (page - 1).saturating_mul(PAGE),
        // One more than a page says whether there is a next one.
        limit: Some(PAGE + 1),
    };
    match view::list(state.store.as_ref(), &query).await {
        Ok(mut rows) => {
            let more = rows.len() > PAGE;
            rows.truncate(PAGE);
            query.limit = Some(PAGE);
            Html(pages::runs(&rows, &query, page, more)).into_response()
        }
        Err(e) => failure(&e),
    }
}

#[derive(Deserialize)]
struct RunParams {
    notice: Option<String>,
}

async fn run_page(State(state): State<Shared>, Path(id): Path<String>, Query(params): Query<RunParams>) -> Response {
    match view::show(state.store.as_ref(), &id).await {
        Ok(detail) => Html(pages::run(&detail, &state.operator, params.notice.as_deref(), None)).into_response(),
        Err(e) => failure(&e),
    }
}

#[derive(Deserialize)]
struct DecideForm {
    request_id: String,
    decision: String,
    by: String,
    reason: Option<String>,
}

async fn decide_form(
    State(state): State<Shared>,
    Path(id): Path<String>,
    headers: HeaderMap,
    Form(form): Form<DecideForm>,
) -> Response {
    if let Err(message) = same_origin(&headers) {
        return refuse(StatusCode::FORBIDDEN, "Refused", &message);
    }
    let reason = match form.decision.as_str() {
        "approve" => None,
        "deny" => match form.reason.as_deref().map(str::trim).filter(|r| !r.is_empty()) {
            Some(r) => Some(r.to_owned()),
            None => {
                return refuse(StatusCode::BAD_REQUEST, "Reason needed", "a denial needs a reason (the model is told)");
            }
        },
        other => return refuse(StatusCode::BAD_REQUEST, "Bad decision", &format!("unknown decision `{other}`")),
    };
    let store = state.store.as_ref();
    match decide::decide(store, &id, &form.request_id, &form.by, reason.as_deref()).await {
        Ok(d) => {
            let notice = format!("{} {} by {}; the run's owner resumes it", d.decision, d.request_id, d.by);
            Redirect::to(&format!("/runs/{}?notice={}", html::url(&id), html::url(&notice))).into_response()
        }
        Err(e @ (CliError::NotPending { .. } | CliError::AlreadyDecided { .. } | CliError::Busy { .. })) => {
            // Show the run as it is now, with why the decision was not taken.
            match view::show(store, &id).await {
                Ok(detail) => {
                    (StatusCode::CONFLICT, Html(pages::run(&detail, &state.operator, None, Some(&e.to_string()))))
                        .into_response()
                }
                Err(_) => failure(&e),
            }
        }
        Err(e) => failure(&e),
    }
}

/// The run page's Cancel button.
async fn cancel_form(State(state): State<Shared>, Path(id): Path<String>, headers: HeaderMap) -> Response {
    if let Err(message) = same_origin(&headers) {
        return refuse(StatusCode::FORBIDDEN, "Refused", &message);
    }
    match lifecycle::cancel(state.store.as_ref(), &id).await {
        Ok(c) => {
            let notice = format!("cancelled (was {}); an owner stops at its next step", c.was);
            Redirect::to(&format!("/runs/{}?notice={}", html::url(&id), html::url(&notice))).into_response()
        }
        Err(e) => failure(&e),
    }
}

/// The run page's Retry button (a failed run).
async fn retry_form(State(state): State<Shared>, Path(id): Path<String>, headers: HeaderMap) -> Response {
    if let Err(message) = same_origin(&headers) {
        return refuse(StatusCode::FORBIDDEN, "Refused", &message);
    }
    match lifecycle::retry(state.store.as_ref(), &id).await {
        Ok(()) => {
            let notice = "runnable again; a worker (or the owner's resume) continues it from its journal";
            Redirect::to(&format!("/runs/{}?notice={}", html::url(&id), html::url(notice))).into_response()
        }
        Err(e) => failure(&e),
    }
}

#[derive(Deserialize)]
struct ForkForm {
    at: u64,
    instructions: Option<String>,
}

/// The run page's Fork form: a new run with the journal before step `at`; shows the fork.
async fn fork_form(
    State(state): State<Shared>,
    Path(id): Path<String>,
    headers: HeaderMap,
    Form(form): Form<ForkForm>,
) -> Response {
    if let Err(message) = same_origin(&headers) {
        return refuse(StatusCode::FORBIDDEN, "Refused", &message);
    }
    let instructions = form.instructions.map(|i| i.trim().to_owned()).filter(|i| !i.is_empty());
    match lifecycle::fork(state.store.as_ref(), &id, form.at, None, None, instructions).await {
        Ok(fork) => {
            let notice = format!("forked from {id} at step {}; a worker (or resume) continues it", form.at);
            Redirect::to(&format!("/runs/{}?notice={}", html::url(&fork), html::url(&notice))).into_response()
        }
        Err(e) => failure(&e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loopback_hosts() {
        for ok in ["127.0.0.1:7878", "localhost:80", "localhost", "[::1]:7878", "127.1.2.3"] {
            assert!(is_loopback_host(ok), "{ok}");
        }
        for bad in ["evil.example:7878", "10.0.0.1:7878", "", "[2001:db8::1]:80"] {
            assert!(!is_loopback_host(bad), "{bad}");
        }
    }

    #[test]
    fn only_same_origin_posts() {
        let mut h = HeaderMap::new();
        h.insert(header::HOST, "127.0.0.1:7878".parse().unwrap());
        assert!(same_origin(&h).is_ok());
        h.insert(header::ORIGIN, "http://127.0.0.1:7878".parse().unwrap());
        assert!(same_origin(&h).is_ok());
        h.insert(header::ORIGIN, "http://evil.example".parse().unwrap());
        assert!(same_origin(&h).is_err());
        h.insert(header::ORIGIN, "null".parse().unwrap());
        assert!(same_origin(&h).is_err());
    }
}
