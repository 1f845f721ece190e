//! `hipfire serve` end to end: scripts/serve_check.py drives live servers with the official
//! `openai` Python client (chat and completion, stream and not; batch invariance of 16
//! concurrent greedy requests; the bad-request list; a bounded load run with stable RSS; 429,
//! disconnect and SIGTERM on a one-slot server). Needs SmolLM2 (`HIPFIRE_SMOLLM2_GGUF`) and
//! `python3 -c "import openai"`; skips, saying which is missing, otherwise.

use std::path::{Path, PathBuf};
use std::process::Command;

fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// Why this machine cannot run the check, if it cannot.
fn missing_prerequisite() -> Option<String> {
    match std::env::var("HIPFIRE_SMOLLM2_GGUF") {
        Ok(p) if Path::new(&p).is_file() => {}
        _ => {
            return Some(
                "HIPFIRE_SMOLLM2_GGUF is not set to a file (scripts/smollm2-path.sh)".into(),
            )
        }
    }
    let has_openai = Command::new("python3")
        .args(["-c", "import openai"])
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false);
    (!has_openai).then(|| "python3 cannot import openai (pip install openai)".into())
}

#[cfg(unix)]
#[test]
fn serve_passes_the_openai_client_checks() {
    if let Some(why) = missing_prerequisite() {
        eprintln!("skipped: {why}");
        return;
    }
    let model = std::env::var("HIPFIRE_SMOLLM2_GGUF").unwrap_or_default();
    let root = workspace_root();
    let o = Command::new("python3")
        .arg(root.join("scripts/serve_check.py"))
        .args([
            "--hipfire",
            env!("CARGO_BIN_EXE_hipfire"),
            "--model",
            &model,
        ])
        .current_dir(&root)
        .output()
        .expect("spawn python3");
    let (out, err) = (
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr),
    );
    println!("{out}");
    assert!(o.status.success(), "serve_check.py failed:\n{out}\n{err}");
    assert!(out.contains("all serve checks passed"), "{out}\n{err}");
}
