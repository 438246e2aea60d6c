//! The one wall clock: records' times, lease waits and `ctx.now()` all read it here.

use std::time::{SystemTime, UNIX_EPOCH};

/// Milliseconds since the Unix epoch, as stored in records (0 before the epoch).
pub(crate) fn now_ms() -> i64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}
