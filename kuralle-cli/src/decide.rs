//! `runs approve` / `runs deny` and the console's buttons: a decision recorded through
//! [`kuralle::record_decision`], the code path of `Runtime::deliver`. Only the decision is
//! recorded here; the process that owns the run (or a worker) resumes it.

use kuralle::{
    Decision, RunError, RunStore,
    inspect::{pending_approvals, recorded_decisions},
};
use serde::Serialize;

use crate::error::CliError;

/// A recorded decision, as reported.
#[derive(Debug, Clone, Serialize)]
pub struct Decided {
    /// Run id.
    pub run_id: String,
    /// The request decided.
    pub request_id: String,
    /// `approved` or `denied`.
    pub decision: &'static str,
    /// Who decided.
    pub by: String,
    /// Why, for a denial.
    pub reason: Option<String>,
}

/// Where a decision comes from, for the audit trail.
#[derive(Debug, Clone)]
pub struct Via {
    /// `cli` or `console`.
    pub channel: &'static str,
    /// A remote address, a proxy's user, a local user.
    pub origin: String,
}

impl Via {
    /// This command line, run by the local user.
    pub fn cli() -> Self {
        let user = std::env::var("USER").ok().filter(|u| !u.is_empty()).unwrap_or_else(|| "unknown".to_owned());
        Self { channel: "cli", origin: format!("local user {user}") }
    }
}

/// Approves (`deny_reason == None`) or denies the pending request `request_id` of run
/// `run_id`. [`kuralle::record_decision`] judges (it takes the run's lease, so a decision
/// never races the run's owner); the store is read only to say more in an error.
pub async fn decide(
    store: &dyn RunStore,
    run_id: &str,
    request_id: &str,
    by: &str,
    deny_reason: Option<&str>,
    via: Via,
) -> Result<Decided, CliError> {
    let by = by.trim();
    if by.is_empty() {
        return Err(CliError::NoDecider);
    }
    let decision = match deny_reason {
        None => Decision::approve(by),
        Some(reason) => Decision::deny(by, reason),
    }
    .for_request(request_id)
    .via(via.channel, via.origin);
    match kuralle::record_decision(store, run_id, &decision).await {
        Ok(()) => Ok(Decided {
            run_id: run_id.to_owned(),
            request_id: request_id.to_owned(),
            decision: if deny_reason.is_none() { "approved" } else { "denied" },
            by: by.to_owned(),
            reason: deny_reason.map(str::to_owned),
        }),
        Err(RunError::NotPending { .. }) => Err(CliError::NotPending {
            run_id: run_id.to_owned(),
            request_id: request_id.to_owned(),
            hint: waiting_hint(store, run_id).await,
        }),
        Err(RunError::AlreadyDecided { .. }) => Err(CliError::AlreadyDecided {
            run_id: run_id.to_owned(),
            request_id: request_id.to_owned(),
            by: earlier_decision(store, run_id, request_id).await,
        }),
        Err(e) => Err(e.into()),
    }
}

/// " (it waits on: …)" or " (the run is finished, waiting on nothing)".
async fn waiting_hint(store: &dyn RunStore, run_id: &str) -> String {
    let Ok(Some(record)) = store.get_run(run_id).await else { return String::new() };
    let pending = pending_approvals(&record);
    if pending.is_empty() {
        format!(" (the run is {}, waiting on nothing)", record.status.as_str())
    } else {
        let ids: Vec<&str> = pending.iter().map(|p| p.request_id.as_str()).collect();
        format!(" (it waits on: {})", ids.join(", "))
    }
}

/// " (approved by alice)" when the earlier decision is still shown as pending, else "".
async fn earlier_decision(store: &dyn RunStore, run_id: &str, request_id: &str) -> String {
    let (Ok(Some(record)), Ok(steps)) = (store.get_run(run_id).await, store.steps(run_id).await) else {
        return String::new();
    };
    recorded_decisions(&record, &steps)
        .remove(request_id)
        .map(|d| format!(" ({} by {})", if d.approved { "approved" } else { "denied" }, d.by))
        .unwrap_or_default()
}
