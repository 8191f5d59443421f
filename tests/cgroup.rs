//! Capacity under a real cgroup memory limit (issue 20): `plan` and `alloc`
//! of a pool larger than the limit of the memory cgroup they run in say
//! `short` and exit 1 naming the limit's file, never meet the OOM killer,
//! and a pool that fits is built. Needs root (a child memory cgroup of this
//! process's own); runs under cgroup v1 and, where the machine has the
//! memory controller there, under cgroup v2.

mod support;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use support::cgroup::own_group;
use support::procs::root_or_skip;

const MIB: u64 = 1 << 20;

/// A memory cgroup of the test's own, below this process's, with a limit;
/// removed on drop (its processes have exited by then).
struct Group {
    dir: PathBuf,
}

impl Group {
    /// A child of this process's memory group on `mount` (`path` is this
    /// process's group there), limited to `bytes` through `limit_file`.
    fn new(mount: &Path, path: &str, limit_file: &str, bytes: u64, tag: &str) -> Group {
        let dir = mount
            .join(path.trim_start_matches('/'))
            .join(format!("hostpool-test-{}-{tag}", std::process::id()));
        std::fs::create_dir(&dir).unwrap_or_else(|e| panic!("mkdir {}: {e}", dir.display()));
        let g = Group { dir };
        std::fs::write(g.dir.join(limit_file), bytes.to_string()).unwrap();
        g
    }

    /// `hostpool ARGS`, run inside the group.
    fn run(&self, args: &[&str]) -> Output {
        Command::new("sh")
            .arg("-c")
            .arg(r#"echo $$ > "$0/cgroup.procs" && exec "$@""#)
            .arg(&self.dir)
            .arg(env!("CARGO_BIN_EXE_hostpool"))
            .args(args)
            .env_remove("RUST_LOG")
            .output()
            .unwrap()
    }
}

impl Drop for Group {
    fn drop(&mut self) {
        // The group's last process has exited; the kernel may take a moment.
        for _ in 0..50 {
            if std::fs::remove_dir(&self.dir).is_ok() {
                return;
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        eprintln!("could not remove {}", self.dir.display());
    }
}

fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// Plan and build a 512 MiB pool (anonymous, and segmented `/dev/shm`,
/// whose pages the memory cgroup charges too) in a group limited to
/// 256 MiB: short, exit 1, the limit's file named; a 64 MiB pool fits and is
/// built in the same group.
fn check_under_limit(mount: &Path, path: &str, limit_file: &str, tag: &str) {
    let group = Group::new(mount, path, limit_file, 256 * MIB, tag);
    let limit = group.dir.join(limit_file);
    let limit = limit.to_str().unwrap();
    for backing in ["anon", "shm-segmented"] {
        let what = format!("{tag} {backing}");
        let plan = group.run(&["plan", "--size", "512MiB", "--backing", backing, "--json"]);
        assert_eq!(plan.status.code(), Some(1), "{what}: {}", text(&plan));
        let report: serde_json::Value = serde_json::from_slice(&plan.stdout).unwrap();
        let check = report["capacity"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["source"].as_str().is_some_and(|s| s.contains(limit)))
            .unwrap_or_else(|| panic!("{what}: no check of {limit}: {report}"))
            .clone();
        assert_eq!(check["verdict"], "short", "{what}: {check}");
        assert!(
            check["free"].as_u64().unwrap() <= 256 * MIB,
            "{what}: {check}"
        );
        let alloc = group.run(&["alloc", "--size", "512MiB", "--backing", backing]);
        let said = text(&alloc);
        assert_eq!(
            alloc.status.code(),
            Some(1),
            "{what}: exit 1, not the OOM killer's SIGKILL: {said}"
        );
        assert!(
            said.contains(limit)
                && said.contains("cannot hold the pool")
                && said.contains("memory limit"),
            "{what}: {said}"
        );
        let fits = group.run(&["alloc", "--size", "64MiB", "--backing", backing, "--json"]);
        assert!(fits.status.success(), "{what}: {}", text(&fits));
    }
    let doctor = group.run(&["doctor", "--size", "512MiB", "--json"]);
    let doctor: serde_json::Value = serde_json::from_slice(&doctor.stdout).unwrap();
    let cgroup = doctor["findings"]
        .as_array()
        .unwrap()
        .iter()
        .find(|f| f["area"] == "cgroup")
        .unwrap_or_else(|| panic!("{tag}: no cgroup finding: {doctor}"))
        .clone();
    assert!(
        cgroup.to_string().contains(limit),
        "{tag}: the finding names the limit: {cgroup}"
    );
}

#[test]
fn a_pool_larger_than_the_cgroup_memory_limit_is_short_and_exits_1() {
    if !root_or_skip("needs root to make a memory cgroup") {
        return;
    }
    let mut ran = 0;
    // cgroup v1: the memory controller's own hierarchy.
    let v1 = Path::new("/sys/fs/cgroup/memory");
    match own_group(false, "memory") {
        Some(path) if v1.join("memory.limit_in_bytes").exists() => {
            check_under_limit(v1, &path, "memory.limit_in_bytes", "v1");
            ran += 1;
        }
        _ => eprintln!("skip v1: this machine has no cgroup v1 memory controller"),
    }
    // cgroup v2: the unified hierarchy, where it has the memory controller.
    let v2 = ["/sys/fs/cgroup/unified", "/sys/fs/cgroup"]
        .iter()
        .map(Path::new)
        .find(|m| {
            std::fs::read_to_string(m.join("cgroup.controllers"))
                .is_ok_and(|c| c.split_whitespace().any(|x| x == "memory"))
        });
    match (v2, own_group(true, "")) {
        (Some(mount), Some(path)) => {
            // The child gets the controller only if its parent delegates it.
            let parent = mount.join(path.trim_start_matches('/'));
            let _ = std::fs::write(parent.join("cgroup.subtree_control"), "+memory");
            let delegated = std::fs::read_to_string(parent.join("cgroup.subtree_control"))
                .is_ok_and(|c| c.split_whitespace().any(|x| x == "memory"));
            if delegated {
                check_under_limit(mount, &path, "memory.max", "v2");
                ran += 1;
            } else {
                eprintln!(
                    "skip v2: {} does not delegate the memory controller (it has processes of \
                     its own)",
                    parent.display()
                );
            }
        }
        _ => eprintln!("skip v2: this machine's cgroup v2 hierarchy has no memory controller"),
    }
    assert!(
        ran > 0,
        "neither cgroup v1 nor v2 has a memory controller here"
    );
}
