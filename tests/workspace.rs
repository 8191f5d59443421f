//! Rules of the workspace that the README states, checked on the sources:
//! `unsafe` only in `sys` modules, under a workspace lint every crate obeys.

use std::path::{Path, PathBuf};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap().flatten() {
        let path = entry.path();
        let name = entry.file_name();
        if path.is_dir() {
            if name != "target" && name != ".git" {
                rust_files(&path, out);
            }
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

fn manifests(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap().flatten() {
        let path = entry.path();
        if path.is_dir() && entry.file_name() != "target" && entry.file_name() != ".git" {
            manifests(&path, out);
        } else if entry.file_name() == "Cargo.toml" {
            out.push(path);
        }
    }
}

/// A `#![allow(unsafe_code)]` is allowed only as the first inner attribute
/// of a `sys` module: a file `sys.rs` or `sys/*.rs`, or an inline `mod sys {`.
#[test]
fn unsafe_code_is_allowed_only_in_sys_modules() {
    let mut files = Vec::new();
    rust_files(&root(), &mut files);
    assert!(files.len() > 50, "found only {} files", files.len());
    let mut offenders = Vec::new();
    for f in &files {
        let text = std::fs::read_to_string(f).unwrap();
        let in_sys_file = f.file_name().is_some_and(|n| n == "sys.rs")
            || f.parent()
                .and_then(Path::file_name)
                .is_some_and(|n| n == "sys");
        for (at, _) in text.match_indices("allow(unsafe_code)") {
            let before = &text[..at];
            let line = &before[before.rfind('\n').map_or(0, |i| i + 1)..];
            if line.trim_start().starts_with("//") {
                continue;
            }
            let inline_sys = before
                .rfind("mod sys {")
                .is_some_and(|m| !before[m..].contains("\n}\n"));
            if !(in_sys_file || inline_sys) {
                offenders.push(format!("{}:{}", f.display(), before.lines().count() + 1));
            }
        }
    }
    assert!(
        offenders.is_empty(),
        "unsafe allowed outside sys: {offenders:#?}"
    );
}

#[test]
fn the_workspace_denies_unsafe_code_and_every_crate_takes_its_lints() {
    let top = std::fs::read_to_string(root().join("Cargo.toml")).unwrap();
    assert!(top.contains("unsafe_code = \"deny\""), "{top}");
    let mut found = Vec::new();
    manifests(&root(), &mut found);
    let members: Vec<_> = found
        .iter()
        .filter(|m| std::fs::read_to_string(m).unwrap().contains("[package]"))
        .collect();
    assert!(members.len() >= 10, "{members:?}");
    for m in members {
        let text = std::fs::read_to_string(m).unwrap();
        assert!(
            text.contains("[lints]\nworkspace = true"),
            "{} does not take the workspace lints",
            m.display()
        );
    }
}
