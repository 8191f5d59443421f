//! Rules of the workspace that the docs state (`docs/design.md`), checked on
//! the sources: `unsafe` only in `sys` modules, under a workspace lint every
//! crate obeys; and every relative link in the docs resolves.

use std::collections::{BTreeMap, BTreeSet};
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

/// What only the CLI links (the keeper, a daemon, among them).
const CLI_ONLY: [&str; 5] = [
    "clap",
    "indicatif",
    "bench-support",
    "hostpool-keeper",
    "hostpool-cli",
];

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
    for dep in ["clap", "indicatif", "bench-support", "hostpool-keeper"] {
        assert!(cli.iter().any(|p| p == dep), "hostpool-cli: {cli:?}");
    }
}

/// The workspace crates each crate of the workspace depends on (its
/// `[dependencies]`, not its dev-dependencies), by package name.
fn crate_edges() -> BTreeMap<String, BTreeSet<String>> {
    let mut files = Vec::new();
    for parent in ["crates", "tests/out-of-tree"] {
        for entry in std::fs::read_dir(root().join(parent)).unwrap().flatten() {
            let manifest = entry.path().join("Cargo.toml");
            if manifest.exists() {
                files.push(manifest);
            }
        }
    }
    files.push(root().join("xtask/Cargo.toml"));
    let parsed: Vec<(String, Vec<String>)> = files
        .iter()
        .map(|f| {
            let text = std::fs::read_to_string(f).unwrap();
            let mut name = String::new();
            let mut deps = Vec::new();
            let mut section = String::new();
            for line in text.lines().map(str::trim) {
                if line.starts_with('[') {
                    section = line.to_string();
                    continue;
                }
                let key: String = line
                    .chars()
                    .take_while(|c| c.is_ascii_alphanumeric() || *c == '-' || *c == '_')
                    .collect();
                if section == "[package]" && key == "name" {
                    name = line.split('"').nth(1).unwrap_or_default().to_string();
                } else if section == "[dependencies]" && !key.is_empty() {
                    deps.push(key);
                }
            }
            (name, deps)
        })
        .collect();
    let members: BTreeSet<String> = parsed.iter().map(|(n, _)| n.clone()).collect();
    parsed
        .into_iter()
        .map(|(name, deps)| {
            let deps = deps.into_iter().filter(|d| members.contains(d)).collect();
            (name, deps)
        })
        .collect()
}

/// The edges `docs/design.md` allows, from its `crate-edges` block:
/// `crate: dep dep ...`, one crate a line.
fn allowed_edges(design: &str) -> BTreeMap<String, BTreeSet<String>> {
    let block = design
        .split("```crate-edges\n")
        .nth(1)
        .and_then(|b| b.split("```").next())
        .expect("docs/design.md has a crate-edges block");
    block
        .lines()
        .filter_map(|l| l.split_once(':'))
        .map(|(name, deps)| {
            let deps = deps.split_whitespace().map(str::to_string).collect();
            (name.trim().to_string(), deps)
        })
        .collect()
}

/// Every edge of `actual` that `allowed` does not allow, and every crate it
/// does not list.
fn edges_not_allowed(
    actual: &BTreeMap<String, BTreeSet<String>>,
    allowed: &BTreeMap<String, BTreeSet<String>>,
) -> Vec<String> {
    let mut wrong = Vec::new();
    for (name, deps) in actual {
        let Some(may) = allowed.get(name) else {
            wrong.push(format!(
                "{name} is not in docs/design.md's crate-edges table"
            ));
            continue;
        };
        for d in deps.difference(may) {
            wrong.push(format!("{name} -> {d}"));
        }
    }
    wrong
}

#[test]
fn every_crate_depends_only_on_what_the_design_allows() {
    let design = std::fs::read_to_string(root().join("docs/design.md")).unwrap();
    let allowed = allowed_edges(&design);
    let actual = crate_edges();
    assert!(actual.len() >= 19, "every crate is read: {actual:?}");
    let wrong = edges_not_allowed(&actual, &allowed);
    assert!(
        wrong.is_empty(),
        "edges docs/design.md does not allow: {wrong:?}"
    );
    // The core depends on the node's facts alone, which depend on no crate
    // of the workspace; the keeper, a daemon, is linked by the CLI alone.
    assert!(allowed["hostpool-node"].is_empty());
    assert_eq!(
        allowed["pool-core"].iter().collect::<Vec<_>>(),
        ["hostpool-node"]
    );
    let keeper_users: Vec<&String> = allowed
        .iter()
        .filter(|(_, deps)| deps.contains("hostpool-keeper"))
        .map(|(n, _)| n)
        .collect();
    assert_eq!(keeper_users, ["hostpool-cli"]);
    // The check can fail: the core naming the handoff, or a plugin the
    // keeper, is caught.
    let mut planted = actual.clone();
    planted
        .get_mut("pool-core")
        .unwrap()
        .insert("hostpool-handoff".into());
    planted
        .get_mut("backing-anon")
        .unwrap()
        .insert("hostpool-keeper".into());
    planted.insert("hostpool-new".into(), BTreeSet::new());
    assert_eq!(
        edges_not_allowed(&planted, &allowed),
        [
            "backing-anon -> hostpool-keeper",
            "hostpool-new is not in docs/design.md's crate-edges table",
            "pool-core -> hostpool-handoff",
        ]
    );
}

/// The first segment of each path in `tail`, the text right after a `::`:
/// `pool::X` gives `pool`, `{a, b::c, D as E}` gives `a`, `b` and `D`.
fn first_segments(tail: &str) -> Vec<String> {
    let ident = |s: &str| -> String {
        s.trim_start()
            .chars()
            .take_while(|c| c.is_alphanumeric() || *c == '_')
            .collect()
    };
    let Some(group) = tail.strip_prefix('{') else {
        return vec![ident(tail)]
            .into_iter()
            .filter(|s| !s.is_empty())
            .collect();
    };
    let mut out = Vec::new();
    let (mut depth, mut item_start) = (0usize, 0usize);
    for (i, c) in group.char_indices() {
        match c {
            '{' => depth += 1,
            '}' if depth == 0 => {
                out.push(ident(&group[item_start..i]));
                break;
            }
            '}' => depth -= 1,
            ',' if depth == 0 => {
                out.push(ident(&group[item_start..i]));
                item_start = i + 1;
            }
            _ => {}
        }
    }
    out.retain(|s| !s.is_empty());
    out
}

/// The names a root file's `pub use module::...;` statements re-export,
/// each with the module it comes from (`pub use background::{A as B, C}`
/// gives `B` and `C` from `background`).
fn root_reexports(root: &str) -> Vec<(String, String)> {
    let mut out = Vec::new();
    for (i, _) in root.match_indices("pub use ") {
        let stmt = &root[i + 8..];
        let stmt = &stmt[..stmt.find(';').unwrap_or(stmt.len())];
        let Some((module, rest)) = stmt.split_once("::") else {
            continue;
        };
        let rest = rest.trim();
        let items: Vec<&str> = match rest.strip_prefix('{') {
            Some(group) => group.trim_end_matches('}').split(',').collect(),
            None => vec![rest],
        };
        for item in items {
            let name = match item.split_once(" as ") {
                Some((_, alias)) => alias,
                None => item.rsplit("::").next().unwrap_or(item),
            };
            let name = name.trim().trim_matches(|c| c == '{' || c == '}');
            if !name.is_empty() {
                out.push((name.to_string(), module.trim().to_string()));
            }
        }
    }
    out
}

/// A source file's code: without its `#[cfg(test)] mod ...` blocks (whose
/// `super::` means the file's own module) and without `//` comments (a doc
/// link is no dependency).
fn code_of(text: &str) -> String {
    let text = text
        .find("#[cfg(test)]\nmod ")
        .map_or(text, |at| &text[..at]);
    text.lines()
        .map(|l| match l.find("//") {
            Some(at) if !l[..at].contains('"') => &l[..at],
            _ => l,
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// A module graph: for each module, the sibling modules it uses.
type Graph = BTreeMap<String, BTreeSet<String>>;

/// The top-level modules each top-level module of the crate in `src` uses
/// ([`module_graphs`] at the crate root).
fn module_graph(src: &Path) -> Graph {
    module_graphs(src).remove(&Vec::new()).unwrap_or_default()
}

/// The paths a `use` tree names, from its text after `crate::`, `super::`
/// or `self::`: `a::b::{c, d::{e, f as g}, *}` gives `[a, b, c]`,
/// `[a, b, d, e]`, `[a, b, d, f]` and `[a, b]`.
fn use_paths(tail: &str) -> Vec<Vec<String>> {
    fn ident(s: &str) -> (String, &str) {
        let s = s.trim_start();
        let end = s
            .char_indices()
            .find(|(_, c)| !(c.is_alphanumeric() || *c == '_'))
            .map_or(s.len(), |(i, _)| i);
        (s[..end].to_string(), &s[end..])
    }
    fn tree(s: &str, prefix: &[String], out: &mut Vec<Vec<String>>) {
        let mut path = prefix.to_vec();
        let mut rest = s.trim_start();
        loop {
            if let Some(group) = rest.strip_prefix('{') {
                let (mut depth, mut start) = (0usize, 0usize);
                for (i, c) in group.char_indices() {
                    match c {
                        '{' => depth += 1,
                        '}' if depth == 0 => {
                            tree(&group[start..i], &path, out);
                            return;
                        }
                        '}' => depth -= 1,
                        ',' if depth == 0 => {
                            tree(&group[start..i], &path, out);
                            start = i + 1;
                        }
                        _ => {}
                    }
                }
                return;
            }
            let (name, after) = ident(rest);
            if name.is_empty() || name == "self" {
                break;
            }
            path.push(name);
            match after.strip_prefix("::") {
                Some(more) => rest = more.trim_start(),
                None => break,
            }
        }
        if path.len() > prefix.len() || !path.is_empty() {
            out.push(path);
        }
    }
    let mut out = Vec::new();
    tree(tail, &[], &mut out);
    out
}

/// For each module of the crate in `src` (by its path from the crate root,
/// the root being `[]`), the graph of its child modules: which child uses
/// which, through every spelling at any depth: `crate::a::b::X`,
/// `crate::{a, b::{c, d}}`, `super::` and `super::super::` from anywhere,
/// and names a module re-exports (`crate::X` where the root says `pub use
/// m::X`, `super::Y` where the parent says `pub use n::Y`, followed through
/// every level). A use of `pool::report` from `pool::build` is an edge
/// `build -> report` in the graph of `pool`; a use of `host` from
/// `pool::plan` is an edge `pool -> host` in the root's.
fn module_graphs(src: &Path) -> BTreeMap<Vec<String>, Graph> {
    let root_file = ["lib.rs", "main.rs"]
        .iter()
        .map(|f| src.join(f))
        .find(|p| p.exists())
        .expect("a crate root");
    let mut files = Vec::new();
    rust_files(src, &mut files);
    let mut modules: BTreeMap<Vec<String>, String> = BTreeMap::new();
    for file in files {
        let rel = file.strip_prefix(src).unwrap();
        if rel.starts_with("bin") {
            continue;
        }
        let mut path: Vec<String> = if file == root_file {
            Vec::new()
        } else {
            rel.with_extension("")
                .iter()
                .map(|s| s.to_string_lossy().into_owned())
                .collect()
        };
        if path.last().is_some_and(|l| l == "mod") {
            path.pop();
        }
        modules.insert(path, code_of(&std::fs::read_to_string(&file).unwrap()));
    }
    let child = |parent: &[String], name: &str| -> Option<Vec<String>> {
        let mut p = parent.to_vec();
        p.push(name.to_string());
        modules.contains_key(&p).then_some(p)
    };
    // The child module a module's `pub use` re-exports `name` from.
    let reexport = |module: &[String], name: &str| -> Option<Vec<String>> {
        let text = modules.get(module)?;
        root_reexports(text)
            .into_iter()
            .chain(root_reexports(&text.replace("pub(crate) use ", "pub use ")))
            .find(|(item, _)| item == name)
            .and_then(|(_, from)| child(module, &from))
    };
    let resolve = |base: &[String], segs: &[String]| -> Vec<String> {
        let mut at = base.to_vec();
        for seg in segs {
            if let Some(next) = child(&at, seg) {
                at = next;
                continue;
            }
            while let Some(next) = reexport(&at, seg) {
                at = next;
            }
            break;
        }
        at
    };
    let mut graphs: BTreeMap<Vec<String>, Graph> = BTreeMap::new();
    for path in modules.keys() {
        if let Some((_, parent)) = path.split_last() {
            graphs
                .entry(parent.to_vec())
                .or_default()
                .entry(path[parent.len()].clone())
                .or_default();
        }
    }
    for (path, text) in &modules {
        let mut uses: Vec<Vec<String>> = Vec::new();
        let starts = |word: &str| -> Vec<usize> {
            text.match_indices(word)
                .map(|(i, _)| i)
                .filter(|&i| {
                    !text[..i]
                        .chars()
                        .next_back()
                        .is_some_and(|c| c.is_alphanumeric() || c == '_' || c == '$' || c == ':')
                })
                .collect()
        };
        for i in starts("crate::") {
            for segs in use_paths(&text[i + 7..]) {
                uses.push(resolve(&[], &segs));
            }
        }
        for i in starts("self::") {
            for segs in use_paths(&text[i + 6..]) {
                uses.push(resolve(path, &segs));
            }
        }
        for i in starts("super::") {
            let mut tail = &text[i..];
            let mut up = 0;
            while let Some(rest) = tail.strip_prefix("super::") {
                up += 1;
                tail = rest;
            }
            if up > path.len() {
                continue;
            }
            let base = &path[..path.len() - up];
            for segs in use_paths(tail) {
                uses.push(resolve(base, &segs));
            }
        }
        for target in uses {
            let common = path.iter().zip(&target).take_while(|(a, b)| a == b).count();
            // A module's use of its own ancestor or descendant is no edge
            // between siblings.
            if common == path.len() || common == target.len() {
                continue;
            }
            graphs
                .entry(path[..common].to_vec())
                .or_default()
                .entry(path[common].clone())
                .or_default()
                .insert(target[common].clone());
        }
    }
    graphs
}

/// A cycle in `graph`, if it has one.
fn cycle(graph: &BTreeMap<String, BTreeSet<String>>) -> Option<Vec<String>> {
    fn visit(
        node: &str,
        graph: &BTreeMap<String, BTreeSet<String>>,
        path: &mut Vec<String>,
        done: &mut BTreeSet<String>,
    ) -> Option<Vec<String>> {
        if let Some(at) = path.iter().position(|n| n == node) {
            let mut c = path[at..].to_vec();
            c.push(node.to_string());
            return Some(c);
        }
        if !done.insert(node.to_string()) {
            return None;
        }
        path.push(node.to_string());
        for dep in graph.get(node).into_iter().flatten() {
            if let Some(c) = visit(dep, graph, path, done) {
                return Some(c);
            }
        }
        path.pop();
        None
    }
    let mut done = BTreeSet::new();
    graph
        .keys()
        .find_map(|n| visit(n, graph, &mut Vec::new(), &mut done))
}

/// Every crate's `src` in the workspace.
fn crate_sources() -> Vec<PathBuf> {
    let mut out = Vec::new();
    for parent in ["crates", "tests/out-of-tree"] {
        for entry in std::fs::read_dir(root().join(parent)).unwrap().flatten() {
            let src = entry.path().join("src");
            if src.is_dir() {
                out.push(src);
            }
        }
    }
    out.push(root().join("xtask/src"));
    out.sort();
    out
}

#[test]
fn the_module_reader_sees_braces_super_and_root_reexports() {
    assert_eq!(first_segments("pool::X"), ["pool"]);
    assert_eq!(first_segments("{a, b::{c, d}, D as E}; x"), ["a", "b", "D"]);
    assert_eq!(
        root_reexports(
            "pub use background::{DEFAULT_CHUNK as CHUNK, PinStatus};\npub use sys::Region;"
        ),
        [
            ("CHUNK".to_string(), "background".to_string()),
            ("PinStatus".to_string(), "background".to_string()),
            ("Region".to_string(), "sys".to_string()),
        ]
    );
    // A planted crate whose only cycle goes through each blind spot of the
    // old reader: braces, a root re-export, and `super::` from a top module.
    let dir = std::env::temp_dir().join(format!("hostpool-modgraph-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(dir.join("c")).unwrap();
    std::fs::write(
        dir.join("lib.rs"),
        "mod a;\nmod b;\nmod c;\npub use a::Thing;\n",
    )
    .unwrap();
    std::fs::write(dir.join("a.rs"), "pub struct Thing;\nuse crate::{b, c};\n").unwrap();
    std::fs::write(
        dir.join("b.rs"),
        "pub fn f() -> crate::Thing { crate::Thing }\n",
    )
    .unwrap();
    std::fs::write(dir.join("c/mod.rs"), "mod inner;\n").unwrap();
    std::fs::write(dir.join("c/inner.rs"), "use super::super::Thing;\n").unwrap();
    let graph = module_graph(&dir);
    std::fs::remove_dir_all(&dir).unwrap();
    assert_eq!(
        graph["a"],
        BTreeSet::from(["b".to_string(), "c".to_string()])
    );
    assert_eq!(graph["b"], BTreeSet::from(["a".to_string()]));
    assert_eq!(graph["c"], BTreeSet::from(["a".to_string()]));
    assert!(cycle(&graph).is_some());
}

/// The reader sees a cycle between modules nested in a module, however
/// it is spelled: `super::sibling`, `crate::parent::sibling` and a name
/// the parent re-exports (the shape of the cycle `pool/` once had:
/// `build -> report -> plan -> build`).
#[test]
fn the_module_reader_sees_cycles_at_any_depth() {
    assert_eq!(
        use_paths("a::b::{c, d::{e, f as g}, *}; x"),
        [
            vec!["a", "b", "c"],
            vec!["a", "b", "d", "e"],
            vec!["a", "b", "d", "f"],
            vec!["a", "b"],
        ]
    );
    let dir = std::env::temp_dir().join(format!("hostpool-nested-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(dir.join("pool")).unwrap();
    let files = [
        ("lib.rs", "mod pool;\nmod host;\npub use pool::Plan;\n"),
        ("host.rs", "pub fn facts() {}\n"),
        (
            "pool/mod.rs",
            "mod build;\nmod plan;\nmod report;\npub use plan::Plan;\n",
        ),
        (
            "pool/build.rs",
            "use super::report::Report;\nuse crate::host::facts;\n",
        ),
        ("pool/report.rs", "pub struct Report(crate::Plan);\n"),
        (
            "pool/plan.rs",
            "pub struct Plan;\nfn f() { super::super::pool::build::go() }\n",
        ),
    ];
    for (name, text) in files {
        std::fs::write(dir.join(name), text).unwrap();
    }
    let graphs = module_graphs(&dir);
    std::fs::remove_dir_all(&dir).unwrap();
    let pool = &graphs[&vec!["pool".to_string()]];
    assert_eq!(pool["build"], BTreeSet::from(["report".to_string()]));
    assert_eq!(pool["report"], BTreeSet::from(["plan".to_string()]));
    assert_eq!(pool["plan"], BTreeSet::from(["build".to_string()]));
    assert!(cycle(pool).is_some());
    // At the root: pool uses host, nothing uses pool; no cycle there.
    let top = &graphs[&Vec::new()];
    assert_eq!(top["pool"], BTreeSet::from(["host".to_string()]));
    assert!(cycle(top).is_none());
}

#[test]
fn no_crate_has_a_module_cycle() {
    let mut checked = 0;
    let mut cycles = Vec::new();
    for src in crate_sources() {
        for (parent, graph) in module_graphs(&src) {
            if let Some(c) = cycle(&graph) {
                cycles.push(format!(
                    "{}: module cycle {} in {}; graph: {graph:?}",
                    src.display(),
                    c.join(" -> "),
                    if parent.is_empty() {
                        "the crate root".to_string()
                    } else {
                        parent.join("::")
                    }
                ));
            }
        }
        checked += 1;
    }
    assert!(cycles.is_empty(), "{}", cycles.join("\n"));
    assert!(checked >= 14, "only {checked} crates found");
}

/// Module names a crate root declares, public or not.
fn declared_modules(root: &str) -> (BTreeSet<String>, BTreeSet<String>) {
    let (mut public, mut private) = (BTreeSet::new(), BTreeSet::new());
    for line in root.lines().map(str::trim) {
        let (set, rest) = if let Some(r) = line.strip_prefix("pub mod ") {
            (&mut public, r)
        } else if let Some(r) = line.strip_prefix("mod ") {
            (&mut private, r)
        } else {
            continue;
        };
        if let Some(name) = rest.strip_suffix(';') {
            set.insert(name.trim().to_string());
        }
    }
    (public, private)
}

#[test]
fn every_pool_core_item_has_one_public_path() {
    // The root re-exports only what private modules define: an item of a
    // public module re-exported at the root would have two paths.
    let root = std::fs::read_to_string(root().join("crates/pool-core/src/lib.rs")).unwrap();
    let (public, private) = declared_modules(&root);
    assert!(
        public.contains("plugin") && private.contains("sys"),
        "{public:?} {private:?}"
    );
    let mut doubled = Vec::new();
    for (name, module) in root_reexports(&root) {
        if public.contains(&module) {
            doubled.push(format!(
                "{name} (pool_core::{module}::{name} and pool_core::{name})"
            ));
        }
    }
    // Nor does any module re-export what a public module defines.
    let mut files = Vec::new();
    rust_files(&self::root().join("crates/pool-core/src"), &mut files);
    for file in files {
        let text = code_of(&std::fs::read_to_string(&file).unwrap());
        for (i, _) in text.match_indices("pub use crate::") {
            let module: String = text[i + 15..]
                .chars()
                .take_while(|c| c.is_ascii_lowercase() || *c == '_')
                .collect();
            if public.contains(&module) {
                doubled.push(format!("{}: pub use crate::{module}::..", file.display()));
            }
        }
    }
    assert!(doubled.is_empty(), "items with two paths: {doubled:?}");
    // The check can fail: a planted re-export from a public module.
    let planted = format!("{root}\npub use plugin::Backing;\n");
    assert!(
        root_reexports(&planted)
            .iter()
            .any(|(n, m)| n == "Backing" && public.contains(m))
    );
}

/// GitHub's anchor of a heading: lowercase, punctuation other than `-` and
/// `_` dropped, spaces to `-`.
fn heading_slug(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter(|c| c.is_alphanumeric() || *c == '-' || *c == '_' || *c == ' ')
        .map(|c| if c == ' ' { '-' } else { c })
        .collect()
}

/// The anchors of a Markdown file's headings (outside code fences); a
/// repeated heading gets `-1`, `-2`, ... as on GitHub.
fn markdown_anchors(text: &str) -> BTreeSet<String> {
    let mut anchors = BTreeSet::new();
    let mut seen: BTreeMap<String, usize> = BTreeMap::new();
    let mut fence = false;
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            fence = !fence;
            continue;
        }
        if fence {
            continue;
        }
        let hashes = line.len() - line.trim_start_matches('#').len();
        if !(1..=6).contains(&hashes) || !line[hashes..].starts_with(' ') {
            continue;
        }
        let slug = heading_slug(&line[hashes..]);
        let count = seen.entry(slug.clone()).or_insert(0);
        anchors.insert(if *count == 0 {
            slug.clone()
        } else {
            format!("{slug}-{count}")
        });
        *count += 1;
    }
    anchors
}

/// The targets of the inline links `[text](target)` in a Markdown file,
/// outside code fences and code spans, with the line each is on.
fn markdown_links(text: &str) -> Vec<(usize, String)> {
    let mut links = Vec::new();
    let mut fence = false;
    for (number, line) in text.lines().enumerate() {
        if line.trim_start().starts_with("```") {
            fence = !fence;
            continue;
        }
        if fence {
            continue;
        }
        // Drop code spans, so `a[i](x)` in code is no link.
        let mut plain = String::new();
        let mut in_code = false;
        for c in line.chars() {
            if c == '`' {
                in_code = !in_code;
            } else if !in_code {
                plain.push(c);
            }
        }
        let mut rest = plain.as_str();
        while let Some(at) = rest.find("](") {
            let after = &rest[at + 2..];
            let Some(end) = after.find(')') else { break };
            let target = after[..end].split_whitespace().next().unwrap_or("");
            links.push((number + 1, target.to_string()));
            rest = &after[end..];
        }
    }
    links
}

/// The Markdown files whose links the test checks: `README.md`,
/// `CHANGELOG.md` and `docs/*.md`.
fn documentation_files() -> Vec<PathBuf> {
    let root = root();
    let mut files = vec![root.join("README.md"), root.join("CHANGELOG.md")];
    let mut docs: Vec<PathBuf> = std::fs::read_dir(root.join("docs"))
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|e| e == "md"))
        .collect();
    docs.sort();
    files.extend(docs);
    files
}

/// The broken relative links of `file` (`text` its contents): a path that
/// does not exist, or an `#anchor` that is no heading of the Markdown file
/// it points into.
fn broken_links(file: &Path, text: &str) -> Vec<String> {
    let mut broken = Vec::new();
    for (line, target) in markdown_links(text) {
        if target.starts_with("http://")
            || target.starts_with("https://")
            || target.starts_with("mailto:")
        {
            continue;
        }
        let (path, anchor) = match target.split_once('#') {
            Some((path, anchor)) => (path, Some(anchor)),
            None => (target.as_str(), None),
        };
        let resolved = if path.is_empty() {
            file.to_path_buf()
        } else {
            file.parent().unwrap().join(path)
        };
        let name = format!(
            "{}:{line}: {target}",
            file.strip_prefix(root()).unwrap_or(file).display()
        );
        if target.is_empty() || !resolved.exists() {
            broken.push(format!("{name} (no such file)"));
            continue;
        }
        let Some(anchor) = anchor else { continue };
        if resolved.extension().is_none_or(|e| e != "md") {
            continue;
        }
        let anchors = markdown_anchors(&std::fs::read_to_string(&resolved).unwrap());
        if !anchors.contains(anchor) {
            broken.push(format!("{name} (no heading with anchor `{anchor}`)"));
        }
    }
    broken
}

#[test]
fn the_link_reader_sees_links_anchors_and_code() {
    let text = "# A title, with `code`!\n\n## Kept pools (`hostpool keep`)\n\n## Kept pools (`hostpool keep`)\n\n\
                see [x](docs/a.md#b) and [y](#a-title-with-code) `[z](not/a/link)`\n\n```\n[w](nor/this)\n```\n";
    let anchors = markdown_anchors(text);
    assert!(anchors.contains("a-title-with-code"), "{anchors:?}");
    assert!(anchors.contains("kept-pools-hostpool-keep"), "{anchors:?}");
    assert!(
        anchors.contains("kept-pools-hostpool-keep-1"),
        "{anchors:?}"
    );
    let links: Vec<String> = markdown_links(text).into_iter().map(|(_, t)| t).collect();
    assert_eq!(links, ["docs/a.md#b", "#a-title-with-code"]);
    let readme = root().join("README.md");
    let broken = broken_links(
        &readme,
        "[a](docs/none.md) [b](#no-such-heading) [c](https://x) [d](docs/bench/)\n",
    );
    assert_eq!(broken.len(), 2, "{broken:?}");
}

#[test]
fn every_relative_link_in_the_docs_resolves() {
    let mut broken = Vec::new();
    for file in documentation_files() {
        let text =
            std::fs::read_to_string(&file).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
        broken.extend(broken_links(&file, &text));
    }
    assert!(
        broken.is_empty(),
        "broken links in the docs:\n{}",
        broken.join("\n")
    );
}
