//! Run limits: how much one run may spend ([`RunLimits`]), what a model's tokens cost
//! ([`Pricing`]), and the tally of what a run has spent, read back from its journal, that
//! limits are checked against.
//!
//! One idea per file: [`run_limits`] holds the caps and which one was hit, [`pricing`] turns
//! usage into dollars, [`tally`] adds up spent usage and says which cap the next request or
//! batch would pass, and [`budget`] is a turn's view of the limits with the clock its
//! deadline is read from.

mod budget;
mod pricing;
mod run_limits;
mod tally;

pub(crate) use budget::Budget;
pub use pricing::Pricing;
pub use run_limits::{Amount, Limit, RunLimits};
pub(crate) use tally::{Exceeded, Spent};
