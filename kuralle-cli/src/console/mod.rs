//! `kuralle console`: a web page over the store — runs with status filters, a run's timeline,
//! and Approve / Deny forms. Server-side rendered HTML on axum; no JavaScript.
//!
//! Authentication ([`auth`]) is off only on loopback; beyond it, a token or a trusted proxy
//! header names the person, and that name is who decides. Every response forbids framing
//! (clickjacking), only listed `Host`s are answered (DNS rebinding), and a decision needs the
//! session's anti-forgery token and a same-origin post (cross-site request forgery).

mod auth;
mod guard;
mod html;
mod pages;

use std::{net::SocketAddr, sync::Arc};

use axum::{
    Extension, Form, Router,
    extract::{ConnectInfo, Path, Query, Request, State},
    http::{HeaderMap, HeaderValue, StatusCode, header},
    middleware::{self, Next},
    response::{Html, IntoResponse, Redirect, Response},
    routing::{get, post},
};
use kuralle::{RunStatus, RunStore};
use serde::Deserialize;

use self::auth::{Auth, Caller, Refusal};
use crate::{args::ConsoleArgs, decide, error::CliError, lifecycle, view};

struct Console {
    store: Arc<dyn RunStore>,
    auth: Auth,
    hosts: guard::Hosts,
}

type Shared = Arc<Console>;

/// Serves the console until Ctrl-C.
pub async fn serve(args: ConsoleArgs, store: Arc<dyn RunStore>) -> Result<(), CliError> {
    let operator = args
        .operator
        .or_else(|| std::env::var("USER").ok())
        .filter(|o| !o.trim().is_empty())
        .unwrap_or_else(|| "operator".to_owned());
    let env_token = std::env::var("KURALLE_CONSOLE_TOKEN").ok();
    let tokens = auth::load_tokens(args.token_file.as_deref(), env_token.as_deref(), &operator)?;
    let auth = Auth::new(tokens, args.trust_proxy_header.as_deref(), operator)?;
    let loopback = args.listen.ip().is_loopback();
    if !loopback && auth.is_off() {
        return Err(CliError::Console(format!(
            "{} is not a loopback address: give the console a way to know who decides (--token-file PATH or KURALLE_CONSOLE_TOKEN, or --trust-proxy-header HEADER behind an authenticating reverse proxy)",
            args.listen
        )));
    }
    if !loopback && args.allowed_hosts.is_empty() {
        return Err(CliError::Console(format!(
            "{} is not a loopback address: name the hosts clients reach the console by with --allowed-host (the Host check keeps DNS rebinding out)",
            args.listen
        )));
    }
    let listener = tokio::net::TcpListener::bind(args.listen)
        .await
        .map_err(|e| CliError::Console(format!("cannot listen on {}: {e}", args.listen)))?;
    let addr: SocketAddr = listener.local_addr()?;
    let state = Arc::new(Console { store, auth, hosts: guard::Hosts::new(&args.allowed_hosts) });
    // Tests and scripts read the address from this line (port 0 picks a free port).
    println!("kuralle console listening on http://{addr}");
    axum::serve(listener, router(state).into_make_service_with_connect_info::<SocketAddr>())
        .with_graceful_shutdown(async {
            let _ = tokio::signal::ctrl_c().await;
        })
        .await
        .map_err(|e| CliError::Console(e.to_string()))
}

fn router(state: Shared) -> Router {
    let authenticated = Router::new()
        .route("/", get(list))
        .route("/runs/{id}", get(run_page))
        .route("/runs/{id}/decide", post(decide_form))
        .route("/runs/{id}/cancel", post(cancel_form))
        .route("/runs/{id}/retry", post(retry_form))
        .route("/runs/{id}/fork", post(fork_form))
        .route("/runs/{id}/steps/{ordinal}/{part}", get(step_value))
        .route("/logout", post(logout))
        .layer(middleware::from_fn_with_state(state.clone(), authenticate));
    Router::new()
        .route("/login", get(login_page).post(login))
        .merge(authenticated)
        // Outermost last: every response, refusals included, carries the security headers.
        .layer(middleware::from_fn_with_state(state.clone(), known_host))
        .layer(middleware::from_fn(guard::security_headers))
        .with_state(state)
}

/// Refuses requests addressed to a host the console was not told about: a page on another
/// site that rebinds its DNS name to the console's address must not read or steer runs.
async fn known_host(State(state): State<Shared>, request: Request, next: Next) -> Response {
    let host = request.headers().get(header::HOST).and_then(|h| h.to_str().ok()).unwrap_or_default();
    if state.hosts.allows(host) {
        next.run(request).await
    } else {
        let message = format!("this console does not answer host `{host}` (see --allowed-host)");
        refuse(StatusCode::MISDIRECTED_REQUEST, "Wrong host", &message)
    }
}

/// Lets in only a known caller, and hands handlers who it is.
async fn authenticate(
    State(state): State<Shared>,
    ConnectInfo(remote): ConnectInfo<SocketAddr>,
    mut request: Request,
    next: Next,
) -> Response {
    match state.auth.caller(request.headers(), &remote.to_string()) {
        Ok(caller) => {
            let cookie = caller.new_session.clone();
            request.extensions_mut().insert(caller);
            let mut response = next.run(request).await;
            if let Some(id) = cookie {
                set_cookie(&mut response, &auth::session_cookie(&id));
            }
            response
        }
        Err(Refusal::Login(why)) => {
            let mut response =
                (StatusCode::UNAUTHORIZED, Html(pages::login(state.auth.has_tokens(), Some(why)))).into_response();
            response.headers_mut().insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
            response
        }
        Err(Refusal::NoProxyUser(name)) => refuse(
            StatusCode::UNAUTHORIZED,
            "Not authenticated",
            &format!("requests must come through the authenticating proxy, which names the user in `{name}`"),
        ),
    }
}

fn set_cookie(response: &mut Response, cookie: &str) {
    if let Ok(value) = HeaderValue::from_str(cookie) {
        response.headers_mut().append(header::SET_COOKIE, value);
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

async fn login_page(State(state): State<Shared>) -> Response {
    if state.auth.is_off() {
        return Redirect::to("/").into_response();
    }
    Html(pages::login(state.auth.has_tokens(), None)).into_response()
}

#[derive(Deserialize)]
struct LoginForm {
    token: String,
}

async fn login(State(state): State<Shared>, headers: HeaderMap, Form(form): Form<LoginForm>) -> Response {
    if let Err(message) = guard::same_origin(&headers) {
        return refuse(StatusCode::FORBIDDEN, "Refused", &message);
    }
    match state.auth.token_identity(form.token.trim()) {
        Some(identity) => {
            let (id, _) = state.auth.start_session(&identity);
            let mut response = Redirect::to("/").into_response();
            set_cookie(&mut response, &auth::session_cookie(&id));
            response
        }
        None => {
            // A pause per wrong guess slows guessing through the form down.
            tokio::time::sleep(std::time::Duration::from_millis(300)).await;
            (StatusCode::UNAUTHORIZED, Html(pages::login(state.auth.has_tokens(), Some("that token is not valid"))))
                .into_response()
        }
    }
}

#[derive(Deserialize)]
struct CsrfForm {
    #[serde(default)]
    csrf: String,
}

async fn logout(
    State(state): State<Shared>,
    Extension(caller): Extension<Caller>,
    headers: HeaderMap,
    Form(form): Form<CsrfForm>,
) -> Response {
    if let Some(refused) = refuse_post(&headers, &caller, &form.csrf) {
        return refused;
    }
    if let Some(id) = auth::session_id(&headers) {
        state.auth.end_session(&id);
    }
    let mut response = Redirect::to("/login").into_response();
    set_cookie(&mut response, &auth::clear_cookie());
    response
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

/// The only notices a page shows come from this fixed list: no operator text travels in a URL.
#[derive(Deserialize)]
struct RunParams {
    done: Option<String>,
    from: Option<u64>,
}

async fn run_page(
    State(state): State<Shared>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
    Query(params): Query<RunParams>,
) -> Response {
    let notice = match params.done.as_deref() {
        Some("approved") => Some("Approved. The run's owner (or a worker) resumes it."),
        Some("denied") => Some("Denied. The run's owner (or a worker) resumes it; the model is told the reason."),
        Some("cancelled") => Some("Cancelled. An owner still running it stops at its next step."),
        Some("retried") => Some("Runnable again: a worker (or the owner's resume) continues it from its journal."),
        Some("forked") => Some("Forked: this run continues from the copied journal, on a worker or a resume."),
        _ => None,
    };
    match view::show(state.store.as_ref(), &id).await {
        Ok(detail) => Html(pages::run(&detail, &caller, notice, None, params.from)).into_response(),
        Err(e) => failure(&e),
    }
}

/// One step's whole arguments, result or error (the timeline cuts long ones).
async fn step_value(State(state): State<Shared>, Path((id, ordinal, part)): Path<(String, u64, String)>) -> Response {
    let detail = match view::show(state.store.as_ref(), &id).await {
        Ok(detail) => detail,
        Err(e) => return failure(&e),
    };
    let step = detail.steps.iter().find(|s| s.ordinal == ordinal);
    let value = step.and_then(|s| match part.as_str() {
        "args" => s.args.as_ref(),
        "result" => s.result.as_ref(),
        "error" => s.error.as_ref(),
        _ => None,
    });
    match value {
        Some(v) => Html(pages::value(&id, ordinal, &part, v)).into_response(),
        None => refuse(StatusCode::NOT_FOUND, "Not found", &format!("run `{id}` has no {part} at step {ordinal}")),
    }
}

/// A post from another site, or without the session's form token, refused (`None`: go on).
fn refuse_post(headers: &HeaderMap, caller: &Caller, csrf: &str) -> Option<Response> {
    let checked = guard::same_origin(headers).and_then(|()| guard::csrf(caller, csrf));
    checked.err().map(|message| refuse(StatusCode::FORBIDDEN, "Refused", &message))
}

#[derive(Deserialize)]
struct DecideForm {
    request_id: String,
    decision: String,
    reason: Option<String>,
    #[serde(default)]
    csrf: String,
}

async fn decide_form(
    State(state): State<Shared>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
    headers: HeaderMap,
    Form(form): Form<DecideForm>,
) -> Response {
    if let Some(refused) = refuse_post(&headers, &caller, &form.csrf) {
        return refused;
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
    let via = decide::Via { channel: "console", origin: caller.origin.clone() };
    match decide::decide(store, &id, &form.request_id, &caller.identity, reason.as_deref(), via).await {
        Ok(d) => Redirect::to(&format!("/runs/{}?done={}", html::url(&id), d.decision)).into_response(),
        Err(e @ (CliError::NotPending { .. } | CliError::AlreadyDecided { .. } | CliError::Busy { .. })) => {
            // Show the run as it is now, with why the decision was not taken.
            match view::show(store, &id).await {
                Ok(detail) => {
                    (StatusCode::CONFLICT, Html(pages::run(&detail, &caller, None, Some(&e.to_string()), None)))
                        .into_response()
                }
                Err(_) => failure(&e),
            }
        }
        Err(e) => failure(&e),
    }
}

/// The run page's Cancel button.
async fn cancel_form(
    State(state): State<Shared>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
    headers: HeaderMap,
    Form(form): Form<CsrfForm>,
) -> Response {
    if let Some(refused) = refuse_post(&headers, &caller, &form.csrf) {
        return refused;
    }
    match lifecycle::cancel(state.store.as_ref(), &id).await {
        Ok(_) => Redirect::to(&format!("/runs/{}?done=cancelled", html::url(&id))).into_response(),
        Err(e) => failure(&e),
    }
}

/// The run page's Retry button (a failed run).
async fn retry_form(
    State(state): State<Shared>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
    headers: HeaderMap,
    Form(form): Form<CsrfForm>,
) -> Response {
    if let Some(refused) = refuse_post(&headers, &caller, &form.csrf) {
        return refused;
    }
    match lifecycle::retry(state.store.as_ref(), &id).await {
        Ok(()) => Redirect::to(&format!("/runs/{}?done=retried", html::url(&id))).into_response(),
        Err(e) => failure(&e),
    }
}

#[derive(Deserialize)]
struct ForkForm {
    at: u64,
    instructions: Option<String>,
    #[serde(default)]
    csrf: String,
}

/// The run page's Fork form: a new run with the journal before step `at`; shows the fork.
async fn fork_form(
    State(state): State<Shared>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
    headers: HeaderMap,
    Form(form): Form<ForkForm>,
) -> Response {
    if let Some(refused) = refuse_post(&headers, &caller, &form.csrf) {
        return refused;
    }
    let instructions = form.instructions.map(|i| i.trim().to_owned()).filter(|i| !i.is_empty());
    match lifecycle::fork(state.store.as_ref(), &id, form.at, None, None, instructions).await {
        Ok(fork) => Redirect::to(&format!("/runs/{}?done=forked", html::url(&fork))).into_response(),
        Err(e) => failure(&e),
    }
}
