//! SIGINT / SIGTERM during `run` and `bench`: a request to stop after the current token.
//!
//! The handlers only set an atomic (signal-hook's `flag` module, async-signal-safe); the
//! generation loop reads it between tokens, so the process prints what it produced and the
//! stats line, then exits 128 + the signal (130 for SIGINT, 143 for SIGTERM), as a shell
//! reports a process killed by it. A second signal of the same kind, while the first is still
//! being honoured (a long prefill, a hung device), kills at once with the default action.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;

use anyhow::Context as _;

/// The stop request shared by the handlers and the generation loop.
#[derive(Debug, Clone, Default)]
pub struct Stop {
    /// The signal received, 0 while none.
    signal: Arc<AtomicUsize>,
}

impl Stop {
    /// Install the handlers for SIGINT and SIGTERM (unix; elsewhere a flag that never fires).
    pub fn install() -> anyhow::Result<Stop> {
        let stop = Stop::default();
        #[cfg(unix)]
        for sig in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
            let seen = Arc::new(AtomicBool::new(false));
            // Order matters: the conditional default runs before `seen` is set by the second
            // registration, so the first signal only sets the flags and the second kills.
            signal_hook::flag::register_conditional_default(sig, seen.clone())
                .with_context(|| format!("installing the handler of signal {sig}"))?;
            signal_hook::flag::register(sig, seen)
                .with_context(|| format!("installing the handler of signal {sig}"))?;
            signal_hook::flag::register_usize(sig, stop.signal.clone(), sig as usize)
                .with_context(|| format!("installing the handler of signal {sig}"))?;
        }
        Ok(stop)
    }

    /// The signal that asked to stop, if one did.
    pub fn requested(&self) -> Option<i32> {
        match self.signal.load(Ordering::SeqCst) {
            0 => None,
            s => i32::try_from(s).ok(),
        }
    }

    /// Record a stop request as the handler would (tests).
    #[cfg(test)]
    pub fn raise(&self, sig: i32) {
        self.signal.store(sig as usize, Ordering::SeqCst);
    }
}

/// Base of the exit status of a process stopped by a signal (`128 + signal`, the shell's
/// convention: 130 for SIGINT, 143 for SIGTERM).
const SIGNAL_EXIT_BASE: i32 = 128;

/// The exit status for a run stopped by `sig`.
pub fn exit_status(sig: i32) -> u8 {
    u8::try_from(SIGNAL_EXIT_BASE + sig).unwrap_or(u8::MAX)
}

/// The signal's name for the stats line.
pub fn signal_name(sig: i32) -> String {
    #[cfg(unix)]
    {
        if sig == signal_hook::consts::SIGINT {
            return "SIGINT".into();
        }
        if sig == signal_hook::consts::SIGTERM {
            return "SIGTERM".into();
        }
    }
    format!("signal {sig}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statuses_follow_the_shell() {
        assert_eq!(exit_status(2), 130);
        assert_eq!(exit_status(15), 143);
        let s = Stop::default();
        assert_eq!(s.requested(), None);
        s.raise(15);
        assert_eq!(s.requested(), Some(15));
        #[cfg(unix)]
        assert_eq!(signal_name(15), "SIGTERM");
    }
}
