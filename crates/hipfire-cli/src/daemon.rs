//! The daemon lock. A running hipfire daemon owns the GPU and keeps the CPU busy, so a
//! measurement taken beside it would describe the daemon's load, not the machine: measuring
//! commands (`bench`, `offload-bench`) refuse (exit 1) while a daemon holds the lock.
//!
//! The lock is an `flock(2)` on the pid file, held by the daemon for its whole lifetime
//! ([`DaemonLock::acquire`]); the pid written in the file is only for messages. A process
//! that crashes releases its lock with its descriptors, so a stale pid file, or one naming a
//! live process that is not a hipfire daemon (pid 1 after a reboot), is never obeyed.

use std::fs::File;
use std::io::Write as _;
use std::path::{Path, PathBuf};

/// Name of the daemon's pid file inside hipfire's data directory.
pub const PID_FILE: &str = "daemon.pid";

/// The pid file path: `$HIPFIRE_HOME/daemon.pid`, else `<local data dir>/hipfire/daemon.pid`.
pub fn pid_file() -> Option<PathBuf> {
    hipfire_config::hipfire_home(&hipfire_config::ProcessEnv).map(|h| h.join(PID_FILE))
}

/// A live daemon: the lock on its pid file is held.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LiveDaemon {
    /// The pid the file names, when it names one (the lock is what counts, not this).
    pub pid: Option<u32>,
}

impl std::fmt::Display for LiveDaemon {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.pid {
            Some(p) => write!(f, "pid {p}"),
            None => f.write_str("pid unknown"),
        }
    }
}

/// Why [`DaemonLock::acquire`] failed.
#[derive(Debug)]
pub enum LockError {
    /// Another process holds the lock.
    Held {
        /// The pid file.
        path: PathBuf,
        /// Who holds it.
        holder: LiveDaemon,
    },
    /// Opening, locking or writing the pid file failed.
    Io {
        /// The pid file.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
}

impl std::fmt::Display for LockError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            LockError::Held { path, holder } => write!(
                f,
                "a hipfire daemon already holds {} ({holder})",
                path.display()
            ),
            LockError::Io { path, .. } => write!(f, "cannot lock {}", path.display()),
        }
    }
}

impl std::error::Error for LockError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            LockError::Held { .. } => None,
            LockError::Io { source, .. } => Some(source),
        }
    }
}

/// The daemon's hold on the pid file: an exclusive `flock` for as long as this value lives
/// (`hipfire serve` keeps it for its lifetime). Dropping it empties the file and
/// releases the lock; the file is not deleted, so a process waiting on it never ends up
/// locking an unlinked inode while a third locks a new file of the same name.
#[derive(Debug)]
pub struct DaemonLock {
    file: File,
    path: PathBuf,
}

/// Attempts of a non-blocking exclusive lock before [`LockError::Held`]: a measuring command's
/// check holds a shared lock for microseconds, so a few retries 10 ms apart ride over it.
const ACQUIRE_ATTEMPTS: u32 = 20;
/// Pause between those attempts.
const ACQUIRE_RETRY: std::time::Duration = std::time::Duration::from_millis(10);

impl DaemonLock {
    /// Take the lock on `path` (creating it and its directory) and write this process's pid
    /// into it; [`LockError::Held`] when another process holds it.
    pub fn acquire(path: &Path) -> Result<DaemonLock, LockError> {
        let io = |source| LockError::Io {
            path: path.to_path_buf(),
            source,
        };
        if let Some(d) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(d).map_err(io)?;
        }
        let mut file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(path)
            .map_err(io)?;
        let mut attempt = 0;
        loop {
            match try_lock(&file, LockKind::Exclusive) {
                Ok(true) => break,
                Ok(false) if attempt + 1 < ACQUIRE_ATTEMPTS => {
                    attempt += 1;
                    std::thread::sleep(ACQUIRE_RETRY);
                }
                Ok(false) => {
                    return Err(LockError::Held {
                        path: path.to_path_buf(),
                        holder: LiveDaemon {
                            pid: read_pid(path),
                        },
                    })
                }
                Err(e) => return Err(io(e)),
            }
        }
        file.set_len(0).map_err(io)?;
        writeln!(file, "{}", std::process::id()).map_err(io)?;
        file.sync_all().map_err(io)?;
        Ok(DaemonLock {
            file,
            path: path.to_path_buf(),
        })
    }

    /// The pid file.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for DaemonLock {
    fn drop(&mut self) {
        // Empty it while still holding the lock, so no reader sees our pid after we exit.
        let _ = self.file.set_len(0);
    }
}

/// The live daemon holding the lock on the pid file at `path`, if any. A missing file, or one
/// whose lock nobody holds (a stale file after a crash, any pid written by hand), is no daemon.
pub fn live_daemon(path: &Path) -> Option<LiveDaemon> {
    let file = File::open(path).ok()?;
    // A shared lock is refused only while someone holds the exclusive one; on success it is
    // released at once when `file` closes.
    match try_lock(&file, LockKind::Shared) {
        Ok(false) => Some(LiveDaemon {
            pid: read_pid(path),
        }),
        // Locked for us (no daemon), or flock unsupported there (nothing can hold it either).
        Ok(true) | Err(_) => None,
    }
}

/// The pid written in the file, when it is one.
fn read_pid(path: &Path) -> Option<u32> {
    let text = std::fs::read_to_string(path).ok()?;
    text.split_whitespace().next()?.parse().ok()
}

/// Which `flock` to try.
#[derive(Debug, Clone, Copy)]
enum LockKind {
    Shared,
    Exclusive,
}

/// One non-blocking `flock`: `Ok(true)` locked, `Ok(false)` held by another open file.
#[cfg(unix)]
fn try_lock(file: &File, kind: LockKind) -> std::io::Result<bool> {
    use std::os::fd::AsRawFd;
    let op = match kind {
        LockKind::Shared => libc::LOCK_SH,
        LockKind::Exclusive => libc::LOCK_EX,
    } | libc::LOCK_NB;
    loop {
        // SAFETY: flock on a descriptor we own; it touches no memory.
        if unsafe { libc::flock(file.as_raw_fd(), op) } == 0 {
            return Ok(true);
        }
        let e = std::io::Error::last_os_error();
        match e.raw_os_error() {
            Some(libc::EWOULDBLOCK) => return Ok(false),
            Some(libc::EINTR) => continue,
            _ => return Err(e),
        }
    }
}

/// No advisory locks here: nothing can hold one, so there is never a live daemon.
#[cfg(not(unix))]
fn try_lock(_file: &File, _kind: LockKind) -> std::io::Result<bool> {
    Ok(true)
}

/// The refusal every measuring command prints (to stderr; stdout stays empty so a script
/// capturing JSON sees nothing rather than half a report), or `None` to go ahead.
pub fn refusal(command: &str) -> Option<String> {
    let pf = pid_file()?;
    let d = live_daemon(&pf)?;
    Some(format!(
        "a hipfire daemon is live ({d}, holding the lock on {}); stop it first — {command} \
         measures the device directly and would measure the daemon's load too",
        pf.display()
    ))
}

#[cfg(all(test, unix))]
mod tests {
    use super::*;

    fn scratch(tag: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("hipfire-pid-{}-{tag}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).expect("dir");
        d
    }

    #[test]
    fn only_a_held_lock_is_a_daemon() {
        let d = scratch("held");
        let p = d.join(PID_FILE);
        assert_eq!(live_daemon(&p), None, "missing file");
        // Live pids written by hand, with nobody holding the lock, are not obeyed.
        for text in ["1\n", &format!("{}\n", std::process::id()), "abc", ""] {
            std::fs::write(&p, text).expect("w");
            assert_eq!(live_daemon(&p), None, "{text:?}");
        }
        let lock = DaemonLock::acquire(&p).expect("acquire");
        assert_eq!(
            live_daemon(&p),
            Some(LiveDaemon {
                pid: Some(std::process::id())
            })
        );
        // A second daemon is refused while the first lives, naming the first.
        match DaemonLock::acquire(&p) {
            Err(LockError::Held { holder, .. }) => {
                assert_eq!(holder.pid, Some(std::process::id()))
            }
            other => panic!("second acquire: {other:?}"),
        }
        drop(lock);
        assert_eq!(live_daemon(&p), None, "released on drop");
        assert_eq!(std::fs::read_to_string(&p).expect("r"), "", "pid cleared");
        let again = DaemonLock::acquire(&p).expect("reacquire after release");
        assert_eq!(again.path(), p);
        let _ = std::fs::remove_dir_all(&d);
    }
}
