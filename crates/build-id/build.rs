//! Computes `PLEXUS_BUILD_ID`: a SHA-256 over every file of the workspace's `crates/` and
//! `plugins/` (by path and content, in path order), the workspace's `Cargo.toml` and
//! `Cargo.lock`, the compiler's version and the profile, target and flags cargo builds with.

use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

fn main() {
    let manifest = PathBuf::from(std::env::var_os("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR"));
    let workspace = manifest.ancestors().nth(2).expect("crates/build-id sits two levels below the workspace");
    let mut files = Vec::new();
    for dir in ["crates", "plugins"] {
        let dir = workspace.join(dir);
        println!("cargo:rerun-if-changed={}", dir.display());
        collect(&dir, &mut files);
    }
    for file in ["Cargo.toml", "Cargo.lock"] {
        let file = workspace.join(file);
        println!("cargo:rerun-if-changed={}", file.display());
        files.push(file);
    }
    files.sort();
    let mut digest = Sha256::new();
    for file in &files {
        let content = std::fs::read(file).unwrap_or_else(|e| panic!("read {}: {e}", file.display()));
        let name = file.strip_prefix(workspace).unwrap_or(file);
        digest.update(name.as_os_str().as_encoded_bytes());
        digest.update([0]);
        digest.update((content.len() as u64).to_le_bytes());
        digest.update(&content);
    }
    let rustc = std::env::var("RUSTC").unwrap_or_else(|_| "rustc".into());
    let version = std::process::Command::new(&rustc).arg("-vV").output().map(|o| o.stdout).unwrap_or_default();
    digest.update(&version);
    for var in ["PROFILE", "OPT_LEVEL", "DEBUG", "TARGET", "CARGO_ENCODED_RUSTFLAGS", "CARGO_CFG_PANIC"] {
        digest.update(var.as_bytes());
        digest.update(std::env::var(var).unwrap_or_default().as_bytes());
        digest.update([0]);
    }
    let hex: String = digest.finalize()[..8].iter().map(|b| format!("{b:02x}")).collect();
    println!("cargo:rustc-env=PLEXUS_BUILD_ID={hex}");
}

/// Every regular file beneath `dir` (build output directories excluded), never through a symlink.
fn collect(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else { return };
    for entry in entries.flatten() {
        let path = entry.path();
        let Ok(kind) = entry.file_type() else { continue };
        if kind.is_dir() && entry.file_name() != "target" {
            collect(&path, out);
        } else if kind.is_file() {
            out.push(path);
        }
    }
}
