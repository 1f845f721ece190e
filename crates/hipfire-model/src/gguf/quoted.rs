//! Bounded quoting of strings that come from a file.
//!
//! A name, key or template read from a GGUF can be as long as the file (one flipped bit in a
//! length field made a 170 MB tensor name, and an error message of the same size). Every
//! error that mentions such a string holds a [`Quoted`] instead: its first
//! [`MAX_QUOTED_CHARS`] characters and the full length, displayed as
//! `"blk.0.attn_q.wei"… (170000000 bytes)`.

/// Characters of a file's string an error message quotes at most: a tensor name is at most 63
/// bytes ([`super::MAX_TENSOR_NAME_BYTES`]) and real keys under 60, so every legitimate one
/// is quoted whole; a chat template or a garbage string is cut, which is enough to recognise
/// it. With Rust's escaping (at most 10 bytes for one character, `\u{10ffff}`) a quote is
/// at most ~1 KB.
pub const MAX_QUOTED_CHARS: usize = 96;

/// The start of a string from a file, cut to [`MAX_QUOTED_CHARS`] characters, with its full
/// length. `Display` writes it escaped and quoted, with `…` and the byte length when cut.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Quoted {
    prefix: String,
    len: usize,
}

impl Quoted {
    /// Quote `s` (copies at most [`MAX_QUOTED_CHARS`] characters).
    pub fn new(s: &str) -> Quoted {
        let end = s
            .char_indices()
            .nth(MAX_QUOTED_CHARS)
            .map_or(s.len(), |(i, _)| i);
        Quoted {
            prefix: s[..end].to_owned(),
            len: s.len(),
        }
    }

    /// The kept characters (the whole string when [`Quoted::is_whole`]).
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// Byte length of the original string.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True if and only if the original string was empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// True if and only if nothing was cut.
    pub fn is_whole(&self) -> bool {
        self.prefix.len() == self.len
    }
}

impl From<&str> for Quoted {
    fn from(s: &str) -> Quoted {
        Quoted::new(s)
    }
}

impl From<&String> for Quoted {
    fn from(s: &String) -> Quoted {
        Quoted::new(s)
    }
}

/// Compares with a whole string (a cut quote equals no string).
impl PartialEq<str> for Quoted {
    fn eq(&self, other: &str) -> bool {
        self.is_whole() && self.prefix == other
    }
}

impl PartialEq<&str> for Quoted {
    fn eq(&self, other: &&str) -> bool {
        *self == **other
    }
}

impl std::fmt::Display for Quoted {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:?}", self.prefix)?;
        if !self.is_whole() {
            write!(f, "… ({} bytes)", self.len)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn short_strings_are_quoted_whole_and_long_ones_cut_with_their_length() {
        let q = Quoted::new("blk.0.attn_q.weight");
        assert!(q.is_whole());
        assert_eq!(q.to_string(), "\"blk.0.attn_q.weight\"");
        assert_eq!(q, "blk.0.attn_q.weight");

        // Multi-byte characters: the cut counts characters and lands on a boundary.
        let long: String = "é".repeat(10_000);
        let q = Quoted::new(&long);
        assert!(!q.is_whole());
        assert_eq!(q.len(), 20_000);
        assert_eq!(q.prefix().chars().count(), MAX_QUOTED_CHARS);
        let shown = q.to_string();
        assert!(shown.ends_with("… (20000 bytes)"), "{shown}");
        assert!(shown.len() < 4 * MAX_QUOTED_CHARS, "{}", shown.len());
        assert_ne!(q, long.as_str());

        // Control characters are escaped, and escaping keeps the quote bounded.
        let ctl = "\u{1}".repeat(1_000_000);
        let shown = Quoted::new(&ctl).to_string();
        assert!(shown.starts_with("\"\\u{1}"), "{shown}");
        assert!(shown.len() <= 10 * MAX_QUOTED_CHARS + 32, "{}", shown.len());
    }
}
