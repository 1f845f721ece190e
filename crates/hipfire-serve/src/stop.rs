//! Stop strings over streamed text.
//!
//! A stop string may arrive split across tokens, so text that could still become the start
//! of one is held back until the next piece decides it; the text before a match is emitted and
//! the match itself never is (OpenAI's behaviour).

/// Matches a request's stop strings against the text as it is generated.
#[derive(Debug, Clone, Default)]
pub struct StopMatcher {
    stops: Vec<String>,
    /// Text not yet emitted because it is a prefix of some stop string.
    held: String,
}

impl StopMatcher {
    /// A matcher for `stops` (none: every piece passes straight through).
    pub fn new(stops: Vec<String>) -> StopMatcher {
        StopMatcher {
            stops,
            held: String::new(),
        }
    }

    /// Add generated text. Returns the text that may be emitted now and whether a stop
    /// string matched (then generation ends and the returned text is the last).
    pub fn push(&mut self, piece: &str) -> (String, bool) {
        self.held.push_str(piece);
        if self.stops.is_empty() {
            return (std::mem::take(&mut self.held), false);
        }
        if let Some(at) = self.stops.iter().filter_map(|s| self.held.find(s)).min() {
            let out = self.held[..at].to_owned();
            self.held.clear();
            return (out, true);
        }
        // The longest tail of `held` that is a proper prefix of some stop string stays held.
        let keep = self
            .stops
            .iter()
            .flat_map(|s| {
                s.char_indices()
                    .map(|(i, _)| i)
                    .filter(|&i| i > 0 && self.held.ends_with(&s[..i]))
            })
            .max()
            .unwrap_or(0);
        let cut = self.held.len() - keep;
        let out = self.held[..cut].to_owned();
        self.held.drain(..cut);
        (out, false)
    }

    /// Whatever is held at the end of generation (it matched no stop string).
    pub fn finish(&mut self) -> String {
        std::mem::take(&mut self.held)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Feed `pieces`; the emitted text and whether a stop matched.
    fn run(stops: &[&str], pieces: &[&str]) -> (String, bool) {
        let mut m = StopMatcher::new(stops.iter().map(|s| s.to_string()).collect());
        let mut out = String::new();
        for p in pieces {
            let (t, stopped) = m.push(p);
            out.push_str(&t);
            if stopped {
                return (out, true);
            }
        }
        out.push_str(&m.finish());
        (out, false)
    }

    #[test]
    fn a_stop_split_across_pieces_is_caught_and_never_emitted() {
        assert_eq!(
            run(&["\n\n"], &["Hello", " world\n", "\nmore"]),
            ("Hello world".into(), true)
        );
        assert_eq!(
            run(&["END", "xyz"], &["aE", "N", "D tail"]),
            ("a".into(), true)
        );
        // A false start is released when the next piece rules it out.
        assert_eq!(run(&["END"], &["EN", "d"]), ("ENd".into(), false));
        // Multi-byte characters keep their boundaries.
        assert_eq!(run(&["é!"], &["caf", "é", "!x"]), ("caf".into(), true));
        assert_eq!(run(&[], &["a", "b"]), ("ab".into(), false));
        // The earliest match wins when two stops both occur.
        assert_eq!(run(&["b", "a"], &["xab"]), ("x".into(), true));
    }

    #[test]
    fn text_is_released_as_soon_as_it_cannot_start_a_stop() {
        let mut m = StopMatcher::new(vec!["STOP".into()]);
        assert_eq!(m.push("abc S"), ("abc ".into(), false));
        assert_eq!(m.push("T"), (String::new(), false));
        assert_eq!(m.push("x"), ("STx".into(), false));
    }
}
