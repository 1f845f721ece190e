//! The live-daemon check. A running hipfire daemon owns the GPU and keeps the CPU busy, so a
//! measurement taken beside it would describe the daemon's load, not the machine: measuring
//! commands refuse (exit 1) while its pid file names a live process.

use std::path::{Path, PathBuf};

/// Name of the daemon's pid file inside hipfire's data directory.
pub const PID_FILE: &str = "daemon.pid";

/// The pid file path: `$HIPFIRE_HOME/daemon.pid`, else `<local data dir>/hipfire/daemon.pid`.
pub fn pid_file() -> Option<PathBuf> {
    hipfire_config::hipfire_home(&hipfire_config::ProcessEnv).map(|h| h.join(PID_FILE))
}

/// The pid of a live daemon named by the pid file at `path`, if any. A missing, unreadable
/// or garbled file, or a pid whose process is gone (a stale file after a crash), is no daemon.
pub fn live_daemon(path: &Path) -> Option<u32> {
    let text = std::fs::read_to_string(path).ok()?;
    let pid: u32 = text.split_whitespace().next()?.parse().ok()?;
    // pid 0 would mean "our process group" to kill(2); it is never a daemon.
    (pid > 0 && pid_alive(pid)).then_some(pid)
}

/// Whether a process with this pid exists.
#[cfg(unix)]
fn pid_alive(pid: u32) -> bool {
    let Ok(pid) = libc::pid_t::try_from(pid) else {
        return false;
    };
    // SAFETY: kill with signal 0 sends nothing; it only checks that the pid exists and that we
    // may signal it. pid > 0 (checked by the caller), so it names one process, not a group.
    let r = unsafe { libc::kill(pid, 0) };
    // EPERM: the process exists but belongs to another user (still a live daemon).
    r == 0 || std::io::Error::last_os_error().raw_os_error() == Some(libc::EPERM)
}

/// Whether a process with this pid exists (no portable check: assume it does, so we refuse
/// rather than measure beside a daemon).
#[cfg(not(unix))]
fn pid_alive(_pid: u32) -> bool {
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn own_pid_is_live_and_garbage_is_not() {
        let dir = std::env::temp_dir().join(format!("hipfire-pid-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let p = dir.join(PID_FILE);
        assert_eq!(live_daemon(&p), None, "missing file");
        std::fs::write(&p, format!("{}\n", std::process::id())).expect("w");
        assert_eq!(live_daemon(&p), Some(std::process::id()));
        for junk in ["", "abc", "0", "-5", "99999999999"] {
            std::fs::write(&p, junk).expect("w");
            assert_eq!(live_daemon(&p), None, "{junk:?}");
        }
        let _ = std::fs::remove_dir_all(&dir);
    }
}
