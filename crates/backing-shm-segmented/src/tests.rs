//! shm-segmented through the conformance suite, and its errors.

use pool_core::conformance::{self, BadConfig, Suite};
use pool_core::{ByteSize, Pool, PoolConfig, PoolPlan, Quiet};
use serde_json::json;

use super::*;

fn config(size: u64, table: Option<serde_json::Value>) -> PoolConfig {
    let mut c = PoolConfig {
        size: ByteSize(size),
        backing: NAME.into(),
        ..PoolConfig::default()
    };
    if let Some(t) = table {
        c.plugins.insert(NAME.into(), t);
    }
    c
}

fn shm_files() -> usize {
    std::fs::read_dir("/dev/shm")
        .map(|d| d.count())
        .unwrap_or(0)
}

#[test]
fn shm_segmented_passes_the_conformance_suite() {
    let before = shm_files();
    let good = vec![
        config(64 << 20, None),
        config((64 << 20) + 4097, Some(json!({"segments": 3}))),
        config(40 << 20, Some(json!({"segment_size": "8MiB"}))),
        config(4096, Some(json!({"segments": 1}))),
        PoolConfig {
            numa_node: Some(pool_core::NumaNode::Node(0)),
            ..config(16 << 20, Some(json!({"segments": 2})))
        },
    ];
    let bad = vec![
        BadConfig {
            config: config(4 << 20, Some(json!({"segmentz": 2}))),
            expect: "unknown field `segmentz`",
        },
        BadConfig {
            config: config(
                4 << 20,
                Some(json!({"segments": 2, "segment_size": "1MiB"})),
            ),
            expect: "not both",
        },
        BadConfig {
            config: config(4 << 20, Some(json!({"segments": 0}))),
            expect: "zero",
        },
        BadConfig {
            config: config(8192, Some(json!({"segments": 3}))),
            expect: "segment",
        },
        BadConfig {
            config: PoolConfig {
                dir: Some("/proc".into()),
                ..config(4 << 20, None)
            },
            expect: "is not tmpfs",
        },
        BadConfig {
            config: PoolConfig {
                page_size: Some(ByteSize::mib(2)),
                ..config(4 << 20, None)
            },
            expect: "use backing hugetlbfs",
        },
        BadConfig {
            config: config(1 << 50, None),
            expect: "cannot hold the pool",
        },
    ];
    let failures = conformance::run(&Suite {
        good,
        bad,
        populates_at_map: false,
    });
    assert!(
        failures.is_empty(),
        "{}",
        failures
            .iter()
            .map(|f| f.to_string())
            .collect::<Vec<_>>()
            .join("\n")
    );
    assert_eq!(shm_files(), before, "nothing may be left in /dev/shm");
}

#[test]
fn segments_are_contiguous_and_a_write_across_a_seam_lands_in_the_next_file() {
    let pool = Pool::build(
        &PoolPlan::new(config(8 << 20, Some(json!({"segments": 2})))).unwrap(),
        &Quiet,
    )
    .unwrap();
    let r = pool.report();
    assert_eq!(r.segments.len(), 2);
    assert_eq!(r.segments[1].offset, 4 << 20);
    let region = pool.region().unwrap();
    let seam = (4 << 20) - 1;
    assert!(region.write_byte(seam, 0xaa) && region.write_byte(seam + 1, 0xbb));
    assert_eq!(region.read_byte(seam), Some(0xaa));
    assert_eq!(region.read_byte(seam + 1), Some(0xbb));
    assert!(pool.teardown().teardown_issues.is_empty());
}

#[test]
fn a_hugetlbfs_dir_is_redirected_to_the_hugetlbfs_backing() {
    let Some(dir) = std::env::var_os("HOSTPOOL_TEST_HUGETLBFS_2M") else {
        eprintln!("skip: no hugetlbfs mount (run under `cargo xtask test` as root)");
        assert!(std::env::var("HOSTPOOL_REQUIRE_HUGEPAGES").as_deref() != Ok("1"));
        return;
    };
    let e = PoolPlan::new(PoolConfig {
        dir: Some(dir.into()),
        ..config(4 << 20, None)
    })
    .unwrap_err();
    assert!(e.to_string().contains("use backing hugetlbfs"), "{e}");
}

#[test]
fn plan_lists_segments_and_tmpfs_capacity() {
    let p = PoolPlan::new(config(10 << 30, None)).unwrap().report();
    assert_eq!(p.segments.len(), 3, "10 GiB in 4 GiB segments");
    assert!(
        p.capacity
            .iter()
            .any(|c| c.source.contains("/dev/shm") || c.resource.contains("/dev/shm")),
        "{:?}",
        p.capacity
    );
}

/// Touching a page a full tmpfs cannot supply is SIGBUS. The touch fallback
/// (`prefault = "touch"`, and `auto` on kernels before 5.14) must fail with
/// a clear error instead: here the tmpfs fills up after the plan's capacity
/// check passed, as when two pools start at once.
#[test]
fn touch_prefault_on_a_tmpfs_that_filled_up_is_an_error_not_sigbus() {
    if !rustix::process::geteuid().is_root() {
        assert!(std::env::var("HOSTPOOL_REQUIRE_HUGEPAGES").as_deref() != Ok("1"));
        eprintln!("skip: needs root to mount a small tmpfs");
        return;
    }
    let mnt = std::env::temp_dir().join(format!("hostpool-touch-tmpfs-{}", std::process::id()));
    std::fs::create_dir_all(&mnt).unwrap();
    struct Unmount(std::path::PathBuf);
    impl Drop for Unmount {
        fn drop(&mut self) {
            let _ = std::process::Command::new("umount").arg(&self.0).status();
            let _ = std::fs::remove_dir(&self.0);
        }
    }
    let ok = std::process::Command::new("mount")
        .args(["-t", "tmpfs", "-o", "size=16m", "none"])
        .arg(&mnt)
        .status()
        .unwrap()
        .success();
    assert!(ok, "mount a 16 MiB tmpfs");
    let _guard = Unmount(mnt.clone());
    let plan = PoolPlan::new(PoolConfig {
        dir: Some(mnt.clone()),
        prefault: pool_core::PrefaultChoice::Touch,
        ..config(12 << 20, None)
    })
    .unwrap();
    assert!(
        plan.report().fits,
        "the check passes before the tmpfs fills up"
    );
    // Another pool takes 10 MiB of the 16 after the check.
    let other = mnt.join("other-pool");
    let f = std::fs::File::create(&other).unwrap();
    rustix::fs::fallocate(&f, rustix::fs::FallocateFlags::empty(), 0, 10 << 20).unwrap();
    let e = Pool::build(&plan, &Quiet).unwrap_err();
    let msg = e.to_string();
    assert_eq!(e.exit_code(), 1, "{msg}");
    assert_eq!(e.errno(), Some(libc::ENOSPC), "{e:?}");
    assert!(
        msg.contains("fallocate") && msg.contains("no SIGBUS"),
        "{msg}"
    );
    drop(f);
    std::fs::remove_file(&other).unwrap();
    assert_eq!(std::fs::read_dir(&mnt).unwrap().count(), 0, "nothing left");
}

#[test]
fn gc_scans_dev_shm_for_this_backing() {
    let record = pool_core::plugin::lookup::<BackingPlugin>(NAME).unwrap();
    let dirs = (record.gc_dirs.expect("the record names gc's directories"))();
    assert_eq!(dirs, [PathBuf::from(DEFAULT_DIR)]);
}
