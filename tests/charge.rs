//! Memory charged once (issue 42): a kept pool is charged to the keeper's
//! cgroup, once; the engines that lease it (two tenants at once), each in a
//! cgroup of its own, map and touch every page of it (`--pin mlock`) and
//! are charged nothing for it. A page of shared memory is charged to the
//! group of the process that first faulted it, and the keeper prefaults the
//! whole pool before any engine maps it.
//!
//! Measured in real child cgroups of this process's own: the memory
//! controller's (`memory.usage_in_bytes` and `memory.stat` under cgroup v1,
//! `memory.current` and `memory.stat` under v2, whichever the node has) for
//! a 1 GiB `shm-segmented` pool; the hugetlb controller's for a pool of
//! 2 MiB pages, where the node has huge pages reserved and the controller
//! (`cargo xtask test`). Needs root.

mod support;

use std::process::Child;
use std::time::Duration;

use serde_json::{Value, json};
use support::cgroup::{Group, Parent};
use support::procs::{
    Children, bin, hugetlbfs_2m, name, read_json_line, read_report, required, root_or_skip,
    terminate, within,
};

const MIB: u64 = 1 << 20;
const GIB: u64 = 1 << 30;

/// Read the `hostpool` binary once from this process, so that its pages are
/// in the page cache (charged to this process's group) before a child
/// group runs it: otherwise the first group to run it could be charged for
/// the pages of the binary it reads, which is not the pool.
fn warm_the_binary() {
    let mut f = std::fs::File::open(env!("CARGO_BIN_EXE_hostpool")).unwrap();
    std::io::copy(&mut f, &mut std::io::sink()).unwrap();
}

/// A field of `/proc/PID/status` in bytes (`RssShmem`, `VmLck`).
fn status_bytes(pid: u32, field: &str) -> u64 {
    let text = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    text.lines()
        .find_map(|l| {
            let rest = l.strip_prefix(field)?.strip_prefix(':')?;
            rest.split_whitespace().next()?.parse::<u64>().ok()
        })
        .unwrap_or_else(|| panic!("no {field} in /proc/{pid}/status"))
        * 1024
}

/// A keeper of `pool` with the pool flags `args` and `--tenants 2`, started
/// inside `group`: its children and its ready line.
fn keeper_in(group: &Group<'_>, pool: &str, args: &[&str]) -> (Children, Value) {
    let mut cmd = bin();
    cmd.args(["keep", "--name", pool, "--tenants", "2", "--json"])
        .args(args);
    let mut k = Children(vec![
        group
            .run_in(&cmd)
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap(),
    ]);
    let ready = read_json_line(&mut k[0]);
    assert_eq!(ready["name"], pool, "{ready}");
    (k, ready)
}

/// An engine that leases `pool` inside `group`, pins it with `mlock` (which
/// faults every page of it into the engine's own page tables) and holds it:
/// the engine and its report.
fn engine_in(group: &Group<'_>, pool: &str) -> (Child, Value) {
    let mut cmd = bin();
    cmd.args([
        "alloc",
        "--keeper",
        pool,
        "--pin",
        "mlock",
        "--pin-required",
    ])
    .args(["--hold", "--json"]);
    let mut e = group
        .run_in(&cmd)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let report = read_report(&mut e);
    (e, report)
}

/// What a group is charged for its memory: the usage and the lines of
/// `memory.stat` that say what it is (v1's `rss` and `cache`, v2's `anon`
/// and `file`; `shmem` in both).
fn memory_charge(what: &str, g: &Group<'_>) -> Value {
    let usage = g.memory_usage();
    let stat = g.memory_stat();
    let line = |k: &str| stat.get(k).copied();
    json!({
        "group": what,
        "dir": g.dir,
        "usage": usage,
        "factor": usage as f64 / GIB as f64,
        "shmem": line("shmem"),
        "anon": line("rss").or(line("anon")),
        "file": line("cache").or(line("file")),
    })
}

/// A 1 GiB kept pool (`shm-segmented`, 4 KiB pages) leased by two engines
/// at once, the keeper and each engine in a memory cgroup of its own: the
/// keeper's group is charged the pool once (within 10 %: the pool is all of
/// its `shmem`), each engine's less than 5 % of it (its own heap and page
/// tables), though each maps and touches every page (`RssShmem`, `VmLck`).
/// The charge stays with the keeper after the engines end, and goes once the
/// keeper ends.
#[test]
fn a_kept_pool_is_charged_to_the_keepers_cgroup_once_and_to_no_engine() {
    if !root_or_skip("needs root to make memory cgroups") {
        return;
    }
    let parent = match Parent::find("memory") {
        Ok(p) => p,
        Err(why) => {
            assert!(!required(), "{why}");
            eprintln!("skip: {why}");
            return;
        }
    };
    warm_the_binary();
    let kg = parent.child("charge-keeper");
    let groups = [
        parent.child("charge-engine-a"),
        parent.child("charge-engine-b"),
    ];
    let pool = name("charge");
    let (mut keeper, ready) = keeper_in(
        &kg,
        &pool,
        &["--size", "1GiB", "--backing", "shm-segmented"],
    );
    assert_eq!(ready["size"], GIB, "{ready}");
    assert_eq!(
        kg.procs(),
        vec![keeper[0].id()],
        "the keeper runs in its group"
    );
    let mut engines = Children(Vec::new());
    for g in &groups {
        let (e, report) = engine_in(g, &pool);
        assert_eq!(report["keeper"]["tenants"], 2, "{report}");
        assert_eq!(report["prefault"]["bytes"], 0, "resident: {report}");
        assert_eq!(g.procs(), vec![e.id()], "the engine runs in its group");
        engines.push(e);
    }
    // Both engines hold it at once, and each has every page mapped.
    for e in engines.iter() {
        let rss = status_bytes(e.id(), "RssShmem");
        assert!(rss >= GIB, "engine {}: RssShmem {rss}", e.id());
        assert!(status_bytes(e.id(), "VmLck") >= GIB, "engine {}", e.id());
    }

    let keeper_charge = memory_charge("keeper", &kg);
    let engine_charges: Vec<Value> = groups
        .iter()
        .zip(["engine a", "engine b"])
        .map(|(g, what)| memory_charge(what, g))
        .collect();
    eprintln!(
        "{}",
        json!({"cgroup_version": if parent.v2 { 2 } else { 1 }, "pool": GIB,
               "keeper": keeper_charge, "engines": engine_charges})
    );
    let near = |v: u64| v.abs_diff(GIB) <= GIB / 10;
    assert!(
        near(keeper_charge["usage"].as_u64().unwrap()),
        "the keeper's group is charged the pool once: {keeper_charge}"
    );
    assert!(
        near(keeper_charge["shmem"].as_u64().unwrap()),
        "the keeper's group's shmem is the pool: {keeper_charge}"
    );
    for c in &engine_charges {
        assert!(
            c["usage"].as_u64().unwrap() < GIB / 20,
            "an engine's group is charged nothing for the pool: {c}"
        );
        assert!(
            c["shmem"].as_u64().unwrap() < GIB / 20,
            "an engine's group holds none of the pool's shmem: {c}"
        );
    }

    // The engines end: the charge stays with the keeper, which still holds
    // the pool.
    for e in engines.iter_mut() {
        terminate(e, Duration::from_secs(10));
    }
    let after = memory_charge("keeper", &kg);
    assert!(
        near(after["usage"].as_u64().unwrap()),
        "after the engines: {after}"
    );
    // The keeper ends: the pool's pages are freed, and its group's charge
    // with them.
    terminate(&mut keeper[0], Duration::from_secs(30));
    assert!(
        within(Duration::from_secs(5), || kg.memory_usage() < GIB / 20),
        "the keeper's group is still charged {} bytes after it ended",
        kg.memory_usage()
    );
}

/// A kept pool of 2 MiB huge pages (hugetlbfs) leased by two engines at
/// once, each process in a hugetlb cgroup of its own: the keeper's group is
/// charged every page (`hugetlb.2MB.current`, v1's `usage_in_bytes`),
/// each engine's none, though each maps and pins every page; and the
/// keeper's charge is gone once it ends. Runs where 2 MiB huge pages are
/// reserved (`cargo xtask test`) and a hierarchy has the hugetlb
/// controller.
#[test]
fn a_hugetlbfs_kept_pool_is_charged_to_the_keepers_hugetlb_group_once() {
    const PAGES: u64 = 16;
    if !root_or_skip("needs root to make hugetlb cgroups") {
        return;
    }
    let Some(dir) = hugetlbfs_2m(PAGES) else {
        return;
    };
    let parent = match Parent::find("hugetlb") {
        Ok(p) => p,
        Err(why) => {
            // Under `cargo xtask test` the node has huge pages reserved and
            // the controller: a skip then is a failure.
            assert!(!required(), "{why}");
            eprintln!("skip: {why}");
            return;
        }
    };
    let usage_file = if parent.v2 {
        "hugetlb.2MB.current"
    } else {
        "hugetlb.2MB.usage_in_bytes"
    };
    warm_the_binary();
    let kg = parent.child("hugetlb-keeper");
    let groups = [
        parent.child("hugetlb-engine-a"),
        parent.child("hugetlb-engine-b"),
    ];
    let charged = |g: &Group<'_>| {
        g.read(usage_file)
            .unwrap_or_else(|| panic!("{} has no {usage_file}", g.dir.display()))
    };
    let pool = name("charge-huge");
    let size = format!("{}MiB", PAGES * 2);
    let dir = dir.to_str().expect("a UTF-8 mount path");
    let (mut keeper, ready) = keeper_in(
        &kg,
        &pool,
        &["--size", &size, "--backing", "hugetlbfs", "--dir", dir],
    );
    assert_eq!(ready["page_size"], 2 * MIB, "{ready}");
    let mut engines = Children(Vec::new());
    for g in &groups {
        let (e, report) = engine_in(g, &pool);
        assert_eq!(report["keeper"]["tenants"], 2, "{report}");
        engines.push(e);
    }
    let figures = json!({
        "keeper": charged(&kg),
        "engines": groups.iter().map(charged).collect::<Vec<_>>(),
        "file": usage_file,
    });
    eprintln!("{figures}");
    assert_eq!(charged(&kg), PAGES * 2 * MIB, "{figures}");
    for g in &groups {
        assert_eq!(charged(g), 0, "{}: {figures}", g.dir.display());
    }
    for e in engines.iter_mut() {
        terminate(e, Duration::from_secs(10));
    }
    assert_eq!(charged(&kg), PAGES * 2 * MIB, "after the engines");
    terminate(&mut keeper[0], Duration::from_secs(30));
    assert!(
        within(Duration::from_secs(5), || charged(&kg) == 0),
        "the keeper's hugetlb group is still charged {} bytes after it ended",
        charged(&kg)
    );
}
