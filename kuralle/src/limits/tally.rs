//! What a run has spent, added up from its journal, and which cap the next model request or
//! tool batch would pass.
//!
//! The journal is the one record: requests are its model steps, tool calls its tool steps,
//! tokens and dollars the `usage` and `cost_usd` each journaled model response carries. A
//! resumed, crashed or handed-over run reads the same journal, so it cannot start over with a
//! fresh budget.

use std::time::Duration;

use serde::Deserialize;

use super::{Amount, Limit, RunLimits};
use crate::{
    model::Usage,
    store::{StepKind, StepRecord, StepStatus},
};

/// What a run has spent so far.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub(crate) struct Spent {
    /// Model requests: journaled model responses.
    pub(crate) requests: u64,
    /// Tool calls: journaled tool steps (nested calls included; a replay adds none).
    pub(crate) tool_calls: u64,
    /// Tokens of every journaled model response.
    pub(crate) usage: Usage,
    /// Dollars of every priced model response.
    pub(crate) cost_usd: f64,
}

/// The part of a journaled model response that says what it spent, read without the rest.
#[derive(Debug, Default, Deserialize)]
struct ModelSpend {
    #[serde(default)]
    usage: Usage,
    #[serde(default)]
    cost_usd: Option<f64>,
}

impl Spent {
    /// Counts a step just journaled (a model response's tokens come with
    /// [`add_response`](Self::add_response)).
    pub(crate) fn count(&mut self, kind: StepKind) {
        match kind {
            StepKind::Tool => self.tool_calls += 1,
            StepKind::Model => self.requests += 1,
            StepKind::Now | StepKind::Uuid | StepKind::Approval | StepKind::Output => {}
        }
    }

    /// Adds one journaled step. With `usage`, a model response's tokens and dollars are read
    /// from its result (a parse per response, so only when a cap needs them).
    pub(crate) fn add_step(&mut self, step: &StepRecord, usage: bool) {
        self.count(step.kind);
        if usage
            && step.kind == StepKind::Model
            && step.status == StepStatus::Finished
            && let Some(spend) = step.result.as_ref().and_then(|r| r.decode::<ModelSpend>().ok())
        {
            self.add_response(spend.usage, spend.cost_usd);
        }
    }

    /// Adds a model response's tokens and dollars (its request was counted with its step).
    pub(crate) fn add_response(&mut self, usage: Usage, cost_usd: Option<f64>) {
        self.usage += usage;
        self.cost_usd += cost_usd.unwrap_or(0.0);
    }

    /// The first cap the next model request would pass, given `elapsed` since the run was
    /// created. Tokens and dollars are known only once a response is in, so those caps stop
    /// the run once they are reached: a run overshoots them by at most one response.
    pub(crate) fn before_request(&self, limits: &RunLimits, elapsed: Duration) -> Option<Exceeded> {
        let counts = [
            (Limit::Requests, limits.max_requests, self.requests + 1),
            (Limit::TotalTokens, limits.max_total_tokens, self.usage.total_tokens().saturating_add(1)),
            (Limit::InputTokens, limits.max_input_tokens, self.usage.input_tokens.saturating_add(1)),
            (Limit::OutputTokens, limits.max_output_tokens, self.usage.output_tokens.saturating_add(1)),
        ];
        for (limit, max, after) in counts {
            if let Some(max) = max
                && after > max
            {
                return Some(Exceeded { limit, used: Amount::from(after - 1), max: Amount::from(max) });
            }
        }
        if let Some(max) = limits.max_cost_usd
            && self.cost_usd >= max
        {
            return Some(Exceeded { limit: Limit::CostUsd, used: Amount::from(self.cost_usd), max: Amount::from(max) });
        }
        past_deadline(limits, elapsed)
    }

    /// The first cap a batch that runs `fresh` calls (calls not answered from the journal)
    /// would pass. A batch with nothing to run passes: replaying spends nothing.
    pub(crate) fn before_batch(&self, limits: &RunLimits, fresh: u64, elapsed: Duration) -> Option<Exceeded> {
        if fresh == 0 {
            return None;
        }
        if let Some(max) = limits.max_tool_calls
            && self.tool_calls + fresh > max
        {
            return Some(Exceeded {
                limit: Limit::ToolCalls,
                used: Amount::from(self.tool_calls),
                max: Amount::from(max),
            });
        }
        past_deadline(limits, elapsed)
    }
}

fn past_deadline(limits: &RunLimits, elapsed: Duration) -> Option<Exceeded> {
    let max = limits.deadline?;
    (elapsed >= max).then(|| Exceeded {
        limit: Limit::Deadline,
        used: Amount::from(elapsed.as_secs_f64()),
        max: Amount::from(max.as_secs_f64()),
    })
}

/// A cap the next request or batch would pass: which, what the run has used, and the cap.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Exceeded {
    pub(crate) limit: Limit,
    pub(crate) used: Amount,
    pub(crate) max: Amount,
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOW: Duration = Duration::ZERO;

    fn spent(requests: u64, tool_calls: u64, input: u64, output: u64, cost: f64) -> Spent {
        let usage = Usage { input_tokens: input, output_tokens: output, ..Usage::default() };
        Spent { requests, tool_calls, usage, cost_usd: cost }
    }

    #[test]
    fn nothing_is_refused_without_caps() {
        let s = spent(1_000, 1_000, 1 << 40, 1 << 40, 1e9);
        assert_eq!(s.before_request(&RunLimits::new(), Duration::from_secs(1 << 30)), None);
        assert_eq!(s.before_batch(&RunLimits::new(), 1_000, NOW), None);
    }

    #[test]
    fn the_request_after_the_last_allowed_one_is_refused() {
        let limits = RunLimits::new().max_requests(2);
        assert_eq!(spent(1, 0, 0, 0, 0.0).before_request(&limits, NOW), None);
        let refused = spent(2, 0, 0, 0, 0.0).before_request(&limits, NOW).unwrap();
        assert_eq!((refused.limit, refused.used, refused.max), (Limit::Requests, 2u64.into(), 2u64.into()));
    }

    #[test]
    fn token_and_dollar_caps_stop_the_run_once_reached() {
        let s = spent(1, 0, 60, 40, 0.5);
        assert_eq!(s.before_request(&RunLimits::new().max_total_tokens(101), NOW), None);
        assert_eq!(s.before_request(&RunLimits::new().max_total_tokens(100), NOW).unwrap().limit, Limit::TotalTokens);
        assert_eq!(s.before_request(&RunLimits::new().max_input_tokens(60), NOW).unwrap().limit, Limit::InputTokens);
        assert_eq!(s.before_request(&RunLimits::new().max_output_tokens(40), NOW).unwrap().limit, Limit::OutputTokens);
        assert_eq!(s.before_request(&RunLimits::new().max_output_tokens(41), NOW), None);
        assert_eq!(s.before_request(&RunLimits::new().max_cost_usd(0.5), NOW).unwrap().limit, Limit::CostUsd);
        assert_eq!(s.before_request(&RunLimits::new().max_cost_usd(0.51), NOW), None);
    }

    #[test]
    fn a_batch_that_would_pass_the_tool_call_cap_is_refused_whole() {
        let limits = RunLimits::new().max_tool_calls(4);
        let s = spent(1, 3, 0, 0, 0.0);
        assert_eq!(s.before_batch(&limits, 1, NOW), None);
        let refused = s.before_batch(&limits, 2, NOW).unwrap();
        assert_eq!((refused.limit, refused.used, refused.max), (Limit::ToolCalls, 3u64.into(), 4u64.into()));
        // A replayed batch runs nothing, so it passes even over the cap.
        assert_eq!(spent(1, 9, 0, 0, 0.0).before_batch(&limits, 0, NOW), None);
    }

    #[test]
    fn the_deadline_refuses_requests_and_batches_once_passed() {
        let limits = RunLimits::new().deadline(Duration::from_secs(5));
        let s = Spent::default();
        assert_eq!(s.before_request(&limits, Duration::from_millis(4_999)), None);
        let refused = s.before_request(&limits, Duration::from_secs(6)).unwrap();
        assert_eq!((refused.limit, refused.used, refused.max), (Limit::Deadline, 6u64.into(), 5u64.into()));
        assert_eq!(s.before_batch(&limits, 1, Duration::from_secs(5)).unwrap().limit, Limit::Deadline);
    }
}
