//! The journal cache's key: a journal key in half the bytes, with no allocation of its own.
//!
//! Every key the runtime makes is a SHA-256 digest spelled in 64 lowercase hex digits
//! (`key.rs`). The cache holds a run's keys for the whole turn, one per step, so it keeps the
//! digest's 32 bytes inline instead of a 64-byte string on the heap beside its 24-byte handle:
//! about half a kilobyte less per run of seven steps. Any other text (a key written by an
//! older build or another tool) is kept as it is, so no two keys ever share an entry.

/// A journal key as the cache holds it.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(super) enum CacheKey {
    /// The digest that 64 lowercase hex digits spell.
    Digest([u8; 32]),
    /// Any other key, as written.
    Text(Box<str>),
}

impl CacheKey {
    /// The cache key of `key`; allocates only for a key that is not a digest's hex.
    pub(super) fn of(key: &str) -> Self {
        digest(key).map_or_else(|| Self::Text(key.into()), Self::Digest)
    }

    /// As [`of`](Self::of), keeping `key`'s buffer when it is not a digest's hex.
    pub(super) fn from_owned(key: String) -> Self {
        digest(&key).map_or_else(|| Self::Text(key.into_boxed_str()), Self::Digest)
    }
}

/// The 32 bytes of a key spelled in exactly 64 lowercase hex digits. Uppercase digits are not
/// read as a digest: `"AB…"` and `"ab…"` are different keys and must stay apart.
fn digest(key: &str) -> Option<[u8; 32]> {
    let bytes: &[u8; 64] = key.as_bytes().try_into().ok()?;
    let mut out = [0u8; 32];
    // No branch per digit: a digit that is not one sets the high bit of `bad`, checked once.
    let mut bad = 0u8;
    for (b, pair) in out.iter_mut().zip(bytes.chunks_exact(2)) {
        let (hi, lo) = (NIBBLE[usize::from(pair[0])], NIBBLE[usize::from(pair[1])]);
        bad |= hi | lo;
        *b = (hi << 4) | (lo & 0x0f);
    }
    (bad & 0x80 == 0).then_some(out)
}

/// A lowercase hex digit's value; `0x80` for any other byte.
static NIBBLE: [u8; 256] = {
    let mut table = [0x80u8; 256];
    let mut i = 0;
    while i < 10 {
        table[b'0' as usize + i] = i as u8;
        i += 1;
    }
    let mut i = 0;
    while i < 6 {
        table[b'a' as usize + i] = 10 + i as u8;
        i += 1;
    }
    table
};

#[cfg(test)]
mod tests {
    use super::CacheKey;

    #[test]
    fn a_digests_hex_is_held_as_its_bytes_and_anything_else_as_text() {
        let hex = "00ff10a9".repeat(8);
        let CacheKey::Digest(bytes) = CacheKey::of(&hex) else { panic!("64 lowercase hex digits are a digest") };
        assert_eq!(bytes[..4], [0x00, 0xff, 0x10, 0xa9]);
        assert_eq!(CacheKey::from_owned(hex.clone()), CacheKey::of(&hex));
        for other in ["k1", &hex.to_uppercase(), &hex[..62], &format!("{hex}0"), &"g".repeat(64)] {
            assert_eq!(CacheKey::of(other), CacheKey::Text(other.into()), "{other}");
        }
        // A key that only differs in case is another key.
        assert_ne!(CacheKey::of(&hex.replace('a', "A")), CacheKey::of(&hex));
    }
}
