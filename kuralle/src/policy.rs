//! Approval policies: per call, from the tool name and the model's raw arguments, whether a
//! call runs, waits for a human, or is refused.
//!
//! A policy is checked in the plan phase of every call (model-issued or nested `ctx.tool()`),
//! before the journal is consulted and before `replay = false` is looked at, so neither a
//! non-replayed tool, a nested call nor a resumed run can get around it. A nested call that the
//! policy asks about is refused, because it cannot pause the tool that made it.

use std::{fmt, panic::AssertUnwindSafe, sync::Arc};

use serde_json::Value;

/// What a [`Policy`] says about one call.
///
/// ```
/// use kuralle::{Policy, Verdict};
/// let policy = Policy::new().ask("refund");
/// assert_eq!(policy.check("refund", &serde_json::json!({"order": "A1"})), Verdict::Ask);
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// The call runs (unless the tool itself is `needs_approval`).
    Allow,
    /// The run pauses durably until a human decides, exactly as for a `needs_approval` tool.
    Ask,
    /// The call never runs; the model receives the `{"__denied": true, ...}` result with
    /// `deniedBy: "policy"`.
    Deny {
        /// Told to the model, when given.
        reason: Option<String>,
    },
}

impl Verdict {
    /// A denial with a reason for the model.
    ///
    /// ```
    /// let v = kuralle::Verdict::deny("read-only agent");
    /// assert_eq!(v, kuralle::Verdict::Deny { reason: Some("read-only agent".into()) });
    /// ```
    pub fn deny(reason: impl Into<String>) -> Self {
        Self::Deny { reason: Some(reason.into()) }
    }

    /// Orders verdicts by how much they restrict: `Allow < Ask < Deny`.
    fn strictness(&self) -> u8 {
        match self {
            Self::Allow => 0,
            Self::Ask => 1,
            Self::Deny { .. } => 2,
        }
    }
}

type Check = dyn Fn(&str, &Value) -> Option<Verdict> + Send + Sync;

/// Decides allow / ask / deny for each tool call from the tool name and the raw arguments.
///
/// Rules are checked in the order they were added; the first that matches decides, and a call
/// no rule matches gets the fallback ([`Verdict::Allow`] unless set with
/// [`otherwise`](Self::otherwise)). Tool names match exactly or by a glob with `*`
/// (`"delete_*"`, `"*_admin"`, `"*"`). A rule or predicate that panics denies the call: a
/// policy fails closed.
///
/// "Ask for `wire` above 500, deny `delete_*`, allow the rest":
/// ```
/// use kuralle::{Policy, Verdict};
/// use serde_json::json;
///
/// let policy = Policy::new()
///     .ask_when("wire", |args| args["amount"].as_f64().is_some_and(|a| a > 500.0))
///     .deny("delete_*", "deleting is not allowed here");
///
/// assert_eq!(policy.check("wire", &json!({"amount": 900})), Verdict::Ask);
/// assert_eq!(policy.check("wire", &json!({"amount": 20})), Verdict::Allow);
/// assert_eq!(policy.check("delete_user", &json!({})), Verdict::deny("deleting is not allowed here"));
/// assert_eq!(policy.check("lookup", &json!({})), Verdict::Allow);
/// ```
///
/// Set it on an agent with `#[agent(policy = ...)]` or [`AgentDef::policy`](crate::AgentDef::policy).
#[derive(Clone)]
pub struct Policy {
    rules: Vec<Arc<Check>>,
    fallback: Verdict,
}

impl Default for Policy {
    fn default() -> Self {
        Self::new()
    }
}

impl fmt::Debug for Policy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Policy").field("rules", &self.rules.len()).field("fallback", &self.fallback).finish()
    }
}

impl Policy {
    /// A policy with no rules: everything is allowed (tools' own `needs_approval` still holds).
    pub fn new() -> Self {
        Self { rules: Vec::new(), fallback: Verdict::Allow }
    }

    /// A policy of one function, for decisions rules cannot express.
    ///
    /// ```
    /// use kuralle::{Policy, Verdict};
    /// let read_only = Policy::from_fn(|name, _args| {
    ///     if name.starts_with("get_") { Verdict::Allow } else { Verdict::deny("read-only agent") }
    /// });
    /// assert_eq!(read_only.check("get_order", &serde_json::json!({})), Verdict::Allow);
    /// ```
    pub fn from_fn(f: impl Fn(&str, &Value) -> Verdict + Send + Sync + 'static) -> Self {
        Self::new().rule(move |name, args| Some(f(name, args)))
    }

    /// Adds a rule: `Some(verdict)` decides, `None` passes the call to the next rule.
    #[must_use]
    pub fn rule(mut self, rule: impl Fn(&str, &Value) -> Option<Verdict> + Send + Sync + 'static) -> Self {
        self.rules.push(Arc::new(rule));
        self
    }

    /// Calls to tools matching `pattern` run.
    #[must_use]
    pub fn allow(self, pattern: &str) -> Self {
        self.when(pattern, |_| true, Verdict::Allow)
    }

    /// Calls to tools matching `pattern` wait for a human.
    #[must_use]
    pub fn ask(self, pattern: &str) -> Self {
        self.when(pattern, |_| true, Verdict::Ask)
    }

    /// Calls to tools matching `pattern` are refused, and the model is told `reason`.
    #[must_use]
    pub fn deny(self, pattern: &str, reason: impl Into<String>) -> Self {
        self.when(pattern, |_| true, Verdict::deny(reason))
    }

    /// Calls to tools matching `pattern` whose raw arguments satisfy `pred` wait for a human.
    #[must_use]
    pub fn ask_when(self, pattern: &str, pred: impl Fn(&Value) -> bool + Send + Sync + 'static) -> Self {
        self.when(pattern, pred, Verdict::Ask)
    }

    /// Calls to tools matching `pattern` whose raw arguments satisfy `pred` are refused.
    #[must_use]
    pub fn deny_when(
        self,
        pattern: &str,
        pred: impl Fn(&Value) -> bool + Send + Sync + 'static,
        reason: impl Into<String>,
    ) -> Self {
        self.when(pattern, pred, Verdict::deny(reason))
    }

    /// Calls to tools matching `pattern` whose raw arguments satisfy `pred` get `verdict`.
    #[must_use]
    pub fn when(self, pattern: &str, pred: impl Fn(&Value) -> bool + Send + Sync + 'static, verdict: Verdict) -> Self {
        let pattern = pattern.to_owned();
        self.rule(move |name, args| (glob_match(&pattern, name) && pred(args)).then(|| verdict.clone()))
    }

    /// The verdict for calls no rule matches (default [`Verdict::Allow`]).
    ///
    /// ```
    /// use kuralle::{Policy, Verdict};
    /// let allow_list = Policy::new().allow("get_*").otherwise(Verdict::Ask);
    /// assert_eq!(allow_list.check("refund", &serde_json::json!({})), Verdict::Ask);
    /// ```
    #[must_use]
    pub fn otherwise(mut self, verdict: Verdict) -> Self {
        self.fallback = verdict;
        self
    }

    /// Both policies apply: the stricter verdict of the two wins (`Deny` over `Ask` over
    /// `Allow`), so a team-wide policy can be combined with an agent's own.
    ///
    /// ```
    /// use kuralle::{Policy, Verdict};
    /// let team = Policy::new().ask("refund");
    /// let agent = Policy::new().deny("drop_table", "never");
    /// let both = team.and(agent);
    /// assert_eq!(both.check("refund", &serde_json::json!({})), Verdict::Ask);
    /// assert_eq!(both.check("drop_table", &serde_json::json!({})), Verdict::deny("never"));
    /// ```
    #[must_use]
    pub fn and(self, other: Policy) -> Self {
        Self::from_fn(move |name, args| {
            let (a, b) = (self.check(name, args), other.check(name, args));
            if b.strictness() > a.strictness() { b } else { a }
        })
    }

    /// Whether every call is allowed whatever its arguments (no rules, an allowing fallback),
    /// so the runtime need not parse them for the policy.
    pub(crate) fn allows_everything(&self) -> bool {
        self.rules.is_empty() && matches!(self.fallback, Verdict::Allow)
    }

    /// The verdict for a call of `tool` with the model's raw (parsed, not yet validated)
    /// arguments. Never panics: a panicking rule denies.
    pub fn check(&self, tool: &str, args: &Value) -> Verdict {
        let decided = std::panic::catch_unwind(AssertUnwindSafe(|| {
            self.rules.iter().find_map(|rule| rule(tool, args)).unwrap_or_else(|| self.fallback.clone())
        }));
        decided.unwrap_or_else(|_| Verdict::deny("the approval policy failed while checking this call"))
    }
}

/// `*` matches any run of characters (including none); everything else matches itself.
fn glob_match(pattern: &str, name: &str) -> bool {
    let mut parts = pattern.split('*');
    let first = parts.next().unwrap_or_default();
    let Some(mut rest) = name.strip_prefix(first) else { return false };
    let parts: Vec<&str> = parts.collect();
    let Some((last, middle)) = parts.split_last() else { return rest.is_empty() };
    for part in middle {
        match rest.find(part) {
            Some(at) => rest = &rest[at + part.len()..],
            None => return false,
        }
    }
    rest.len() >= last.len() && rest.ends_with(last)
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn globs() {
        assert!(glob_match("wire", "wire"));
        assert!(!glob_match("wire", "wire2"));
        assert!(glob_match("delete_*", "delete_user"));
        assert!(glob_match("delete_*", "delete_"));
        assert!(!glob_match("delete_*", "undelete_user"));
        assert!(glob_match("*_admin", "make_admin"));
        assert!(glob_match("*", ""));
        assert!(glob_match("a*b*c", "axxbyyc"));
        assert!(!glob_match("a*b*c", "axxcyyb"));
        assert!(!glob_match("ab*ba", "aba"));
    }

    #[test]
    fn first_matching_rule_decides() {
        let p = Policy::new().allow("wire").ask("*");
        assert_eq!(p.check("wire", &json!({})), Verdict::Allow);
        assert_eq!(p.check("refund", &json!({})), Verdict::Ask);
    }

    #[test]
    fn a_panicking_rule_denies() {
        let p = Policy::new().ask_when("wire", |_| panic!("bad predicate"));
        assert!(matches!(p.check("wire", &json!({})), Verdict::Deny { .. }));
        assert_eq!(p.check("other", &json!({})), Verdict::Allow);
    }
}
