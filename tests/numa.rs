//! NUMA placement through the shipped binary (issue 20): `numa_node` as a
//! number, one node per rank of a shared pool, and `"gpu"` (the node of
//! `[cuda] device`, from the CUDA test double's PCI address and sysfs).
//!
//! This machine has one node, so the binding path runs for real with node
//! 0, and a fake sysfs tree (`HOSTPOOL_TEST_SYSFS_ROOT`, read only by a test
//! build) of two nodes checks the per-rank choice in the plan.

mod support;

use std::path::Path;
use std::process::{Output, Stdio};
use std::time::Duration;

use serde_json::Value;
use support::procs::{Children, addr, bin, hugetlbfs_2m, name, read_report, signal, wait_timeout};
use support::{TempDir, fake_driver_dir, output_text};

const MIB: u64 = 1 << 20;

fn run(args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut c = bin();
    c.args(args);
    for (k, v) in env {
        c.env(k, v);
    }
    c.output().unwrap()
}

fn json(o: &Output) -> Value {
    assert_eq!(o.status.code(), Some(0), "{}", output_text(o));
    serde_json::from_slice(&o.stdout).unwrap_or_else(|e| panic!("{e}: {}", output_text(o)))
}

fn usage_error(o: &Output, needle: &str) {
    let text = output_text(o);
    assert_eq!(o.status.code(), Some(2), "{text}");
    assert!(text.contains(needle), "{needle:?} not in: {text}");
}

/// A sysfs tree of a host with these nodes (and CPUs) and PCI devices
/// (address, node, local CPUs).
fn fake_sysfs(tag: &str, nodes: &[(u32, &str)], pci: &[(&str, i32, &str)]) -> TempDir {
    let root = TempDir::new(&format!("sysfs-{tag}"));
    let node_dir = root.0.join("devices/system/node");
    std::fs::create_dir_all(&node_dir).unwrap();
    let online: Vec<String> = nodes.iter().map(|(n, _)| n.to_string()).collect();
    std::fs::write(node_dir.join("online"), format!("{}\n", online.join(","))).unwrap();
    for (n, cpus) in nodes {
        let d = node_dir.join(format!("node{n}"));
        std::fs::create_dir_all(&d).unwrap();
        std::fs::write(d.join("cpulist"), format!("{cpus}\n")).unwrap();
    }
    for (address, node, cpus) in pci {
        let d = root.0.join("bus/pci/devices").join(address);
        std::fs::create_dir_all(&d).unwrap();
        std::fs::write(d.join("numa_node"), format!("{node}\n")).unwrap();
        std::fs::write(d.join("local_cpulist"), format!("{cpus}\n")).unwrap();
    }
    root
}

fn shared(pool: &str, world: u32, rank: u32) -> Vec<String> {
    [
        "--shared",
        pool,
        "--world",
        &world.to_string(),
        "--rank",
        &rank.to_string(),
    ]
    .iter()
    .map(|s| s.to_string())
    .collect()
}

fn with<'a>(base: &'a [&'a str], more: &'a [String]) -> Vec<&'a str> {
    base.iter()
        .copied()
        .chain(more.iter().map(String::as_str))
        .collect()
}

/// `world` ranks of shared pool `pool` holding it (`alloc --hold --json`,
/// the sharing flags, and what `each` adds for its rank); their reports.
fn held_ranks(
    pool: &str,
    world: u32,
    each: impl Fn(u32, &mut std::process::Command),
) -> (Children, Vec<Value>) {
    let mut ranks = Children(
        (0..world)
            .map(|r| {
                let mut c = bin();
                c.args(["alloc", "--hold", "--json"]);
                each(r, &mut c);
                c.args(shared(pool, world, r))
                    .stdout(Stdio::piped())
                    .stderr(Stdio::piped())
                    .spawn()
                    .unwrap()
            })
            .collect(),
    );
    let reports = ranks.0.iter_mut().map(read_report).collect();
    (ranks, reports)
}

/// SIGTERM every rank; each must exit 0 within 20 s.
fn release(mut ranks: Children) {
    for c in &ranks.0 {
        signal(c, libc::SIGTERM);
    }
    for c in &mut ranks.0 {
        let status = wait_timeout(c, Duration::from_secs(20)).expect("a rank hung");
        assert!(status.success(), "{status:?}");
    }
}

#[test]
fn a_numa_node_that_cannot_be_honoured_is_a_usage_error() {
    usage_error(
        &run(&["plan", "--numa-node", "banana"], &[]),
        "is not a node",
    );
    usage_error(
        &run(&["plan", "--numa-node", "0,0"], &[]),
        "this pool is private",
    );
    let s = shared(&name("numa-bad"), 2, 0);
    usage_error(
        &run(&with(&["plan", "--numa-node", "0,0,0"], &s), &[]),
        "lists 3 node(s) for a shared pool of 2 ranks",
    );
    usage_error(
        &run(&with(&["plan", "--numa-node", "0,77"], &s), &[]),
        "NUMA node 77 does not exist",
    );
    for (value, needle) in [
        ("\"cpu\"", "\"cpu\" is not a node"),
        ("-1", "-1 is not a node number"),
        ("1.5", "numa_node must be"),
    ] {
        let cfg = TempDir::new(&format!("numa-cfg-{}", value.len()));
        let path = cfg.0.join("pool.toml");
        std::fs::write(&path, format!("numa_node = {value}\n")).unwrap();
        usage_error(
            &run(&["plan", "--config", path.to_str().unwrap()], &[]),
            needle,
        );
    }
}

#[test]
fn each_rank_binds_its_own_shard_and_the_report_places_every_shard() {
    let pool = name("numa-ranks");
    let world = 2;
    let (ranks, reports) = held_ranks(&pool, world, |_, c| {
        c.args([
            "--size",
            "64MiB",
            "--numa-node",
            "0,0",
            "--attach-timeout",
            "20",
        ]);
    });
    for (rank, r) in reports.iter().enumerate() {
        let n = &r["numa"];
        assert_eq!(n["asked"], serde_json::json!([0, 0]), "{n}");
        assert_eq!(n["node"], 0, "{n}");
        assert_eq!(n["rank"], rank, "{n}");
        assert_eq!(n["nodes"], serde_json::json!([0, 0]), "{n}");
        assert_eq!(n["bound"], true, "{n}");
        assert!(n["sampled"].as_u64().unwrap() >= 2, "{n}");
        assert_eq!(n["on_node"], n["sampled"], "every page of its shard: {n}");
        let shards = n["shards"].as_array().unwrap();
        assert_eq!(shards.len(), world as usize, "{n}");
        let own = &r["sharing"]["shard"];
        let mine = &shards[rank];
        assert_eq!(mine["rank"], rank);
        assert_eq!(mine["offset"], own["offset"], "{n} vs {own}");
        assert_eq!(mine["bytes"], own["len"], "{n} vs {own}");
        assert_eq!(
            mine["pages"]["0"], mine["sampled"],
            "its own shard is all on node 0: {n}"
        );
        let total: u64 = shards.iter().map(|s| s["bytes"].as_u64().unwrap()).sum();
        assert_eq!(total, 64 * MIB, "the shards tile the pool: {n}");
        for s in shards {
            assert_eq!(s["node"], 0, "a list names every rank's node: {s}");
        }
    }
    release(ranks);
}

#[test]
fn a_fake_two_node_host_gives_each_rank_its_own_node_in_the_plan() {
    let sysfs = fake_sysfs("two-nodes", &[(0, "0-1"), (1, "2-3")], &[]);
    let root = sysfs.0.to_str().unwrap();
    let env = [("HOSTPOOL_TEST_SYSFS_ROOT", root)];
    let pool = name("numa-plan");
    for rank in 0..2u32 {
        let s = shared(&pool, 2, rank);
        let p = json(&run(
            &with(
                &["plan", "--json", "--size", "64MiB", "--numa-node", "0,1"],
                &s,
            ),
            &env,
        ));
        let n = &p["numa"];
        assert_eq!(n["node"], rank, "{n}");
        assert_eq!(n["nodes"], serde_json::json!([0, 1]), "{n}");
        let explain = p["explain"].to_string();
        assert!(
            explain.contains(&format!("rank {rank} takes node {rank}"))
                && explain.contains("bind this rank's shard (32 MiB"),
            "{explain}"
        );
    }
    // The kernel has no node 1: binding to it is the kernel's refusal
    // (exit 1, naming the call and the remedy), and nothing is left behind.
    let o = run(&["alloc", "--size", "8MiB", "--numa-node", "1"], &env);
    let text = output_text(&o);
    assert_eq!(o.status.code(), Some(1), "{text}");
    assert!(
        text.contains("mbind") && text.contains("node 1 is online but the kernel refused it"),
        "{text}"
    );
    // Without the fake tree node 1 does not exist at all.
    usage_error(
        &run(&["plan", "--numa-node", "1"], &[]),
        "NUMA node 1 does not exist",
    );
}

/// The CUDA test double's addresses for two devices and a sysfs tree that
/// places them.
fn gpu_env<'a>(libs: &'a Path, sysfs: &'a Path) -> Vec<(&'a str, &'a str)> {
    vec![
        ("LD_LIBRARY_PATH", libs.to_str().unwrap()),
        ("HOSTPOOL_TEST_SYSFS_ROOT", sysfs.to_str().unwrap()),
        ("FAKE_CUDA_DEVICES", "3"),
        (
            "FAKE_CUDA_PCI_BUS_IDS",
            "00000000:3B:00.0,0000:BC:00.0,0009:01:00.0",
        ),
    ]
}

fn cuda_config(dir: &TempDir, device: u32, extra: &str) -> String {
    let path = dir.0.join(format!("cuda{device}.toml"));
    std::fs::write(&path, format!("{extra}[cuda]\ndevice = {device}\n")).unwrap();
    path.to_str().unwrap().to_string()
}

#[test]
fn numa_node_gpu_is_the_node_of_the_pools_cuda_device() {
    let libs = fake_driver_dir("numa-gpu");
    let two = fake_sysfs(
        "gpu-two",
        &[(0, "0-1"), (1, "2-3")],
        &[
            ("0000:3b:00.0", 0, "0-1"),
            ("0000:bc:00.0", 1, "2-3"),
            ("0009:01:00.0", -1, ""),
        ],
    );
    let env = gpu_env(&libs.0, &two.0);
    let cfgs = TempDir::new("numa-gpu-cfg");
    // Each rank of a shared pool finds its own GPU's node.
    let pool = name("numa-gpu");
    for (rank, node) in [(0u32, 0u32), (1, 1)] {
        let cfg = cuda_config(&cfgs, rank, "");
        let s = shared(&pool, 2, rank);
        let p = json(&run(
            &with(
                &["plan", "--json", "--config", &cfg, "--numa-node", "gpu"],
                &s,
            ),
            &env,
        ));
        let n = &p["numa"];
        assert_eq!(n["asked"], "gpu", "{n}");
        assert_eq!(n["node"], node, "{n}");
        assert_eq!(n["gpu"]["device"], rank, "{n}");
        assert_eq!(n["gpu"]["plugin"], "cuda", "{n}");
        assert!(n["nodes"].is_null(), "a rank knows only its own GPU: {n}");
        let want = if rank == 0 {
            "0000:3b:00.0"
        } else {
            "0000:bc:00.0"
        };
        assert_eq!(n["gpu"]["pci_address"], want, "{n}");
        assert!(
            p["explain"]
                .to_string()
                .contains(&format!("is on NUMA node {node}")),
            "{p}"
        );
    }
    // A GPU whose node is -1: no binding, said in the plan and the report.
    let cfg = cuda_config(&cfgs, 2, "");
    let p = json(&run(
        &["plan", "--json", "--config", &cfg, "--numa-node", "gpu"],
        &env,
    ));
    assert!(p["numa"]["node"].is_null(), "{p}");
    assert!(
        p["numa"]["reason"]
            .as_str()
            .unwrap()
            .contains("has no NUMA node (sysfs says -1"),
        "{p}"
    );
    let r = json(&run(
        &[
            "alloc",
            "--json",
            "--size",
            "8MiB",
            "--config",
            &cfg,
            "--numa-node",
            "gpu",
        ],
        &env,
    ));
    assert_eq!(r["numa"]["bound"], false, "{r}");
    assert_eq!(r["numa"]["sampled"], 0, "{r}");
    // A device that does not exist, or no driver at all: clear errors that
    // name the way out.
    let cfg = cuda_config(&cfgs, 7, "");
    let o = run(&["plan", "--config", &cfg, "--numa-node", "gpu"], &env);
    let text = output_text(&o);
    assert_ne!(o.status.code(), Some(0), "{text}");
    assert!(
        text.contains("device 7") && text.contains("[cuda] device"),
        "{text}"
    );
    let empty = TempDir::new("numa-no-driver");
    let o = run(
        &["plan", "--numa-node", "gpu"],
        &[("LD_LIBRARY_PATH", empty.0.to_str().unwrap())],
    );
    let text = output_text(&o);
    if !support::real_driver_present() {
        assert_eq!(o.status.code(), Some(1), "{text}");
        assert!(
            text.contains("numa_node") && text.contains("as a number"),
            "{text}"
        );
    }
}

#[test]
fn numa_node_gpu_binds_each_rank_on_this_one_node_host() {
    // Both GPUs on node 0, this host's one node: the binding path runs for
    // real, and each rank's report says its GPU and its shard's placement.
    let libs = fake_driver_dir("numa-gpu-bind");
    let one = fake_sysfs(
        "gpu-one",
        &[(0, "0-1")],
        &[("0000:3b:00.0", 0, "0-1"), ("0000:bc:00.0", 0, "0-1")],
    );
    let env = gpu_env(&libs.0, &one.0);
    let cfgs = TempDir::new("numa-gpu-bind-cfg");
    let pool = name("numa-gpu-bind");
    let (ranks, reports) = held_ranks(&pool, 2, |r, c| {
        c.args(["--size", "32MiB", "--config", &cuda_config(&cfgs, r, "")])
            .args(["--numa-node", "gpu", "--attach-timeout", "20"])
            .envs(env.iter().copied());
    });
    for (rank, r) in reports.iter().enumerate() {
        let n = &r["numa"];
        assert_eq!(n["gpu"]["device"], rank, "{n}");
        assert_eq!(n["node"], 0, "{n}");
        assert_eq!(n["bound"], true, "{n}");
        assert_eq!(n["on_node"], n["sampled"], "{n}");
        let shards = n["shards"].as_array().unwrap();
        assert_eq!(shards.len(), 2, "{n}");
        assert_eq!(shards[rank]["node"], 0, "{n}");
        assert!(
            shards[1 - rank]["node"].is_null(),
            "a peer's GPU is the peer's to find: {n}"
        );
    }
    release(ranks);
}

/// The memory policy `/proc/PID/numa_maps` gives the mapping that starts at
/// `start` (`bind:0`, `default`).
fn policy_at(pid: u32, start: u64) -> String {
    let maps = std::fs::read_to_string(format!("/proc/{pid}/numa_maps")).unwrap();
    let want = format!("{start:x} ");
    maps.lines()
        .find(|l| l.starts_with(&want))
        .and_then(|l| l.split_whitespace().nth(1))
        .unwrap_or_else(|| panic!("no mapping starts at {start:#x} in:\n{maps}"))
        .to_string()
}

#[test]
fn each_rank_binds_only_its_own_shard_as_numa_maps_shows() {
    // hugetlbfs mappings take a policy of their own per range (the kernel
    // splits the mapping where mbind starts and ends), so numa_maps shows
    // which part of the pool each rank bound: its shard, not its peer's.
    let Some(dir) = hugetlbfs_2m(16) else { return };
    let pool = name("numa-maps");
    let (ranks, reports) = held_ranks(&pool, 2, |_, c| {
        c.args([
            "--size",
            "16MiB",
            "--backing",
            "hugetlbfs",
            "--dir",
            dir.to_str().unwrap(),
        ])
        .args(["--numa-node", "0,0", "--attach-timeout", "20"]);
    });
    for (rank, r) in reports.iter().enumerate() {
        let base = addr(r);
        let pid = ranks.0[rank].id();
        let shards = r["numa"]["shards"].as_array().unwrap();
        for (i, s) in shards.iter().enumerate() {
            let at = base + s["offset"].as_u64().unwrap();
            let policy = policy_at(pid, at);
            if i == rank {
                assert_eq!(policy, "bind:0", "rank {rank} binds its own shard {s}");
            } else {
                assert_eq!(
                    policy, "default",
                    "rank {rank} leaves rank {i}'s shard {s} alone"
                );
            }
        }
    }
    release(ranks);
}
