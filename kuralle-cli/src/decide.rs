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

/// Approves (`reason == None`) or denies the pending request `request_id` of run `run_id`.
pub async fn decide(
    store: &dyn RunStore,
    run_id: &str,
    request_id: &str,
    by: &str,
    deny_reason: Option<&str>,
) -> Result<Decided, CliError> {
    let by = by.trim();
    if by.is_empty() {
        return Err(CliError::Console("a decision needs the name of who decides (--by)".into()));
    }
    let record = store.get_run(run_id).await?.ok_or_else(|| CliError::UnknownRun(run_id.to_owned()))?;
    let pending = pending_approvals(&record);
    if !pending.iter().any(|p| p.request_id == request_id) {
        let hint = if pending.is_empty() {
            format!(" (the run is {}, waiting on nothing)", record.status.as_str())
        } else {
            let ids: Vec<&str> = pending.iter().map(|p| p.request_id.as_str()).collect();
            format!(" (it waits on: {})", ids.join(", "))
        };
        return Err(CliError::NotPending { run_id: run_id.to_owned(), request_id: request_id.to_owned(), hint });
    }
    if let Some(earlier) = recorded_decisions(&record, &store.steps(run_id).await?).remove(request_id) {
        let what = if earlier.approved { "approved" } else { "denied" };
        return Err(CliError::AlreadyDecided {
            run_id: run_id.to_owned(),
            request_id: request_id.to_owned(),
            by: format!(" ({what} by {})", earlier.by),
        });
    }
    let decision = match deny_reason {
        None => Decision::approve(by),
        Some(reason) => Decision::deny(by, reason),
    }
    .for_request(request_id);
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
            hint: " (it was resumed or decided meanwhile)".to_owned(),
        }),
        Err(e) => Err(e.into()),
    }
}
