//! Hostile and careless model files through the real `hipfire run`: every crafted case of
//! hipfire-model's corpus must end in a clean exit — status 2 and a bounded message naming the
//! key for a refused file, 0 for a valid one — never a signal, an abort or a hang; and a chat
//! template that cannot be used is never silently ignored: the run warns, bounded, and names
//! the ChatML fallback.
//!
//! `HIPFIRE_HOSTILE_DUMP=DIR` also writes the corpus to DIR (to try other builds on it).

#[path = "../../hipfire-model/tests/common/hostile.rs"]
mod hostile;

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use hostile::{Expect, MAX_MESSAGE_BYTES};

/// Longest one `hipfire run` of the tiny model may take (it takes well under a second).
const RUN_LIMIT: Duration = Duration::from_secs(60);
/// Bytes of stderr beyond the library's message: `error: loading <path>: ` and a newline.
const CONTEXT_SLACK: usize = 512;

struct Dir(PathBuf);

impl Dir {
    fn new(tag: &str) -> Dir {
        let d =
            std::env::temp_dir().join(format!("hipfire-hostile-cli-{}-{tag}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(d.join("home")).expect("scratch dir");
        std::fs::write(d.join("config.toml"), "").expect("empty config");
        Dir(d)
    }
}

impl Drop for Dir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// `hipfire run MODEL "Hi there" -n 2 -t 0 --device cpu --threads 1 EXTRA...`, killed after
/// [`RUN_LIMIT`].
fn run(dir: &Dir, model: &Path, extra: &[&str]) -> Output {
    let mut c = Command::new(env!("CARGO_BIN_EXE_hipfire"));
    for (k, _) in std::env::vars() {
        if k.starts_with("HIPFIRE_") || k == "RUST_LOG" {
            c.env_remove(k);
        }
    }
    let child = c
        .env("HIPFIRE_CONFIG", dir.0.join("config.toml"))
        .env("HIPFIRE_HOME", dir.0.join("home"))
        .arg("run")
        .arg(model)
        .args([
            "Hi there",
            "-n",
            "2",
            "-t",
            "0",
            "--device",
            "cpu",
            "--threads",
            "1",
        ])
        .args(extra)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn hipfire");
    let pid = child.id();
    let t0 = Instant::now();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(child.wait_with_output());
    });
    match rx.recv_timeout(RUN_LIMIT) {
        Ok(out) => out.expect("wait hipfire"),
        Err(_) => {
            // Only the child this test started, by its pid.
            let _ = Command::new("kill").arg("-9").arg(pid.to_string()).status();
            panic!(
                "hipfire run {} hung for {:?}",
                model.display(),
                t0.elapsed()
            );
        }
    }
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// Write the crafted corpus into `dir` (and into `HIPFIRE_HOSTILE_DUMP` when set).
fn corpus(dir: &Dir) -> Vec<(hostile::Case, PathBuf)> {
    let base = hostile::base_model(&dir.0);
    let dump = std::env::var_os("HIPFIRE_HOSTILE_DUMP").map(PathBuf::from);
    hostile::crafted(&base)
        .into_iter()
        .map(|case| {
            let path = dir.0.join(format!("{}.gguf", case.name));
            std::fs::write(&path, &case.bytes).expect("write case");
            if let Some(d) = &dump {
                std::fs::create_dir_all(d).expect("dump dir");
                std::fs::write(d.join(format!("{}.gguf", case.name)), &case.bytes).expect("dump");
            }
            (case, path)
        })
        .collect()
}

#[test]
fn every_crafted_model_exits_cleanly_with_a_bounded_message_naming_the_key() {
    let dir = Dir::new("crafted");
    let mut fails = Vec::new();
    for (case, path) in corpus(&dir) {
        let o = run(&dir, &path, &["--no-chat"]);
        let err = stderr(&o);
        let Some(code) = o.status.code() else {
            fails.push(format!("{}: killed by {} — {err}", case.name, o.status));
            continue;
        };
        let head: String = err.chars().take(300).collect();
        match case.expect {
            Expect::Loads | Expect::Either => {
                if code != 0 {
                    fails.push(format!("{}: exit {code}, must load: {head}", case.name));
                }
            }
            Expect::Refused(subs) => {
                if code != 2 {
                    fails.push(format!("{}: exit {code}, must be 2: {head}", case.name));
                }
                if err.len() > MAX_MESSAGE_BYTES + CONTEXT_SLACK {
                    fails.push(format!(
                        "{}: stderr of {} bytes: {head}",
                        case.name,
                        err.len()
                    ));
                }
                if let Some(s) = subs.iter().find(|s| !err.contains(*s)) {
                    fails.push(format!("{}: stderr lacks {s:?}: {head}", case.name));
                }
                if err.contains("panicked") {
                    fails.push(format!("{}: panicked: {head}", case.name));
                }
            }
        }
    }
    assert!(
        fails.is_empty(),
        "{} cases:\n{}",
        fails.len(),
        fails.join("\n")
    );
}

#[test]
fn chat_templates_render_or_fall_back_to_chatml_with_a_bounded_warning() {
    let dir = Dir::new("chat");
    let files = corpus(&dir);
    let path = |name: &str| {
        files
            .iter()
            .find(|(c, _)| c.name == name)
            .map(|(_, p)| p.clone())
            .expect("case")
    };

    // A non-ChatML template (100 KB long) is rendered by its own Jinja, with or without --chat.
    for extra in [&["--chat"][..], &[]] {
        let o = run(&dir, &path("chat-template-unknown"), extra);
        let err = stderr(&o);
        assert_eq!(o.status.code(), Some(0), "{extra:?}: {err}");
        assert!(!err.contains("warning"), "{extra:?}: {err}");
    }

    // A template that does not compile: the run goes on with ChatML after one bounded
    // warning that quotes the template's start and names the fallback.
    for extra in [&["--chat"][..], &[]] {
        let o = run(&dir, &path("chat-template-broken"), extra);
        let err = stderr(&o);
        assert_eq!(o.status.code(), Some(0), "{extra:?}: {err}");
        let warnings: Vec<&str> = err.lines().filter(|l| l.starts_with("warning:")).collect();
        assert_eq!(warnings.len(), 1, "{err}");
        assert!(
            warnings[0].contains("does not compile") && warnings[0].contains("{% for m in"),
            "{err}"
        );
        assert!(warnings[0].ends_with("; using ChatML instead"), "{err}");
        assert!(
            warnings[0].len() < MAX_MESSAGE_BYTES,
            "{} bytes",
            warnings[0].len()
        );
    }

    // --no-chat: no template is looked at, no warning.
    let o = run(&dir, &path("chat-template-broken"), &["--no-chat"]);
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(0), "{err}");
    assert!(!err.contains("warning"), "{err}");

    // --chat on a model with no template at all: ChatML, with a note saying so.
    let o = run(&dir, &path("valid"), &["--chat"]);
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(0), "{err}");
    assert!(err.contains("no chat template; using ChatML"), "{err}");

    // A ChatML template is used, with or without --chat.
    for extra in [&["--chat"][..], &[]] {
        let o = run(&dir, &path("chat-template-chatml"), extra);
        let err = stderr(&o);
        assert_eq!(o.status.code(), Some(0), "{extra:?}: {err}");
        assert!(!err.contains("warning"), "{err}");
    }
}
