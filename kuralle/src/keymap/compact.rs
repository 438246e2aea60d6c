//! A journal key in half the bytes, with no allocation of its own.
//!
//! Every key the runtime makes is a SHA-256 digest spelled in 64 lowercase hex digits
//! (`journal/key.rs`). The journal's cache and `MemoryStore` hold a run's keys, one per step,
//! so they keep the digest's 32 bytes inline instead of a 64-byte string on the heap beside
//! its 24-byte handle: about half a kilobyte less per run of seven steps, each. Any other text
//! (a key written by an older build or another tool) is kept as it is, so no two keys ever
//! share an entry, and every key reads back as it was written.

/// A journal key, held compactly.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) enum CompactKey {
    /// The digest that 64 lowercase hex digits spell.
    Digest([u8; 32]),
    /// Any other key, as written.
    Text(Box<str>),
}

impl CompactKey {
    /// The compact form of `key`; allocates only for a key that is not a digest's hex.
    pub(crate) fn of(key: &str) -> Self {
        digest(key).map_or_else(|| Self::Text(key.into()), Self::Digest)
    }

    /// As [`of`](Self::of), keeping `key`'s buffer when it is not a digest's hex.
    pub(crate) fn from_owned(key: String) -> Self {
        digest(&key).map_or_else(|| Self::Text(key.into_boxed_str()), Self::Digest)
    }

    /// The key as it was written.
    pub(crate) fn to_text(&self) -> String {
        match self {
            Self::Digest(bytes) => hex(bytes),
            Self::Text(text) => text.to_string(),
        }
    }
}

/// The 32 bytes of a key spelled in exactly 64 lowercase hex digits. Uppercase digits are not
/// read as a digest: `"AB…"` and `"ab…"` are different keys and must stay apart.
pub(crate) fn digest(key: &str) -> Option<[u8; 32]> {
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

/// Lowercase hex of a digest: how every journal key is spelled, and what [`digest`] reads back.
pub(crate) fn hex(digest: &[u8]) -> String {
    // Two digits a byte from a table, into a fixed buffer, then one string: pushing `char`s
    // re-checked the capacity and encoded each digit as UTF-8, several hundred instructions a
    // key, and a store reading a long journal back spells every key again.
    let mut out = [0u8; 64];
    for (pair, b) in out.chunks_exact_mut(2).zip(digest) {
        pair.copy_from_slice(&HEX_PAIRS[usize::from(*b)]);
    }
    // Hex digits are ASCII.
    std::str::from_utf8(&out[..digest.len().min(32) * 2]).unwrap_or_default().to_owned()
}

/// Each byte's two lowercase hex digits.
static HEX_PAIRS: [[u8; 2]; 256] = {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut table = [[0u8; 2]; 256];
    let mut i = 0;
    while i < 256 {
        table[i] = [DIGITS[i >> 4], DIGITS[i & 0xf]];
        i += 1;
    }
    table
};

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
    use super::CompactKey;

    #[test]
    fn a_digests_hex_is_held_as_its_bytes_and_anything_else_as_text() {
        let hex = "00ff10a9".repeat(8);
        let CompactKey::Digest(bytes) = CompactKey::of(&hex) else { panic!("64 lowercase hex digits are a digest") };
        assert_eq!(bytes[..4], [0x00, 0xff, 0x10, 0xa9]);
        assert_eq!(CompactKey::from_owned(hex.clone()), CompactKey::of(&hex));
        for other in ["k1", &hex.to_uppercase(), &hex[..62], &format!("{hex}0"), &"g".repeat(64)] {
            assert_eq!(CompactKey::of(other), CompactKey::Text(other.into()), "{other}");
        }
        for key in [hex.as_str(), "k1", &hex.to_uppercase()] {
            assert_eq!(CompactKey::of(key).to_text(), key, "reads back as written");
        }
        // A key that only differs in case is another key.
        assert_ne!(CompactKey::of(&hex.replace('a', "A")), CompactKey::of(&hex));
    }
}
