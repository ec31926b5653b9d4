//! Puts the rowclaim commit the adapter was built from into its descriptor's `version`, and
//! builds again only when that commit changes (not on every `cargo build`: the harness builds
//! before each cell).
use std::process::Command;

fn git(args: &[&str]) -> Option<String> {
    let out = Command::new("git").args(args).output().ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).trim().to_string())
}

fn main() {
    let sha = git(&["rev-parse", "--short=12", "HEAD"]).unwrap_or_else(|| "unknown".into());
    println!("cargo:rustc-env=ROWCLAIM_ADAPTER_VERSION=rowclaim@{sha}");
    println!("cargo:rerun-if-changed=build.rs");
    // HEAD, and the branch file it names (in a worktree both live under the main .git).
    let mut watched = vec!["HEAD".to_string()];
    watched.extend(git(&["symbolic-ref", "-q", "HEAD"]));
    for name in watched {
        if let Some(path) = git(&["rev-parse", "--path-format=absolute", "--git-path", &name]) {
            if std::path::Path::new(&path).exists() {
                println!("cargo:rerun-if-changed={path}");
            }
        }
    }
}
