//! The `file` backing through pool-core's conformance suite, as every
//! backing runs it: real pools built from good configs (size and alignment,
//! writes visible, prefault residency, teardown leaves nothing) and bad
//! configs that must be refused, before anything is mapped, with the words an
//! operator needs.
//!
//! The scratch directories are on the target directory's filesystem (ext4 or
//! xfs on most machines) and on `/dev/shm` when it is tmpfs, so both kinds of
//! page cache this backing serves are exercised.

// Name the plugin crate: an integration test is a binary of its own, and
// without this line the `file` record would not be linked into it.
use hostpool_example_backing_file::NAME;

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use pool_core::conformance::{self, BadConfig, Suite};
use pool_core::host::fs::{FsKind, filesystem_kind};
use pool_core::{ByteSize, PoolConfig, SharingConfig};
use serde_json::json;

/// A scratch directory, removed on drop.
struct Scratch(PathBuf);

impl Scratch {
    fn under(root: &Path, tag: &str) -> Scratch {
        static N: AtomicU64 = AtomicU64::new(0);
        let d = root.join(format!(
            "file-conformance-{tag}-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::create_dir_all(&d).unwrap();
        Scratch(d)
    }

    fn is_empty(&self) -> bool {
        std::fs::read_dir(&self.0).unwrap().next().is_none()
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn config(dir: Option<&Path>, size: u64, table: Option<serde_json::Value>) -> PoolConfig {
    let mut c = PoolConfig {
        size: ByteSize(size),
        backing: NAME.into(),
        dir: dir.map(Path::to_path_buf),
        ..PoolConfig::default()
    };
    if let Some(t) = table {
        c.plugins.insert(NAME.into(), t);
    }
    c
}

/// A hugetlbfs mount, if this host has one: the one `cargo xtask test`
/// made, else the first in /proc/mounts.
fn hugetlbfs_mount() -> Option<PathBuf> {
    if let Some(d) = std::env::var_os("HOSTPOOL_TEST_HUGETLBFS_2M") {
        return Some(d.into());
    }
    std::fs::read_to_string("/proc/mounts")
        .ok()?
        .lines()
        .find_map(|l| {
            let mut f = l.split_whitespace();
            let (_, dir, fstype) = (f.next()?, f.next()?, f.next()?);
            (fstype == "hugetlbfs").then(|| PathBuf::from(dir))
        })
}

fn assert_conformant(suite: &Suite) {
    let failures = conformance::run(suite);
    assert!(
        failures.is_empty(),
        "conformance failures:\n{}",
        failures
            .iter()
            .map(|f| f.to_string())
            .collect::<Vec<_>>()
            .join("\n")
    );
}

#[test]
fn file_passes_the_conformance_suite_on_a_disk_directory() {
    let s = Scratch::under(Path::new(env!("CARGO_TARGET_TMPDIR")), "disk");
    let dir = Some(s.0.as_path());
    let on_tmpfs = filesystem_kind(&s.0).unwrap() == FsKind::Tmpfs;
    let a_file = s.0.join("not-a-dir");
    std::fs::write(&a_file, b"").unwrap();

    let mut bad = vec![
        BadConfig {
            config: config(dir, 4 << 20, Some(json!({"name_prefx": "kv"}))),
            expect: "unknown field `name_prefx`",
        },
        BadConfig {
            config: config(dir, 4 << 20, Some(json!({"name_prefix": "../etc/kv"}))),
            expect: "name_prefix `../etc/kv` must be 1 to 64",
        },
        BadConfig {
            config: config(dir, 4 << 20, Some(json!({"name_prefix": "hostpool-kv"}))),
            expect: "reserved for hostpool's own files",
        },
        BadConfig {
            config: config(None, 4 << 20, None),
            expect: "backing file needs dir",
        },
        BadConfig {
            config: config(Some(Path::new("/nonexistent/kv")), 4 << 20, None),
            expect: "dir /nonexistent/kv does not exist; create it",
        },
        BadConfig {
            config: config(Some(&a_file), 4 << 20, None),
            expect: "is not a directory",
        },
        BadConfig {
            config: PoolConfig {
                page_size: Some(ByteSize::mib(2)),
                ..config(dir, 4 << 20, None)
            },
            expect: "for huge pages use backing hugetlbfs",
        },
        BadConfig {
            config: PoolConfig {
                sharing: Some(SharingConfig {
                    name: "kv".into(),
                    world: 2,
                    rank: 0,
                    attach_timeout_secs: 1.0,
                    barrier_timeout_secs: 600.0,
                    rendezvous: pool_core::Rendezvous::File,
                    control_dir: None,
                }),
                ..config(dir, 4 << 20, None)
            },
            expect: "private pools only",
        },
        BadConfig {
            config: config(dir, 0, None),
            expect: "zero",
        },
        BadConfig {
            config: config(dir, 100 << 40, None),
            expect: "cannot hold the pool",
        },
        BadConfig {
            config: PoolConfig {
                numa_node: Some(pool_core::NumaNode::Node(63)),
                ..config(dir, 4 << 20, None)
            },
            expect: "NUMA node 63 does not exist",
        },
    ];
    if !on_tmpfs {
        bad.push(BadConfig {
            config: PoolConfig {
                numa_node: Some(pool_core::NumaNode::Node(0)),
                ..config(dir, 4 << 20, None)
            },
            expect: "follows the process's memory policy",
        });
    }
    match hugetlbfs_mount() {
        Some(mount) => bad.push(BadConfig {
            config: config(Some(&mount), 4 << 20, None),
            expect: "use backing = \"hugetlbfs\" with this dir",
        }),
        None => eprintln!(
            "skip the hugetlbfs dir case here: no hugetlbfs mount (the message is unit-tested)"
        ),
    }
    let suite = Suite {
        good: vec![
            config(dir, 16 << 20, None),
            config(
                dir,
                (8 << 20) + 12345,
                Some(json!({"name_prefix": "kv-pool"})),
            ),
            PoolConfig {
                threads: std::num::NonZeroUsize::new(2),
                ..config(dir, 32 << 20, Some(json!({})))
            },
            config(dir, 4096, None),
        ],
        bad,
        populates_at_map: false,
    };
    assert_conformant(&suite);
    std::fs::remove_file(&a_file).unwrap();
    assert!(s.is_empty(), "the suite must leave the directory empty");
}

#[test]
fn file_passes_the_conformance_suite_on_tmpfs() {
    let shm = Path::new("/dev/shm");
    if filesystem_kind(shm).ok() != Some(FsKind::Tmpfs) {
        eprintln!("skip: /dev/shm is not tmpfs on this host");
        return;
    }
    let s = Scratch::under(shm, "tmpfs");
    let dir = Some(s.0.as_path());
    let suite = Suite {
        good: vec![
            config(dir, 8 << 20, None),
            config(dir, (4 << 20) + 1, Some(json!({"name_prefix": "kv"}))),
            // tmpfs honours mbind on a shared mapping, so a node is allowed.
            PoolConfig {
                numa_node: Some(pool_core::NumaNode::Node(0)),
                ..config(dir, 8 << 20, None)
            },
        ],
        bad: vec![BadConfig {
            config: config(dir, 100 << 40, None),
            expect: "cannot hold the pool",
        }],
        populates_at_map: false,
    };
    assert_conformant(&suite);
    assert!(s.is_empty(), "the suite must leave the directory empty");
}
