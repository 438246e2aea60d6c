//! [`RunLimits`]: the caps on what one run may spend, and [`Limit`], which cap a run hit.

use std::{fmt, time::Duration};

use serde::{Deserialize, Serialize};

/// Caps on what one run may spend: model requests, tool calls, tokens, dollars and wall-clock
/// time. Every cap is optional; [`RunLimits::new`] sets none.
///
/// A run is refused the model request or tool batch that would pass a cap, before it starts:
/// it ends with [`RunStatus::LimitExceeded`](crate::RunStatus::LimitExceeded), an
/// [`Event::LimitExceeded`](crate::Event::LimitExceeded) and
/// [`RunError::LimitExceeded`](crate::RunError::LimitExceeded). Limits count the whole run
/// (every turn of it), from its journal, so a resumed, crashed or handed-over run keeps what it
/// spent; the deadline counts from the run's creation.
///
/// Set them per agent ([`AgentDef::limits`](crate::AgentDef::limits), `#[agent(limits = ..)]`)
/// and per request ([`RunRequest::limits`](crate::RunRequest::limits)); a run gets the
/// [`tighter`](Self::tighter) of the two, cap by cap.
///
/// ```
/// use std::time::Duration;
/// use kuralle::RunLimits;
///
/// let agent = RunLimits::new().max_requests(20).max_cost_usd(0.50);
/// let request = RunLimits::new().max_requests(5).deadline(Duration::from_secs(60));
/// let run = agent.tighter(&request);
/// assert_eq!(run.max_requests, Some(5));
/// assert_eq!(run.max_cost_usd, Some(0.50));
/// assert_eq!(run.deadline, Some(Duration::from_secs(60)));
/// assert!(RunLimits::new().is_unlimited());
/// ```
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize)]
#[non_exhaustive]
pub struct RunLimits {
    /// Model requests (responses replayed from the journal are not requests).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_requests: Option<u64>,
    /// Tool calls that run (nested `ctx.tool` calls included; replays excluded).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_tool_calls: Option<u64>,
    /// Input plus output tokens.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_total_tokens: Option<u64>,
    /// Input tokens (cache reads and writes included).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_input_tokens: Option<u64>,
    /// Output tokens (reasoning included).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_output_tokens: Option<u64>,
    /// Dollars, priced with the model's [`Pricing`](crate::Pricing).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_cost_usd: Option<f64>,
    /// Wall-clock time since the run was created.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deadline: Option<Duration>,
}

impl PartialEq for RunLimits {
    fn eq(&self, other: &Self) -> bool {
        // Bitwise on the dollar cap, so equality is an equivalence (`Eq`) even for NaN.
        (self.max_requests, self.max_tool_calls, self.max_total_tokens, self.max_input_tokens)
            == (other.max_requests, other.max_tool_calls, other.max_total_tokens, other.max_input_tokens)
            && self.max_output_tokens == other.max_output_tokens
            && self.max_cost_usd.map(f64::to_bits) == other.max_cost_usd.map(f64::to_bits)
            && self.deadline == other.deadline
    }
}

impl Eq for RunLimits {}

impl RunLimits {
    /// No caps.
    pub fn new() -> Self {
        Self::default()
    }

    /// At most `n` model requests.
    #[must_use]
    pub fn max_requests(mut self, n: u64) -> Self {
        self.max_requests = Some(n);
        self
    }

    /// At most `n` tool calls. A batch that would pass it runs none of its calls.
    #[must_use]
    pub fn max_tool_calls(mut self, n: u64) -> Self {
        self.max_tool_calls = Some(n);
        self
    }

    /// At most `n` tokens, input and output together.
    #[must_use]
    pub fn max_total_tokens(mut self, n: u64) -> Self {
        self.max_total_tokens = Some(n);
        self
    }

    /// At most `n` input tokens.
    #[must_use]
    pub fn max_input_tokens(mut self, n: u64) -> Self {
        self.max_input_tokens = Some(n);
        self
    }

    /// At most `n` output tokens.
    #[must_use]
    pub fn max_output_tokens(mut self, n: u64) -> Self {
        self.max_output_tokens = Some(n);
        self
    }

    /// At most `usd` dollars. Needs a [`Pricing`](crate::Pricing) for the agent's model
    /// ([`RuntimeBuilder::pricing`](crate::RuntimeBuilder::pricing)); without one,
    /// `build()` (or the run, for a per-request cap) fails with a configuration error. A
    /// negative or NaN amount allows nothing.
    #[must_use]
    pub fn max_cost_usd(mut self, usd: f64) -> Self {
        self.max_cost_usd = Some(if usd.is_nan() { 0.0 } else { usd.max(0.0) });
        self
    }

    /// The run ends once `after` has passed since it was created.
    #[must_use]
    pub fn deadline(mut self, after: Duration) -> Self {
        self.deadline = Some(after);
        self
    }

    /// Cap by cap, the smaller of the two (a cap set on one side only is kept).
    ///
    /// ```
    /// use kuralle::RunLimits;
    /// let a = RunLimits::new().max_tool_calls(10).max_output_tokens(500);
    /// let b = RunLimits::new().max_tool_calls(3);
    /// assert_eq!(a.tighter(&b), RunLimits::new().max_tool_calls(3).max_output_tokens(500));
    /// ```
    #[must_use]
    pub fn tighter(&self, other: &Self) -> Self {
        fn min<T: PartialOrd + Copy>(a: Option<T>, b: Option<T>) -> Option<T> {
            match (a, b) {
                (Some(a), Some(b)) => Some(if b < a { b } else { a }),
                (a, b) => a.or(b),
            }
        }
        Self {
            max_requests: min(self.max_requests, other.max_requests),
            max_tool_calls: min(self.max_tool_calls, other.max_tool_calls),
            max_total_tokens: min(self.max_total_tokens, other.max_total_tokens),
            max_input_tokens: min(self.max_input_tokens, other.max_input_tokens),
            max_output_tokens: min(self.max_output_tokens, other.max_output_tokens),
            max_cost_usd: min(self.max_cost_usd, other.max_cost_usd),
            deadline: min(self.deadline, other.deadline),
        }
    }

    /// Whether no cap is set.
    ///
    /// ```
    /// assert!(!kuralle::RunLimits::new().max_requests(1).is_unlimited());
    /// ```
    pub fn is_unlimited(&self) -> bool {
        *self == Self::default()
    }

    /// Whether a cap needs the tokens (and dollars) the run has spent, which are read back from
    /// every journaled model response when a turn opens.
    pub(crate) fn counts_usage(&self) -> bool {
        self.max_total_tokens.is_some()
            || self.max_input_tokens.is_some()
            || self.max_output_tokens.is_some()
            || self.max_cost_usd.is_some()
    }
}

/// Which cap of a [`RunLimits`] a run hit.
///
/// ```
/// use kuralle::Limit;
/// assert_eq!(Limit::ToolCalls.as_str(), "tool_calls");
/// assert_eq!(serde_json::to_value(Limit::CostUsd).unwrap(), "cost_usd");
/// assert_eq!(Limit::Deadline.unit(), "seconds");
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum Limit {
    /// [`RunLimits::max_requests`].
    Requests,
    /// [`RunLimits::max_tool_calls`].
    ToolCalls,
    /// [`RunLimits::max_total_tokens`].
    TotalTokens,
    /// [`RunLimits::max_input_tokens`].
    InputTokens,
    /// [`RunLimits::max_output_tokens`].
    OutputTokens,
    /// [`RunLimits::max_cost_usd`].
    CostUsd,
    /// [`RunLimits::deadline`].
    Deadline,
}

impl Limit {
    /// The limit's name, as serialized (`"requests"`, `"tool_calls"`, ...).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Requests => "requests",
            Self::ToolCalls => "tool_calls",
            Self::TotalTokens => "total_tokens",
            Self::InputTokens => "input_tokens",
            Self::OutputTokens => "output_tokens",
            Self::CostUsd => "cost_usd",
            Self::Deadline => "deadline",
        }
    }

    /// What the limit's [`Amount`]s count: `"requests"`, `"tool calls"`, `"tokens"`, `"USD"`
    /// or `"seconds"`.
    pub fn unit(self) -> &'static str {
        match self {
            Self::Requests => "requests",
            Self::ToolCalls => "tool calls",
            Self::TotalTokens | Self::InputTokens | Self::OutputTokens => "tokens",
            Self::CostUsd => "USD",
            Self::Deadline => "seconds",
        }
    }
}

impl fmt::Display for Limit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// An amount of a [`Limit`], in its [`unit`](Limit::unit): a count, dollars or seconds.
/// Serialized as a JSON number (an integer when it is one).
///
/// ```
/// use kuralle::Amount;
/// assert_eq!(serde_json::to_value(Amount::from(3u64)).unwrap(), 3);
/// assert_eq!(serde_json::to_value(Amount::from(0.25)).unwrap(), 0.25);
/// assert_eq!(Amount::from(0.25).to_string(), "0.25");
/// ```
#[derive(Debug, Clone, Copy, Default)]
pub struct Amount(f64);

impl Amount {
    /// The amount as a number.
    pub fn value(self) -> f64 {
        self.0
    }

    /// The amount as a whole count, when it is one.
    pub fn as_u64(self) -> Option<u64> {
        // Exact below 2^53, which every count here is.
        (self.0 >= 0.0 && self.0.fract() == 0.0 && self.0 < 9_007_199_254_740_992.0).then_some(self.0 as u64)
    }
}

impl From<u64> for Amount {
    fn from(n: u64) -> Self {
        Self(n as f64)
    }
}

impl From<f64> for Amount {
    fn from(x: f64) -> Self {
        Self(x)
    }
}

impl PartialEq for Amount {
    fn eq(&self, other: &Self) -> bool {
        self.0.to_bits() == other.0.to_bits()
    }
}

impl Eq for Amount {}

impl fmt::Display for Amount {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.as_u64() {
            Some(n) => write!(f, "{n}"),
            None => write!(f, "{}", self.0),
        }
    }
}

impl Serialize for Amount {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self.as_u64() {
            Some(n) => s.serialize_u64(n),
            None => s.serialize_f64(self.0),
        }
    }
}

impl<'de> Deserialize<'de> for Amount {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        f64::deserialize(d).map(Self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tighter_keeps_the_smaller_cap_of_each_kind() {
        let a = RunLimits::new().max_requests(3).max_cost_usd(1.0).deadline(Duration::from_secs(9));
        let b = RunLimits::new().max_requests(5).max_cost_usd(0.5).max_input_tokens(7);
        let t = a.tighter(&b);
        assert_eq!(
            t,
            RunLimits::new().max_requests(3).max_cost_usd(0.5).max_input_tokens(7).deadline(Duration::from_secs(9))
        );
        assert_eq!(t, b.tighter(&a));
    }

    #[test]
    fn limits_round_trip_through_json() {
        let l = RunLimits::new().max_tool_calls(2).max_cost_usd(0.125).deadline(Duration::from_millis(1500));
        let text = serde_json::to_string(&l).unwrap();
        assert_eq!(serde_json::from_str::<RunLimits>(&text).unwrap(), l);
        assert_eq!(serde_json::from_str::<RunLimits>("{}").unwrap(), RunLimits::new());
    }

    #[test]
    fn a_nan_dollar_cap_allows_nothing() {
        assert_eq!(RunLimits::new().max_cost_usd(f64::NAN).max_cost_usd, Some(0.0));
        assert_eq!(RunLimits::new().max_cost_usd(-1.0).max_cost_usd, Some(0.0));
    }
}
