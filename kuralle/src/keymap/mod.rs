//! The map type for the hot lookups by journal key or run id, and the compact form of a
//! journal key ([`CompactKey`]) that the journal's cache and `MemoryStore` hold.
//!
//! Every turn looks keys up in the journal's cache and in `MemoryStore`'s maps several times;
//! with the standard SipHash-1-3 hasher those lookups were a tenth of a one-call turn's
//! instructions (a key is 64 hex digits). foldhash is several times cheaper and is still
//! seeded per map from process randomness, so a caller cannot precompute colliding keys; and
//! a journal key is a SHA-256 digest of the call, which nobody can steer into a bucket.

mod compact;

use std::collections::HashMap;

pub(crate) use compact::{CompactKey, digest, hex};

/// A `HashMap` with string keys and the fast, randomly seeded foldhash hasher.
pub(crate) type KeyMap<V> = HashMap<String, V, foldhash::fast::RandomState>;
