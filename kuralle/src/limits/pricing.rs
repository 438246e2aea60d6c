//! [`Pricing`]: what a model's tokens cost, given by the user, per million tokens.

use serde::{Deserialize, Serialize};

use crate::model::Usage;

/// A model's prices in dollars per million tokens: input, output, and (optionally) prompt
/// tokens read from or written to the provider's cache. Register one per model name with
/// [`RuntimeBuilder::pricing`](crate::RuntimeBuilder::pricing); each priced model response
/// journals its cost, which [`RunLimits::max_cost_usd`](crate::RunLimits::max_cost_usd) caps
/// and `kuralle runs show` adds up.
///
/// [`Usage::input_tokens`] includes the cache's tokens: those are priced at their own rate
/// (the input rate when none is set) and only the rest at the input rate.
///
/// ```
/// use kuralle::{Pricing, Usage};
///
/// let price = Pricing::new(3.0, 15.0).cache_read(0.30).cache_write(3.75);
/// let usage = Usage {
///     input_tokens: 1_000_000, // of which 400,000 cache reads and 100,000 cache writes
///     cache_read_tokens: 400_000,
///     cache_write_tokens: 100_000,
///     output_tokens: 200_000,
///     ..Usage::default()
/// };
/// // 0.5 M input × $3 + 0.4 M × $0.30 + 0.1 M × $3.75 + 0.2 M output × $15
/// assert!((price.cost(&usage) - (1.5 + 0.12 + 0.375 + 3.0)).abs() < 1e-9);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct Pricing {
    /// Dollars per million input tokens (not read from or written to the cache).
    pub input_per_mtok: f64,
    /// Dollars per million output tokens (reasoning included).
    pub output_per_mtok: f64,
    /// Dollars per million tokens read from the cache; `None` prices them as input.
    pub cache_read_per_mtok: Option<f64>,
    /// Dollars per million tokens written to the cache; `None` prices them as input.
    pub cache_write_per_mtok: Option<f64>,
}

impl Pricing {
    /// Input and output prices, in dollars per million tokens.
    pub fn new(input_per_mtok: f64, output_per_mtok: f64) -> Self {
        Self { input_per_mtok, output_per_mtok, cache_read_per_mtok: None, cache_write_per_mtok: None }
    }

    /// The price of a million tokens read from the provider's cache.
    #[must_use]
    pub fn cache_read(mut self, per_mtok: f64) -> Self {
        self.cache_read_per_mtok = Some(per_mtok);
        self
    }

    /// The price of a million tokens written to the provider's cache.
    #[must_use]
    pub fn cache_write(mut self, per_mtok: f64) -> Self {
        self.cache_write_per_mtok = Some(per_mtok);
        self
    }

    /// What `usage` costs, in dollars.
    pub fn cost(&self, usage: &Usage) -> f64 {
        let cached = usage.cache_read_tokens.saturating_add(usage.cache_write_tokens);
        let plain = usage.input_tokens.saturating_sub(cached);
        let per = |tokens: u64, rate: f64| tokens as f64 * rate / 1_000_000.0;
        per(plain, self.input_per_mtok)
            + per(usage.cache_read_tokens, self.cache_read_per_mtok.unwrap_or(self.input_per_mtok))
            + per(usage.cache_write_tokens, self.cache_write_per_mtok.unwrap_or(self.input_per_mtok))
            + per(usage.output_tokens, self.output_per_mtok)
    }

    /// Whether every price is a finite amount of at least zero.
    pub(crate) fn is_valid(&self) -> bool {
        [Some(self.input_per_mtok), Some(self.output_per_mtok), self.cache_read_per_mtok, self.cache_write_per_mtok]
            .into_iter()
            .flatten()
            .all(|p| p.is_finite() && p >= 0.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cache_tokens_without_their_own_price_cost_the_input_rate() {
        let usage = Usage { input_tokens: 2_000_000, cache_read_tokens: 1_000_000, ..Usage::default() };
        assert!((Pricing::new(2.0, 8.0).cost(&usage) - 4.0).abs() < 1e-9);
        assert!((Pricing::new(2.0, 8.0).cache_read(0.5).cost(&usage) - 2.5).abs() < 1e-9);
    }

    #[test]
    fn a_wire_that_reports_more_cache_than_input_costs_no_negative_input() {
        let usage = Usage { input_tokens: 10, cache_read_tokens: 30, ..Usage::default() };
        assert!(Pricing::new(1.0, 1.0).cache_read(1.0).cost(&usage) >= 0.0);
    }

    #[test]
    fn negative_or_nan_prices_are_invalid() {
        assert!(Pricing::new(1.0, 2.0).is_valid());
        assert!(!Pricing::new(-1.0, 2.0).is_valid());
        assert!(!Pricing::new(1.0, 2.0).cache_write(f64::NAN).is_valid());
    }
}
