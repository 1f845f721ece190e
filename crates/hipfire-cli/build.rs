//! Records the git commit the binary was built from (`hipfire version`), when known.
//! `HIPFIRE_GIT_COMMIT` at build time wins (for builds from a tarball); otherwise
//! `git rev-parse --short=12 HEAD`; otherwise nothing (the binary prints "unknown").

use std::path::Path;
use std::process::Command;

fn main() {
    println!("cargo:rerun-if-env-changed=HIPFIRE_GIT_COMMIT");
    let commit = std::env::var("HIPFIRE_GIT_COMMIT")
        .ok()
        .filter(|s| !s.is_empty())
        .or_else(|| {
            let out = Command::new("git")
                .args(["rev-parse", "--short=12", "HEAD"])
                .output()
                .ok()?;
            out.status
                .success()
                .then(|| String::from_utf8_lossy(&out.stdout).trim().to_string())
        });
    if let Some(c) = commit.filter(|c| !c.is_empty()) {
        println!("cargo:rustc-env=HIPFIRE_GIT_COMMIT={c}");
    }
    // Rebuild when HEAD moves. Only name files that exist: a missing rerun-if-changed path
    // makes cargo rerun this script on every build.
    let git_dir = Command::new("git")
        .args(["rev-parse", "--absolute-git-dir"])
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string());
    if let Some(g) = git_dir {
        let g = Path::new(&g);
        for f in [g.join("HEAD"), g.join("packed-refs")] {
            if f.exists() {
                println!("cargo:rerun-if-changed={}", f.display());
            }
        }
        if let Ok(head) = std::fs::read_to_string(g.join("HEAD")) {
            if let Some(r) = head.strip_prefix("ref: ") {
                let f = g.join(r.trim());
                if f.exists() {
                    println!("cargo:rerun-if-changed={}", f.display());
                }
            }
        }
    }
}
