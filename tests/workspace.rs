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

/// The attributes of `text` (`#[...]` and `#![...]` that begin a line, up to
/// their matching `]`, across lines), with the line each starts on.
fn attributes(text: &str) -> Vec<(usize, String)> {
    let mut out = Vec::new();
    let mut offset = 0;
    for (number, line) in text.lines().enumerate() {
        let start = offset + (line.len() - line.trim_start().len());
        offset += line.len() + 1;
        let rest = &text[start..];
        if !(rest.starts_with("#[") || rest.starts_with("#![")) {
            continue;
        }
        let mut depth = 0usize;
        for (i, c) in rest.char_indices() {
            match c {
                '[' => depth += 1,
                ']' => {
                    depth -= 1;
                    if depth == 0 {
                        out.push((number + 1, rest[..=i].to_string()));
                        break;
                    }
                }
                _ => {}
            }
        }
    }
    out
}

/// Whether an attribute lowers the `unsafe_code` lint: `unsafe_code` inside
/// `allow(...)`, `expect(...)` or `warn(...)`, at any depth
/// (`cfg_attr(test, allow(dead_code, unsafe_code))` too).
fn lowers_unsafe_code(attr: &str) -> bool {
    let mut open: Vec<String> = Vec::new();
    let mut word = String::new();
    for c in attr.chars().chain(std::iter::once(' ')) {
        if c.is_alphanumeric() || c == '_' {
            word.push(c);
            continue;
        }
        if word == "unsafe_code"
            && open
                .iter()
                .any(|w| matches!(w.as_str(), "allow" | "expect" | "warn"))
        {
            return true;
        }
        match c {
            '(' => open.push(std::mem::take(&mut word)),
            ')' => {
                open.pop();
                word.clear();
            }
            c if c.is_whitespace() => {}
            _ => word.clear(),
        }
        if !c.is_whitespace() {
            word.clear();
        }
    }
    false
}

#[test]
fn the_attribute_reader_sees_every_spelling_of_an_unsafe_allowance() {
    let lowered = [
        "#![allow(unsafe_code)]",
        "#![allow(dead_code, unsafe_code)]",
        "#[expect(unsafe_code)]",
        "#[warn( unsafe_code )]",
        "#[cfg_attr(test, allow(unsafe_code))]",
    ];
    for a in lowered {
        assert!(lowers_unsafe_code(a), "{a}");
    }
    let kept = [
        "#![deny(unsafe_code)]",
        "#![forbid(unsafe_code)]",
        "#[allow(unsafe_op_in_unsafe_fn)]",
        "#[allow(clippy::undocumented_unsafe_blocks)]",
        "#[doc = \"unsafe_code\"]",
    ];
    for a in kept {
        assert!(!lowers_unsafe_code(a), "{a}");
    }
    let text = "fn a() {}\n    #[cfg_attr(\n        test,\n        allow(dead_code, unsafe_code)\n    )]\nfn b() {}\n";
    let found = attributes(text);
    assert_eq!(found.len(), 1, "{found:?}");
    assert_eq!(found[0].0, 2);
    assert!(lowers_unsafe_code(&found[0].1));
}

/// Lowering the `unsafe_code` lint (`allow`, `expect` or `warn`, in any
/// spelling) is allowed only in a `sys` module: a file `sys.rs` or
/// `sys/*.rs`, or an inline `mod sys {`.
#[test]
fn unsafe_code_is_allowed_only_in_sys_modules() {
    let mut files = Vec::new();
    rust_files(&root(), &mut files);
    assert!(files.len() > 50, "found only {} files", files.len());
    let mut offenders = Vec::new();
    let mut allowances = 0;
    for f in &files {
        let text = std::fs::read_to_string(f).unwrap();
        let in_sys_file = f.file_name().is_some_and(|n| n == "sys.rs")
            || f.parent()
                .and_then(Path::file_name)
                .is_some_and(|n| n == "sys");
        for (line, attr) in attributes(&text) {
            if !lowers_unsafe_code(&attr) {
                continue;
            }
            allowances += 1;
            let before: String = text.lines().take(line - 1).collect::<Vec<_>>().join("\n");
            let inline_sys = before
                .rfind("mod sys {")
                .is_some_and(|m| !before[m..].contains("\n}"));
            if !(in_sys_file || inline_sys) {
                offenders.push(format!("{}:{line}: {attr}", f.display()));
            }
        }
    }
    // The sys modules themselves allow it: a reader that saw none would pass anything.
    assert!(
        allowances >= 5,
        "found only {allowances} unsafe_code allowances"
    );
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

/// The normal (linked) dependencies of `package`, by name, from `cargo tree`.
fn linked_packages(package: &str, features: &[&str]) -> Vec<String> {
    let mut cargo = std::process::Command::new(env!("CARGO"));
    cargo
        .current_dir(root())
        .args(["tree", "--offline", "-e", "normal", "--prefix", "none"])
        .args(["--format", "{p}", "-p", package]);
    for f in features {
        cargo.args(["--features", f]);
    }
    let out = cargo.output().expect("cargo tree runs");
    assert!(
        out.status.success(),
        "cargo tree -p {package}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.split_whitespace().next().map(str::to_string))
        .collect()
}

/// What only the CLI links.
const CLI_ONLY: [&str; 4] = ["clap", "indicatif", "bench-support", "hostpool-cli"];

#[test]
fn the_python_extension_and_the_library_link_no_cli_code() {
    for package in ["hostpool-py", "hostpool"] {
        let linked = linked_packages(package, &[]);
        assert!(
            linked.iter().any(|p| p == "pool-core") && linked.iter().any(|p| p == "backing-anon"),
            "{package} links the plugins: {linked:?}"
        );
        for cli in CLI_ONLY {
            assert!(
                !linked.iter().any(|p| p == cli),
                "{package} links {cli}, which only the CLI needs: {linked:?}"
            );
        }
    }
    // The check can fail: the CLI itself links all of them.
    let cli = linked_packages("hostpool-cli", &[]);
    for dep in ["clap", "indicatif", "bench-support"] {
        assert!(cli.iter().any(|p| p == dep), "hostpool-cli: {cli:?}");
    }
}
