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

/// A human decision as journaled: what was decided, by whom, when, from where and why.
///
/// The audit fields are optional so that journals written before they existed still read.
///
/// ```
/// use kuralle::inspect::{DecisionClock, RecordedDecision};
///
/// let old: RecordedDecision = serde_json::from_str(r#"{"approved":true,"by":"alice","reason":null}"#).unwrap();
/// assert_eq!((old.at_ms, old.channel), (None, None));
/// let new: RecordedDecision = serde_json::from_str(
///     r#"{"approved":false,"by":"bob","reason":"too much","at_ms":1700000000000,"clock":"store","channel":"console","origin":"10.0.0.7"}"#,
/// ).unwrap();
/// assert_eq!(new.clock, Some(DecisionClock::Store));
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RecordedDecision {
    /// Approved (`true`) or denied.
    pub approved: bool,
    /// Who decided: the identity the deciding channel authenticated.
    pub by: String,
    /// Why, for a denial.
    pub reason: Option<String>,
    /// When, in milliseconds since the Unix epoch, by [`clock`](Self::clock).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub at_ms: Option<i64>,
    /// Whose clock [`at_ms`](Self::at_ms) was read from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub clock: Option<DecisionClock>,
    /// The channel the decision came through: `cli`, `console` or `api` (see
    /// [`Decision::via`](crate::Decision::via)).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub channel: Option<String>,
    /// Where it came from within the channel: a remote address, a proxy's user, a local user.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub origin: Option<String>,
}

/// The clock a decision's time was read from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DecisionClock {
    /// The store's clock, as it stamped the lease the decision was recorded under (for
    /// PostgreSQL the database server's; for SQLite and memory stores, the writing process's,
    /// which is the store's).
    Store,
    /// The clock of the process that wrote the decision.
    Process,
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
