//! Approval: a call that waits for a human decision, the id a human decides on, and the
//! decision as the journal keeps it. Below dispatch, which pauses on a pending call and reads
//! recorded decisions; the run loop records them.

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// A tool call waiting for a human decision.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PendingApproval {
    /// Request id to decide on.
    pub request_id: String,
    /// The model's id for the call.
    pub call_id: String,
    /// Tool name.
    pub name: String,
    /// The call's arguments.
    pub args: Value,
}

/// A human decision as journaled.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RecordedDecision {
    /// Approved (`true`) or denied.
    pub approved: bool,
    /// Who decided.
    pub by: String,
    /// Why, for a denial.
    pub reason: Option<String>,
}

/// A call waiting for a human decision, and the journal key its decision is recorded under
/// (kept in a paused run's state).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct Pending {
    pub(crate) request: PendingApproval,
    pub(crate) decision_key: String,
}

/// The format of a request id: `approval-` and the first 24 hex digits of the decision's
/// journal key, so a decided request can be found in the journal after the run moved on.
pub(crate) struct RequestId;

impl RequestId {
    const PREFIX: &'static str = "approval-";
    const KEY_DIGITS: usize = 24;

    /// The request id of the decision journaled under `decision_key`.
    pub(crate) fn for_decision_key(decision_key: &str) -> String {
        format!("{}{}", Self::PREFIX, &decision_key[..Self::KEY_DIGITS.min(decision_key.len())])
    }

    /// The start of the decision key that `request_id` names, if it is a request id.
    pub(crate) fn key_prefix(request_id: &str) -> Option<&str> {
        request_id.strip_prefix(Self::PREFIX)
    }
}

#[cfg(test)]
mod tests {
    use super::RequestId;

    #[test]
    fn request_ids_name_their_decision_key() {
        let key = "0dfce4140293b9306a9876f4d21049027c55c0511e8032e9c8c00c967e0a522a";
        let id = RequestId::for_decision_key(key);
        assert_eq!(id, "approval-0dfce4140293b9306a9876f4");
        assert!(key.starts_with(RequestId::key_prefix(&id).unwrap()));
        assert_eq!(RequestId::key_prefix("call-1"), None);
    }
}
