//! `hostpool doctor` through the shipped binary: every area on this node,
//! the pool check and its exit status, the CUDA and RDMA findings with and
//! without a driver, leftover files, and that nothing on the node changes.
//!
//! Under `cargo xtask test` (`HOSTPOOL_REQUIRE_HUGEPAGES=1`) the hugetlbfs
//! test must find the 2 MiB mount xtask made; elsewhere it skips. Likewise
//! the Mooncake test asks the test venv's python (`HOSTPOOL_TEST_PYTHON`,
//! required under `HOSTPOOL_REQUIRE_NIXL=1`), which has Mooncake's wheel.
//! The `engines` tests need only a `python3` on the `PATH`: they ask a venv
//! of it with no package, and fake engines and a fake hostpool on
//! `PYTHONPATH`.

mod support;

use support::{TempDir, fake_driver_dir, real_driver_present};

use std::collections::BTreeMap;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::{Mutex, MutexGuard};

use serde_json::Value;

/// Every area a doctor run without a pool reports.
const AREAS: [&str; 14] = [
    "memory",
    "hugepages",
    "hugetlbfs",
    "shm",
    "cgroup",
    "memlock",
    "thp",
    "kernel",
    "cuda",
    "rdma",
    "mooncake",
    "engines",
    "plugins",
    "leftovers",
];

/// Tests that put files in /dev/shm, and the test that checks /dev/shm does
/// not change, take turns.
static SHM: Mutex<()> = Mutex::new(());

fn shm_lock() -> MutexGuard<'static, ()> {
    SHM.lock().unwrap_or_else(|p| p.into_inner())
}

fn doctor_with(args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut c = Command::new(env!("CARGO_BIN_EXE_hostpool"));
    c.arg("doctor").args(args).env_remove("RUST_LOG");
    for (k, v) in env {
        c.env(k, v);
    }
    let out = c.output().expect("run hostpool doctor");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !stderr.contains("panicked"),
        "doctor {args:?} panicked:\n{stderr}"
    );
    out
}

fn doctor(args: &[&str]) -> Output {
    doctor_with(args, &[])
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn json(o: &Output) -> Value {
    serde_json::from_slice(&o.stdout).unwrap_or_else(|e| {
        panic!(
            "doctor printed no JSON ({e}):\n{}\n{}",
            stdout(o),
            String::from_utf8_lossy(&o.stderr)
        )
    })
}

fn findings<'a>(report: &'a Value, area: &str) -> Vec<&'a Value> {
    report["findings"]
        .as_array()
        .expect("findings is a list")
        .iter()
        .filter(|f| f["area"] == area)
        .collect()
}

fn text(v: &Value) -> &str {
    v.as_str().unwrap_or("")
}

fn required() -> bool {
    std::env::var("HOSTPOOL_REQUIRE_HUGEPAGES").as_deref() == Ok("1")
}

#[test]
fn every_area_is_in_the_json_and_a_node_without_a_pool_exits_0() {
    let o = doctor(&["--json"]);
    assert_eq!(o.status.code(), Some(0), "{}", stdout(&o));
    let r = json(&o);
    assert!(r["pool"].is_null(), "no pool was given: {:#}", r["pool"]);
    assert!(
        ["ok", "warn"].contains(&text(&r["verdict"])),
        "{:#}",
        r["verdict"]
    );
    for area in AREAS {
        assert!(!findings(&r, area).is_empty(), "no {area} finding in {r:#}");
    }
    assert!(findings(&r, "pool").is_empty());
    for f in r["findings"].as_array().unwrap() {
        for key in ["area", "item", "value", "verdict", "remedy"] {
            assert!(f.get(key).is_some(), "{key} missing in {f:#}");
        }
        assert!(
            !text(&f["item"]).is_empty() && !text(&f["value"]).is_empty(),
            "{f:#}"
        );
        match text(&f["verdict"]) {
            "ok" => assert!(f["remedy"].is_null(), "an ok finding with a remedy: {f:#}"),
            "info" | "warn" => assert!(
                !text(&f["remedy"]).is_empty(),
                "a finding that is not ok has no remedy: {f:#}"
            ),
            other => panic!("verdict {other:?} on a node without a pool: {f:#}"),
        }
    }
    // The plugin findings name exactly what `hostpool plugins` lists.
    let backings = findings(&r, "plugins")
        .into_iter()
        .find(|f| f["item"] == "backings")
        .unwrap();
    assert_eq!(text(&backings["value"]), "anon, hugetlbfs, shm-segmented");
}

#[test]
fn the_human_output_is_a_table_that_names_every_area() {
    let o = doctor(&[]);
    assert_eq!(o.status.code(), Some(0));
    let out = stdout(&o);
    let lines: Vec<&str> = out.lines().collect();
    assert!(
        lines[0].starts_with("VERDICT") && lines[0].contains("AREA") && lines[0].contains("VALUE"),
        "{out}"
    );
    for area in AREAS {
        assert!(
            lines
                .iter()
                .any(|l| l.split_whitespace().nth(1) == Some(area)),
            "no line of area {area}:\n{out}"
        );
    }
    // Aligned: findings with short items have their value in the column
    // the header names.
    let value_col = lines[0].find("VALUE").unwrap();
    for l in lines.iter().filter(|l| {
        matches!(
            l.split_whitespace().nth(1),
            Some("memory" | "kernel" | "thp" | "plugins" | "memlock")
        )
    }) {
        let b = l.as_bytes();
        assert!(
            b.get(value_col - 1) == Some(&b' ') && b.get(value_col).is_some_and(|c| *c != b' '),
            "misaligned: {l:?}\n{out}"
        );
    }
    let last = lines.last().unwrap();
    assert!(last.starts_with("verdict: "), "{out}");
    assert!(
        lines.len() <= 60,
        "more than a screen ({} lines):\n{out}",
        lines.len()
    );
}

#[test]
fn a_pool_the_node_cannot_hold_fails_with_exit_1_and_the_memavailable_remedy() {
    let o = doctor(&["--size", "1PiB", "--json"]);
    assert_eq!(o.status.code(), Some(1), "{}", stdout(&o));
    let r = json(&o);
    assert_eq!(r["verdict"], "fail");
    assert_eq!(r["pool"]["fits"], false, "{:#}", r["pool"]);
    assert_eq!(r["pool"]["logical_bytes"], 1u64 << 50);
    let pool = findings(&r, "pool");
    let verdict = pool.iter().find(|f| f["item"] == "verdict").unwrap();
    assert_eq!(verdict["verdict"], "fail", "{verdict:#}");
    assert!(text(&verdict["value"]).contains("DOES NOT FIT"));
    let mem = pool
        .iter()
        .find(|f| text(&f["value"]).contains("MemAvailable"))
        .unwrap_or_else(|| panic!("no MemAvailable check in {pool:#?}"));
    assert_eq!(mem["verdict"], "fail", "{mem:#}");
    assert!(text(&mem["remedy"]).contains("smaller --size"), "{mem:#}");
    // The same in words.
    let o = doctor(&["--size", "1PiB"]);
    assert_eq!(o.status.code(), Some(1));
    let out = stdout(&o);
    assert!(
        out.contains("DOES NOT FIT")
            && out.contains("MemAvailable")
            && out.contains("smaller --size"),
        "{out}"
    );
    assert!(
        out.trim_end().ends_with(')') && out.contains("verdict: fail"),
        "{out}"
    );
}

#[test]
fn a_pool_that_fits_is_checked_and_exits_0() {
    let o = doctor(&["--size", "64MiB", "--json"]);
    assert_eq!(o.status.code(), Some(0), "{}", stdout(&o));
    let r = json(&o);
    assert_eq!(r["pool"]["fits"], true);
    let pool = findings(&r, "pool");
    assert!(
        pool.iter()
            .any(|f| f["item"] == "verdict" && f["value"] == "fits")
    );
    assert!(pool.iter().any(|f| f["item"] == "plan"));
}

#[test]
fn a_config_with_an_unknown_key_exits_2() {
    let dir = TempDir::new("badkey");
    let path = dir.0.join("pool.toml");
    std::fs::write(&path, "size = \"1GiB\"\nsizee = \"2GiB\"\n").unwrap();
    let o = doctor(&["--config", path.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(2));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("sizee"), "{err}");
    assert!(o.stdout.is_empty(), "{}", stdout(&o));
    // A usage error in a flag too.
    let o = doctor(&["--size", "384G"]);
    assert_eq!(o.status.code(), Some(2));
}

#[test]
fn the_2mib_hugetlbfs_mount_is_listed_with_its_page_size_and_the_pools_free_count() {
    let Some(dir) = std::env::var_os("HOSTPOOL_TEST_HUGETLBFS_2M").map(PathBuf::from) else {
        assert!(
            !required(),
            "HOSTPOOL_REQUIRE_HUGEPAGES=1 but HOSTPOOL_TEST_HUGETLBFS_2M is not set"
        );
        eprintln!("skip: no HOSTPOOL_TEST_HUGETLBFS_2M (run `cargo xtask test` as root)");
        return;
    };
    let dir = dir.canonicalize().unwrap();
    let free_2m = || -> u64 {
        std::fs::read_to_string("/sys/kernel/mm/hugepages/hugepages-2048kB/free_hugepages")
            .unwrap()
            .trim()
            .parse()
            .unwrap()
    };
    // Retried only if something else changes the pool while doctor runs.
    for attempt in 1..=5 {
        let before = free_2m();
        let o = doctor(&["--json"]);
        let after = free_2m();
        if before != after && attempt < 5 {
            continue;
        }
        assert_eq!(o.status.code(), Some(0));
        let r = json(&o);
        let mount = findings(&r, "hugetlbfs")
            .into_iter()
            .find(|f| Path::new(text(&f["item"])).canonicalize().ok() == Some(dir.clone()))
            .unwrap_or_else(|| panic!("{} not listed: {r:#}", dir.display()));
        assert_eq!(mount["details"]["page_size"], 2u64 << 20, "{mount:#}");
        assert!(text(&mount["value"]).contains("2 MiB pages"), "{mount:#}");
        assert!(
            text(&mount["value"]).contains(&format!("2 MiB pool: {before} free")),
            "{mount:#}"
        );
        let pool = findings(&r, "hugepages")
            .into_iter()
            .find(|f| f["details"]["page_size"] == 2u64 << 20)
            .unwrap_or_else(|| panic!("no 2 MiB pool finding: {r:#}"));
        assert_eq!(pool["details"]["free"], before, "{pool:#}");
        assert!(
            text(&pool["value"]).contains(&format!("free {before}")),
            "{pool:#}"
        );
        // Human output lists the mount too.
        let out = stdout(&doctor(&[]));
        let raw = std::env::var("HOSTPOOL_TEST_HUGETLBFS_2M").unwrap_or_default();
        assert!(
            out.contains("2 MiB pages")
                && (out.contains(&raw) || out.contains(&dir.display().to_string())),
            "{out}"
        );
        return;
    }
}

#[test]
fn the_cuda_finding_says_the_driver_is_absent_without_one() {
    if real_driver_present() {
        eprintln!("skip: this host has a real libcuda.so.1");
        return;
    }
    let empty = TempDir::new("nocuda");
    let o = doctor_with(
        &["--json"],
        &[("LD_LIBRARY_PATH", empty.0.to_str().unwrap())],
    );
    assert_eq!(o.status.code(), Some(0));
    let r = json(&o);
    let cuda = findings(&r, "cuda");
    assert_eq!(cuda.len(), 1, "{cuda:#?}");
    assert!(
        text(&cuda[0]["value"]).starts_with("absent: ")
            && text(&cuda[0]["value"]).contains("libcuda.so.1"),
        "{:#}",
        cuda[0]
    );
    assert_eq!(cuda[0]["verdict"], "info");
    assert!(text(&cuda[0]["remedy"]).contains("NVIDIA driver"));
}

#[test]
fn the_cuda_finding_lists_the_driver_version_and_devices_and_pins_nothing() {
    let libs = fake_driver_dir("doctor");
    let log = libs.0.join("calls.log");
    let env = [
        ("LD_LIBRARY_PATH", libs.0.to_str().unwrap()),
        ("FAKE_CUDA_DEVICES", "2"),
        ("FAKE_CUDA_LOG", log.to_str().unwrap()),
    ];
    let o = doctor_with(&["--json", "--size", "64MiB", "--pin", "cuda"], &env);
    assert_eq!(o.status.code(), Some(0), "{}", stdout(&o));
    let r = json(&o);
    let cuda = findings(&r, "cuda");
    assert_eq!(cuda[0]["verdict"], "ok", "{:#}", cuda[0]);
    assert_eq!(
        text(&cuda[0]["value"]),
        "CUDA 12.8, 2 devices: 0: fake-cuda device 0, 1: fake-cuda device 1"
    );
    assert_eq!(cuda[0]["details"]["version"], 12080);
    let pin = findings(&r, "pool")
        .into_iter()
        .find(|f| f["item"] == "pin cuda device")
        .unwrap();
    assert_eq!(pin["verdict"], "ok", "{pin:#}");
    let calls = std::fs::read_to_string(&log).unwrap_or_default();
    assert!(
        !calls.contains("cuMemHostRegister") && !calls.contains("PrimaryCtxRetain"),
        "doctor must not pin or create a context:\n{calls}"
    );

    // No device: a warning for the node, and a required pin fails the pool.
    let env = [
        ("LD_LIBRARY_PATH", libs.0.to_str().unwrap()),
        ("FAKE_CUDA_DEVICES", "0"),
    ];
    let o = doctor_with(
        &[
            "--json",
            "--size",
            "64MiB",
            "--pin",
            "cuda",
            "--pin-required",
        ],
        &env,
    );
    assert_eq!(o.status.code(), Some(1), "{}", stdout(&o));
    let r = json(&o);
    let cuda = findings(&r, "cuda");
    assert_eq!(cuda[0]["verdict"], "warn", "{:#}", cuda[0]);
    assert!(text(&cuda[0]["value"]).contains("CUDA_ERROR_NO_DEVICE"));
    let pin = findings(&r, "pool")
        .into_iter()
        .find(|f| f["item"] == "pin cuda device")
        .unwrap();
    assert_eq!(pin["verdict"], "fail", "{pin:#}");
    // Best effort: the same pin is only a warning.
    let o = doctor_with(&["--json", "--size", "64MiB", "--pin", "cuda"], &env);
    assert_eq!(o.status.code(), Some(0), "{}", stdout(&o));
}

#[test]
fn the_rdma_finding_names_enosys_or_the_missing_library() {
    let o = doctor(&["--json"]);
    let r = json(&o);
    let rdma = findings(&r, "rdma");
    assert!(!rdma.is_empty());
    let all_ok = rdma.iter().all(|f| f["verdict"] == "ok");
    if all_ok {
        eprintln!("this host has RDMA devices: {rdma:#?}");
        for f in &rdma {
            assert!(text(&f["value"]).starts_with("max_mr_size "), "{f:#}");
        }
    } else {
        let v = text(&rdma[0]["value"]);
        assert!(
            v.contains("ENOSYS") || v.contains("libibverbs.so.1") || v.contains("no RDMA device"),
            "{:#}",
            rdma[0]
        );
    }

    // A library that is not there, from the pool's [rdma] table: named in
    // the node finding, and registration with it fails the pool.
    let dir = TempDir::new("rdma");
    let path = dir.0.join("pool.toml");
    std::fs::write(
        &path,
        "size = \"64MiB\"\nregister = [\"rdma\"]\n[rdma]\nlibrary = \"/nonexistent/libibverbs.so.1\"\n",
    )
    .unwrap();
    let o = doctor(&["--json", "--config", path.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(1), "{}", stdout(&o));
    let r = json(&o);
    let rdma = findings(&r, "rdma");
    assert!(
        text(&rdma[0]["value"]).contains("/nonexistent/libibverbs.so.1"),
        "{:#}",
        rdma[0]
    );
    assert!(
        text(&rdma[0]["remedy"]).contains("libibverbs1"),
        "{:#}",
        rdma[0]
    );
    let reg = findings(&r, "pool")
        .into_iter()
        .find(|f| f["item"] == "register rdma")
        .unwrap();
    assert_eq!(reg["verdict"], "fail", "{reg:#}");
}

#[test]
fn without_cap_ipc_lock_a_low_memlock_limit_warns_and_fails_a_required_pin() {
    const LIMIT: u64 = 8 << 20;
    // RLIMIT_MEMLOCK belongs to the process: `sh` lowers its own (soft, then
    // hard) and execs hostpool, which inherits it.
    let have = rustix::process::getrlimit(rustix::process::Resource::Memlock);
    let lower_kib = |l: Option<u64>| (l.map_or(LIMIT, |l| l.min(LIMIT)) / 1024).to_string();
    let (soft, hard) = (lower_kib(have.current), lower_kib(have.maximum));
    let mut c = Command::new("sh");
    c.args([
        "-c",
        r#"ulimit -S -l "$1" && ulimit -H -l "$2" && shift 2 && exec "$@""#,
        "sh",
        soft.as_str(),
        hard.as_str(),
        env!("CARGO_BIN_EXE_hostpool"),
        "doctor",
        "--json",
        "--size",
        "64MiB",
        "--pin",
        "mlock",
        "--pin-required",
    ])
    .env_remove("RUST_LOG");
    // Capabilities belong to a thread, and a child starts with those of the
    // thread that spawns it: drop CAP_IPC_LOCK in a thread of its own, which
    // then runs the command.
    let o = std::thread::spawn(move || {
        use rustix::thread::CapabilitySet;
        let _ = rustix::thread::remove_capability_from_bounding_set(CapabilitySet::IPC_LOCK);
        if let Ok(mut caps) = rustix::thread::capabilities(None) {
            caps.inheritable.remove(CapabilitySet::IPC_LOCK);
            caps.effective.remove(CapabilitySet::IPC_LOCK);
            caps.permitted.remove(CapabilitySet::IPC_LOCK);
            let _ = rustix::thread::set_capabilities(None, caps);
        }
        c.output()
    })
    .join()
    .unwrap()
    .unwrap();
    assert_eq!(o.status.code(), Some(1), "{}", stdout(&o));
    let r = json(&o);
    let memlock = findings(&r, "memlock");
    let rl = memlock
        .iter()
        .find(|f| f["item"] == "RLIMIT_MEMLOCK")
        .unwrap();
    assert_eq!(rl["verdict"], "warn", "{rl:#}");
    assert!(text(&rl["remedy"]).contains("ulimit -l"), "{rl:#}");
    let cap = memlock
        .iter()
        .find(|f| f["item"] == "CAP_IPC_LOCK")
        .unwrap();
    assert_eq!(cap["value"], "no", "{cap:#}");
    let pool = findings(&r, "pool");
    let pin = pool
        .iter()
        .find(|f| f["item"] == "pin mlock memlock")
        .unwrap();
    assert_eq!(pin["verdict"], "fail", "{pin:#}");
    assert!(text(&pin["value"]).contains("over the bound"), "{pin:#}");
    let verdict = pool.iter().find(|f| f["item"] == "verdict").unwrap();
    assert_eq!(verdict["verdict"], "fail", "{verdict:#}");
    assert!(
        text(&verdict["value"]).contains("pin mlock memlock"),
        "{verdict:#}"
    );
}

/// A file in /dev/shm, removed on drop.
struct ShmFile(PathBuf);

impl Drop for ShmFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// Whether the leftovers summary lists `path` among the live files.
fn listed_live(summary: &Value, path: &str) -> bool {
    summary["details"]["live"]
        .as_array()
        .unwrap()
        .iter()
        .any(|p| text(p) == path)
}

#[test]
fn stale_pool_files_are_listed_but_not_removed_and_held_ones_are_live() {
    let _shm = shm_lock();
    let pid = std::process::id();
    let stale = ShmFile(PathBuf::from(format!(
        "/dev/shm/hostpool-doctor{pid}stale.pool"
    )));
    let held = ShmFile(PathBuf::from(format!(
        "/dev/shm/hostpool-doctor{pid}held.pool"
    )));
    std::fs::write(&stale.0, vec![0u8; 8192]).unwrap();
    std::fs::write(&held.0, b"x").unwrap();
    let holder = std::fs::File::open(&held.0).unwrap();
    rustix::fs::flock(&holder, rustix::fs::FlockOperation::LockShared).unwrap();

    let o = doctor(&["--json"]);
    assert_eq!(o.status.code(), Some(0), "{}", stdout(&o));
    let r = json(&o);
    let left = findings(&r, "leftovers");
    let summary = left.iter().find(|f| f["item"] == "pool files").unwrap();
    assert_eq!(summary["verdict"], "warn", "{summary:#}");
    assert!(text(&summary["remedy"]).contains("hostpool gc"));
    let listed: Vec<&str> = summary["details"]["stale"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| text(&f["path"]))
        .collect();
    let stale_path = stale.0.display().to_string();
    let held_path = held.0.display().to_string();
    assert!(listed.contains(&stale_path.as_str()), "{summary:#}");
    assert!(!listed.contains(&held_path.as_str()), "{summary:#}");
    assert!(listed_live(summary, &held_path), "{summary:#}");
    assert!(stale.0.exists() && held.0.exists(), "doctor removed a file");
    drop(holder);
}

/// The hugetlbfs mount points of `/proc/mounts`, in mount order, each once.
fn hugetlbfs_mounts() -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for line in std::fs::read_to_string("/proc/mounts").unwrap().lines() {
        let f: Vec<&str> = line.split_whitespace().collect();
        if f.get(2) == Some(&"hugetlbfs") {
            let point = f[1].replace("\\040", " ");
            if !out.contains(&point) {
                out.push(point);
            }
        }
    }
    out
}

/// gc's default directories, which the leftovers scan uses, come from the
/// backings' records: `/dev/shm` first, then every hugetlbfs mount.
#[test]
fn leftovers_scan_dev_shm_and_every_hugetlbfs_mount() {
    let before = hugetlbfs_mounts();
    let r = json(&doctor(&["--json"]));
    let after = hugetlbfs_mounts();
    let left = findings(&r, "leftovers");
    let summary = left.iter().find(|f| f["item"] == "pool files").unwrap();
    let dirs: Vec<String> = summary["details"]["dirs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| text(d).to_string())
        .collect();
    let want = |mounts: Vec<String>| {
        let mut w = vec!["/dev/shm".to_string()];
        w.extend(mounts.into_iter().filter(|m| m != "/dev/shm"));
        w
    };
    // A mount made or removed meanwhile (another test run) may show in one.
    assert!(
        dirs == want(before.clone()) || dirs == want(after.clone()),
        "{dirs:?} vs {before:?} / {after:?}"
    );
}

/// What doctor must leave as it found it: the files in /dev/shm and every
/// huge page counter, system-wide and per node.
fn node_state() -> BTreeMap<String, String> {
    let mut s = BTreeMap::new();
    for e in std::fs::read_dir("/dev/shm")
        .into_iter()
        .flatten()
        .flatten()
    {
        let m = e.metadata().ok();
        s.insert(
            format!("shm {}", e.file_name().to_string_lossy()),
            m.map(|m| format!("{} {} {}", m.ino(), m.len(), m.mtime()))
                .unwrap_or_default(),
        );
    }
    let mut dirs = vec![PathBuf::from("/sys/kernel/mm/hugepages")];
    for e in std::fs::read_dir("/sys/devices/system/node")
        .into_iter()
        .flatten()
        .flatten()
    {
        dirs.push(e.path().join("hugepages"));
    }
    for dir in dirs {
        for size in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
            for counter in std::fs::read_dir(size.path())
                .into_iter()
                .flatten()
                .flatten()
            {
                if let Ok(v) = std::fs::read_to_string(counter.path()) {
                    s.insert(counter.path().display().to_string(), v);
                }
            }
        }
    }
    s
}

#[test]
fn doctor_changes_nothing_on_the_node() {
    let _shm = shm_lock();
    let mut runs: Vec<Vec<String>> = vec![
        vec![],
        vec!["--json".into()],
        vec![
            "--size".into(),
            "1GiB".into(),
            "--backing".into(),
            "shm-segmented".into(),
            "--dir".into(),
            "/dev/shm".into(),
        ],
        vec![
            "--size".into(),
            "1PiB".into(),
            "--pin".into(),
            "mlock".into(),
            "--register".into(),
            "rdma".into(),
        ],
    ];
    if let Some(d) = std::env::var_os("HOSTPOOL_TEST_HUGETLBFS_2M") {
        runs.push(vec![
            "--size".into(),
            "64MiB".into(),
            "--backing".into(),
            "hugetlbfs".into(),
            "--dir".into(),
            d.to_string_lossy().into_owned(),
        ]);
    }
    for args in &runs {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        // Retried only when something else on the node changed it meanwhile:
        // a change doctor makes shows every time.
        let mut last = None;
        for _ in 0..5 {
            let before = node_state();
            let o = doctor(&args);
            assert!(
                matches!(o.status.code(), Some(0 | 1)),
                "{args:?}: {:?}\n{}",
                o.status,
                String::from_utf8_lossy(&o.stderr)
            );
            let after = node_state();
            if before == after {
                last = None;
                break;
            }
            last = Some((before, after));
        }
        if let Some((before, after)) = last {
            let changed: Vec<_> = before
                .iter()
                .filter(|(k, v)| after.get(*k) != Some(v))
                .map(|(k, _)| k)
                .chain(after.keys().filter(|k| !before.contains_key(*k)))
                .collect();
            panic!("doctor {args:?} changed the node: {changed:?}");
        }
    }
}

/// A doctor in another PID namespace (a container's) cannot see this
/// process's locks in `/proc/locks`; it must still judge the file live, as
/// `gc` does, by the lock probe.
#[test]
fn a_file_held_outside_the_doctors_pid_namespace_is_live() {
    let _shm = shm_lock();
    let held = ShmFile(PathBuf::from(format!(
        "/dev/shm/hostpool-doctor{}nsheld.pool",
        std::process::id()
    )));
    std::fs::write(&held.0, b"x").unwrap();
    let holder = std::fs::File::open(&held.0).unwrap();
    rustix::fs::flock(&holder, rustix::fs::FlockOperation::LockShared).unwrap();
    let o = std::process::Command::new("unshare")
        .args(["--pid", "--fork", "--mount-proc"])
        .arg(env!("CARGO_BIN_EXE_hostpool"))
        .args(["doctor", "--json"])
        .env_remove("RUST_LOG")
        .output();
    let o = match o {
        Ok(o) if o.status.code() == Some(0) || o.status.code() == Some(1) => o,
        other => {
            let why = format!("unshare --pid --mount-proc is not available here: {other:?}");
            assert!(
                !rustix::process::geteuid().is_root(),
                "as root it must work: {why}"
            );
            eprintln!("skip: {why}");
            return;
        }
    };
    let r = json(&o);
    let left = findings(&r, "leftovers");
    let summary = left.iter().find(|f| f["item"] == "pool files").unwrap();
    let held_path = held.0.display().to_string();
    assert!(listed_live(summary, &held_path), "{summary:#}");
    assert!(held.0.exists(), "doctor removed a file");
    drop(holder);
}

/// For a shared pool, doctor says which rendezvous it would use and why.
#[test]
fn doctor_says_which_rendezvous_a_shared_pool_would_use() {
    for (flag, want, why) in [
        (None, "socket @hostpool/", "network namespace"),
        (Some("file"), "file /dev/shm/hostpool-", "share a directory"),
    ] {
        let mut args = vec![
            "--json", "--size", "16MiB", "--dir", "/dev/shm", "--shared", "doc-rdv", "--world",
            "2", "--rank", "0",
        ];
        if let Some(f) = flag {
            args.extend(["--rendezvous", f]);
        }
        let r = json(&doctor(&args));
        let pool = findings(&r, "pool");
        let f = pool
            .iter()
            .find(|f| f["item"] == "rendezvous")
            .unwrap_or_else(|| panic!("no rendezvous finding: {pool:#?}"));
        assert!(text(&f["value"]).starts_with(want), "{f:#}");
        assert!(text(&f["remedy"]).contains(why), "{f:#}");
    }
}

/// The test venv's python, which has Mooncake's non-CUDA wheel:
/// `HOSTPOOL_TEST_PYTHON`, which `cargo xtask test` sets (and, with
/// `HOSTPOOL_REQUIRE_NIXL=1`, requires).
fn mooncake_python() -> Option<String> {
    match std::env::var("HOSTPOOL_TEST_PYTHON") {
        Ok(python) if Path::new(&python).exists() => Some(python),
        _ if std::env::var_os("HOSTPOOL_REQUIRE_NIXL").is_some() => panic!(
            "HOSTPOOL_REQUIRE_NIXL is set but HOSTPOOL_TEST_PYTHON does not name the test venv's \
             python (with mooncake-transfer-engine-non-cuda)"
        ),
        _ => {
            eprintln!(
                "skip: HOSTPOOL_TEST_PYTHON unset: run under `cargo xtask test`, which makes the \
                 venv with Mooncake's wheel"
            );
            None
        }
    }
}

fn the_mooncake_finding(r: &Value) -> &Value {
    let mc = findings(r, "mooncake");
    assert_eq!(mc.len(), 1, "{mc:#?}");
    mc[0]
}

#[test]
fn the_mooncake_finding_names_the_wheel_its_version_and_transports() {
    let Some(python) = mooncake_python() else {
        return;
    };
    let o = doctor_with(&["--json"], &[("HOSTPOOL_PYTHON", &python)]);
    assert_eq!(o.status.code(), Some(0), "{}", stdout(&o));
    let r = json(&o);
    let f = the_mooncake_finding(&r);
    assert_eq!(f["verdict"], "ok", "{f:#}");
    assert_eq!(f["item"], "mooncake.engine", "{f:#}");
    let value = text(&f["value"]);
    assert!(
        value.starts_with("mooncake-transfer-engine-non-cuda 0.3.13.post1 at ")
            && value.contains("/mooncake/engine")
            && value.contains(": transports tcp"),
        "{f:#}"
    );
    let d = &f["details"];
    assert_eq!(d["distribution"], "mooncake-transfer-engine-non-cuda");
    assert_eq!(d["version"], "0.3.13.post1");
    assert_eq!(d["python"], python.as_str());
    assert_eq!(d["transports"][0], "tcp", "{d:#}");
    // The non-CUDA wheel's engine.so links libibverbs (without it, it does
    // not import), and supports no GPU.
    assert_eq!(d["transports"], serde_json::json!(["tcp", "rdma"]), "{d:#}");
    assert_eq!(d["flags"]["SUPPORT_CUDA"], false, "{d:#}");
    // The engines area names the same wheel from its metadata.
    let engine = findings(&r, "engines")
        .into_iter()
        .find(|f| f["item"] == "mooncake")
        .unwrap_or_else(|| panic!("no engines finding for mooncake: {r:#}"));
    assert_eq!(
        engine["details"]["distribution"], "mooncake-transfer-engine-non-cuda",
        "{engine:#}"
    );
    assert_eq!(engine["details"]["version"], "0.3.13.post1", "{engine:#}");
    // In words too.
    let o = doctor_with(&[], &[("HOSTPOOL_PYTHON", &python)]);
    let out = stdout(&o);
    assert!(
        out.lines().any(|l| l.starts_with("ok")
            && l.contains("mooncake")
            && l.contains("mooncake-transfer-engine-non-cuda 0.3.13.post1")
            && l.contains("transports tcp")),
        "{out}"
    );
}

#[test]
fn without_the_wheel_the_mooncake_finding_is_info_and_doctor_exits_as_before() {
    // The system's python has no Mooncake; a python that is not there cannot
    // say. Neither is a failure: with no pool doctor exits 0, and with a pool
    // that fits too.
    for (python, says) in [
        ("/usr/bin/python3", "not importable by /usr/bin/python3"),
        ("/nonexistent/python3", "cannot be run"),
    ] {
        if python == "/usr/bin/python3" && !Path::new(python).exists() {
            eprintln!("no /usr/bin/python3 here: only the missing python is asked");
            continue;
        }
        for args in [&["--json"][..], &["--json", "--size", "64MiB"]] {
            let o = doctor_with(args, &[("HOSTPOOL_PYTHON", python)]);
            assert_eq!(o.status.code(), Some(0), "{args:?}: {}", stdout(&o));
            let r = json(&o);
            assert_ne!(r["verdict"], "fail", "{r:#}");
            let f = the_mooncake_finding(&r);
            assert_eq!(f["verdict"], "info", "{f:#}");
            assert!(text(&f["value"]).contains(says), "{f:#}");
            assert!(text(&f["remedy"]).contains("HOSTPOOL_PYTHON"), "{f:#}");
            assert_eq!(f["details"]["importable"], false, "{f:#}");
            if python == "/usr/bin/python3" {
                assert!(
                    text(&f["value"]).contains("No module named 'mooncake'"),
                    "{f:#}"
                );
                let remedy = text(&f["remedy"]);
                assert!(
                    remedy.contains("pip install mooncake-transfer-engine")
                        && remedy.contains("mooncake-transfer-engine-non-cuda"),
                    "{f:#}"
                );
            }
        }
    }
}

/// A Python environment for the `engines` area: a venv of the `PATH`'s
/// `python3` without any package (so nothing this machine has installed
/// answers), and a directory for `PYTHONPATH` where a test lays out fake
/// engines and a fake hostpool.
struct FakePython {
    dir: TempDir,
}

/// The tested versions hostpool's Python package lists (in the fake).
const TESTED: &str = r#"{"vllm": ("0.34.0", "0.33.0"), "sglang": ("0.5.23",), "lmcache": ("0.5.6",), "mooncake": ("0.3.13.post1",)}"#;

impl FakePython {
    fn new(tag: &str) -> FakePython {
        let dir = TempDir::new(tag);
        let o = Command::new("python3")
            .args(["-m", "venv", "--without-pip"])
            .arg(dir.0.join("venv"))
            .output()
            .expect("the engines tests need python3 on the PATH");
        assert!(
            o.status.success(),
            "python3 -m venv: {}",
            String::from_utf8_lossy(&o.stderr)
        );
        std::fs::create_dir(dir.0.join("site")).unwrap();
        FakePython { dir }
    }

    fn python(&self) -> String {
        self.dir.0.join("venv/bin/python").display().to_string()
    }

    fn site(&self) -> PathBuf {
        self.dir.0.join("site")
    }

    /// A distribution `name` at `version` (its `.dist-info`), and its
    /// top module `module` (when given), which exits if imported: the
    /// doctor must read the engines' metadata, never import them.
    fn dist(&self, name: &str, version: &str, module: Option<&str>) -> &Self {
        let info = self
            .site()
            .join(format!("{}-{version}.dist-info", name.replace('-', "_")));
        std::fs::create_dir_all(&info).unwrap();
        std::fs::write(
            info.join("METADATA"),
            format!("Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"),
        )
        .unwrap();
        if let Some(module) = module {
            let m = self.site().join(module);
            std::fs::create_dir_all(&m).unwrap();
            std::fs::write(
                m.join("__init__.py"),
                format!("import sys\nsys.exit('hostpool doctor imported {module}')\n"),
            )
            .unwrap();
        }
        self
    }

    /// A hostpool package whose `hostpool._engines.TESTED` is `tested`.
    fn hostpool(&self, tested: &str) -> &Self {
        let engines = self.site().join("hostpool/_engines");
        std::fs::create_dir_all(&engines).unwrap();
        std::fs::write(self.site().join("hostpool/__init__.py"), "").unwrap();
        std::fs::write(
            engines.join("__init__.py"),
            format!("\"\"\"A fake of hostpool's list.\"\"\"\nTESTED = {tested}\n"),
        )
        .unwrap();
        self
    }

    /// `hostpool doctor args` asking this python.
    fn doctor(&self, args: &[&str]) -> Output {
        let python = self.python();
        let site = self.site().display().to_string();
        doctor_with(args, &[("HOSTPOOL_PYTHON", &python), ("PYTHONPATH", &site)])
    }
}

fn the_engine_finding<'a>(r: &'a Value, item: &str) -> Option<&'a Value> {
    let found: Vec<&Value> = findings(r, "engines")
        .into_iter()
        .filter(|f| f["item"] == item)
        .collect();
    assert!(found.len() <= 1, "{found:#?}");
    found.first().copied()
}

#[test]
fn the_engines_area_says_which_engines_are_tested_untested_or_absent() {
    let env = FakePython::new("engines");
    env.hostpool(TESTED)
        .dist("vllm", "0.34.0", Some("vllm"))
        .dist("sglang", "0.4.0", Some("sglang"))
        .dist(
            "mooncake-transfer-engine-non-cuda",
            "0.3.13.post1",
            Some("mooncake"),
        );
    let o = env.doctor(&["--json"]);
    // An untested engine warns; it fails nothing.
    assert_eq!(o.status.code(), Some(0), "{}", stdout(&o));
    let r = json(&o);
    assert_eq!(r["verdict"], "warn", "{r:#}");

    let vllm = the_engine_finding(&r, "vllm").expect("a vllm finding");
    assert_eq!(vllm["verdict"], "ok", "{vllm:#}");
    assert_eq!(vllm["value"], "vllm 0.34.0 (tested)", "{vllm:#}");
    let d = &vllm["details"];
    assert_eq!(d["name"], "vllm");
    assert_eq!(d["distribution"], "vllm");
    assert_eq!(d["version"], "0.34.0");
    assert_eq!(d["tested"], true);
    assert_eq!(
        d["tested_versions"],
        serde_json::json!(["0.34.0", "0.33.0"])
    );
    assert!(
        text(&d["path"]).starts_with(&env.site().display().to_string()),
        "{d:#}"
    );

    let sglang = the_engine_finding(&r, "sglang").expect("an sglang finding");
    assert_eq!(sglang["verdict"], "warn", "{sglang:#}");
    assert_eq!(
        sglang["value"],
        "sglang 0.4.0 (not tested: hostpool was tested with 0.5.23)"
    );
    assert!(
        text(&sglang["remedy"]).contains("`pip install sglang==0.5.23`"),
        "{sglang:#}"
    );
    assert_eq!(sglang["details"]["tested"], false);
    assert_eq!(sglang["details"]["version"], "0.4.0");
    assert_eq!(
        sglang["details"]["tested_versions"],
        serde_json::json!(["0.5.23"])
    );

    let mooncake = the_engine_finding(&r, "mooncake").expect("a mooncake finding");
    assert_eq!(mooncake["verdict"], "ok", "{mooncake:#}");
    assert_eq!(
        mooncake["value"],
        "mooncake 0.3.13.post1 (tested) from mooncake-transfer-engine-non-cuda"
    );
    assert_eq!(
        mooncake["details"]["distribution"],
        "mooncake-transfer-engine-non-cuda"
    );

    // LMCache is not installed: no finding of its own, never a warning, and
    // listed as such.
    assert!(the_engine_finding(&r, "lmcache").is_none(), "{r:#}");
    let py = the_engine_finding(&r, "python").expect("the python line");
    assert_eq!(py["verdict"], "ok", "{py:#}");
    assert!(
        text(&py["value"]).ends_with("engines vllm, sglang, mooncake; not installed: lmcache"),
        "{py:#}"
    );
    assert_eq!(
        py["details"]["not_installed"],
        serde_json::json!(["lmcache"])
    );
    let lmcache = py["details"]["engines"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["name"] == "lmcache")
        .unwrap();
    assert_eq!(lmcache["installed"], false, "{lmcache:#}");
    assert_eq!(lmcache["tested_versions"], serde_json::json!(["0.5.6"]));
    assert_eq!(
        py["details"]["executable"],
        env.dir.0.join("venv/bin/python").display().to_string(),
        "{py:#}"
    );

    // In words.
    let out = stdout(&env.doctor(&[]));
    assert!(
        out.lines().any(|l| l.starts_with("ok")
            && l.split_whitespace().nth(1) == Some("engines")
            && l.ends_with("vllm 0.34.0 (tested)")),
        "{out}"
    );
    assert!(
        out.lines().any(|l| l.starts_with("warn")
            && l.ends_with("sglang 0.4.0 (not tested: hostpool was tested with 0.5.23)")),
        "{out}"
    );
}

#[test]
fn the_tested_versions_are_those_of_the_hostpool_in_that_python() {
    // The same vllm, judged by another list: now it is not tested.
    let env = FakePython::new("engines-list");
    env.hostpool(r#"{"vllm": ("0.35.0",)}"#)
        .dist("vllm", "0.34.0", Some("vllm"));
    let r = json(&env.doctor(&["--json"]));
    let vllm = the_engine_finding(&r, "vllm").expect("a vllm finding");
    assert_eq!(vllm["verdict"], "warn", "{vllm:#}");
    assert_eq!(
        vllm["value"],
        "vllm 0.34.0 (not tested: hostpool was tested with 0.35.0)"
    );
    assert_eq!(vllm["details"]["tested"], false);
    assert_eq!(
        vllm["details"]["tested_versions"],
        serde_json::json!(["0.35.0"])
    );
}

#[test]
fn without_hostpool_in_that_python_the_tested_versions_are_unknown_and_only_info() {
    let env = FakePython::new("engines-nohostpool");
    env.dist("vllm", "0.34.0", Some("vllm"));
    let o = env.doctor(&["--json"]);
    assert_eq!(o.status.code(), Some(0), "{}", stdout(&o));
    let r = json(&o);
    let vllm = the_engine_finding(&r, "vllm").expect("a vllm finding");
    assert_eq!(vllm["verdict"], "info", "{vllm:#}");
    assert_eq!(
        vllm["value"],
        "vllm 0.34.0 (tested versions unknown: hostpool is not installed in this python)"
    );
    assert_eq!(
        vllm["remedy"],
        "run `python -m hostpool doctor` from the engine's environment"
    );
    assert_eq!(vllm["details"]["tested"], false);
    assert!(vllm["details"]["tested_versions"].is_null(), "{vllm:#}");
    for f in findings(&r, "engines") {
        assert_eq!(f["verdict"], "info", "{f:#}");
    }
}

#[test]
fn without_a_python_the_engines_area_is_info_and_doctor_exits_0() {
    for args in [&["--json"][..], &["--json", "--size", "64MiB"]] {
        let o = doctor_with(args, &[("HOSTPOOL_PYTHON", "/nonexistent/python3")]);
        assert_eq!(o.status.code(), Some(0), "{args:?}: {}", stdout(&o));
        let r = json(&o);
        let engines = findings(&r, "engines");
        assert_eq!(engines.len(), 1, "{engines:#?}");
        let f = engines[0];
        assert_eq!(f["verdict"], "info", "{f:#}");
        assert_eq!(
            f["value"],
            "not known: /nonexistent/python3 (from HOSTPOOL_PYTHON) cannot be run (no such \
             program)"
        );
        assert!(text(&f["remedy"]).contains("HOSTPOOL_PYTHON"), "{f:#}");
    }
}

/// The group of process `pid` in the hierarchy that has the memory
/// controller, as `/proc/PID/cgroup` writes it: the v1 `memory` line, else
/// the v2 (`0::`) one.
fn memory_line(pid: u32) -> (u8, String) {
    let text = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).unwrap();
    let field = |l: &str, i: usize| l.splitn(3, ':').nth(i).unwrap_or("").to_string();
    text.lines()
        .find(|l| field(l, 1).split(',').any(|c| c == "memory"))
        .map(|l| (1, field(l, 2)))
        .or_else(|| {
            text.lines()
                .find(|l| l.starts_with("0::"))
                .map(|l| (2, field(l, 2)))
        })
        .unwrap_or_else(|| panic!("no memory group in /proc/{pid}/cgroup: {text}"))
}

/// `doctor` says which cgroup a running keeper's memory is charged to: its
/// `keepers` finding names the keeper's memory group as its
/// `/proc/PID/cgroup` does (under v2, that group or the nearest ancestor
/// with the controller), with the group's directory and the bytes charged
/// to it, the pool included. As root, where a memory controller is, the
/// keeper runs in a child group of its own, so the group named is the
/// keeper's and not doctor's.
#[test]
fn doctor_names_the_cgroup_a_keepers_memory_is_charged_to() {
    use support::cgroup::Parent;
    use support::procs::{Children, bin, name, read_json_line, terminate};

    let parent = if support::procs::is_root() {
        Parent::find("memory")
            .map_err(|why| eprintln!("the keeper runs in this test's group: {why}"))
            .ok()
    } else {
        None
    };
    let group = parent.as_ref().map(|p| p.child("doctor-keeper"));
    let pool = name("doctor-cgroup");
    let mut cmd = bin();
    cmd.args(["keep", "--name", &pool, "--json", "--size", "64MiB"])
        .args(["--backing", "shm-segmented"]);
    let mut cmd = match &group {
        Some(g) => g.run_in(&cmd),
        None => cmd,
    };
    let mut keeper = Children(vec![
        cmd.stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap(),
    ]);
    let ready = read_json_line(&mut keeper[0]);
    assert_eq!(ready["name"], pool.as_str(), "{ready}");
    let pid = keeper[0].id();

    let r = json(&doctor(&["--json"]));
    let found = findings(&r, "keepers")
        .into_iter()
        .find(|f| f["item"] == pool.as_str())
        .unwrap_or_else(|| panic!("no keepers finding of {pool}: {r:#}"))
        .clone();
    let d = &found["details"];
    let (version, line) = memory_line(pid);
    let said = text(&d["cgroup"]).to_string();
    assert_eq!(d["cgroup_version"], u64::from(version), "{found:#}");
    if version == 1 {
        assert_eq!(said, line, "{found:#}");
    } else {
        // A v2 group without the controller is charged to an ancestor.
        assert!(
            line == said || said == "/" || line.starts_with(&format!("{said}/")),
            "{said} is {line} or an ancestor of it: {found:#}"
        );
    }
    assert!(text(&d["cgroup_dir"]).ends_with(&said), "{found:#}");
    assert!(d["cgroup_hugetlb"].is_null(), "4 KiB pages: {found:#}");
    assert!(
        text(&found["value"]).contains(&format!("charged to cgroup {said} (v{version}")),
        "{found:#}"
    );
    if let Some(g) = &group {
        assert_eq!(
            Path::new(text(&d["cgroup_dir"])),
            g.dir.as_path(),
            "{found:#}"
        );
        // The group holds the keeper alone: charged the pool, and little more.
        let bytes = d["cgroup_memory_bytes"].as_u64().unwrap();
        assert!(
            (64 << 20..96 << 20).contains(&bytes),
            "{bytes} bytes: {found:#}"
        );
    }
    terminate(&mut keeper[0], std::time::Duration::from_secs(10));
}
