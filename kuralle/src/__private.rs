//! Everything generated code touches, and nothing else. Not public API.

pub use core::{
    future::Future,
    marker::{Send, Sync},
    option::Option,
    pin::Pin,
    result::Result,
    time::Duration,
};
pub use std::{boxed::Box, string::String, vec::Vec};

pub use schemars::{self, JsonSchema};
pub use serde::{self, Deserialize, Serialize};
pub use serde_json::{self, Value};
