//! Puts the rowclaim commit the adapter was built from into its descriptor's `version`.
use std::process::Command;

fn main() {
    let sha = Command::new("git")
        .args(["rev-parse", "--short=12", "HEAD"])
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_else(|| "unknown".into());
    println!("cargo:rustc-env=ROWCLAIM_ADAPTER_VERSION=rowclaim@{sha}");
    println!("cargo:rerun-if-changed=../../.git/HEAD");
}
