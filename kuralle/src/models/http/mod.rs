//! What every provider client shares: the HTTP client and its settings ([`options`]), sending
//! a request with retries ([`send`]), and reading the answer within a byte limit ([`read`]).
//! A wire's own module holds only its body, its stream assembly and its errors.

pub(crate) mod options;
pub(crate) mod read;
pub(crate) mod send;

pub use options::ConfigError;
pub(crate) use options::{Options, Retry};
pub(crate) use read::{Instrumented, describe_error, error_chain, excerpt};
pub(crate) use send::Http;
