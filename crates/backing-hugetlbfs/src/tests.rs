//! hugetlbfs through the conformance suite on every page size this machine
//! has reserved, by mount and by memfd, and the errors operators hit.
//!
//! `cargo xtask test` reserves 2 MiB and 1 GiB pages, mounts hugetlbfs and
//! sets `HOSTPOOL_REQUIRE_HUGEPAGES=1`: then a missing page size fails these
//! tests instead of skipping them.

use std::path::PathBuf;

use pool_core::conformance::{self, BadConfig, Suite};
use pool_core::{ByteSize, Pool, PoolConfig, PoolPlan, Quiet};

use crate::host as hugetlb;
use serde_json::json;

use super::*;

/// A page size the test may use: its mount dir from xtask and its pool.
struct Reserved {
    page: u64,
    mount: Option<PathBuf>,
    available: u64,
    /// Tests that use huge pages run one at a time: each counts the free
    /// pages of the one shared pool, which a test running beside it moves.
    _serial: std::sync::MutexGuard<'static, ()>,
}

/// One test at a time on the huge page pools (see `Reserved::_serial`);
/// every test in this crate that counts or takes huge pages holds it.
pub(crate) static HUGE_PAGES: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn reserved(page: u64, label: &str) -> Option<Reserved> {
    let serial = HUGE_PAGES.lock().unwrap_or_else(|p| p.into_inner());
    let required = std::env::var("HOSTPOOL_REQUIRE_HUGEPAGES").as_deref() == Ok("1");
    let mount = std::env::var_os(format!("HOSTPOOL_TEST_HUGETLBFS_{label}")).map(PathBuf::from);
    let available = hugetlb::pool(page).map(|p| p.available()).unwrap_or(0);
    // The suite maps at most two pages at a time.
    if available < 2 {
        let why = format!(
            "{label} huge pages: only {available} available (run under `cargo xtask test` as root)"
        );
        // Under `cargo xtask test` a test that cannot get its pages fails:
        // xtask reserves two pages of every size the kernel has (compacting
        // memory first for 1 GiB pages). Only a kernel without the size at
        // all is a reason to skip.
        let kernel_has = std::path::Path::new(&format!(
            "/sys/kernel/mm/hugepages/hugepages-{}kB",
            page >> 10
        ))
        .is_dir();
        assert!(!(required && kernel_has), "required but missing: {why}");
        eprintln!("skip: {why}");
        return None;
    }
    if required {
        assert!(
            mount.is_some(),
            "HOSTPOOL_REQUIRE_HUGEPAGES=1 but HOSTPOOL_TEST_HUGETLBFS_{label} is not set"
        );
    }
    Some(Reserved {
        page,
        mount,
        available,
        _serial: serial,
    })
}

fn config(size: u64, dir: Option<PathBuf>, page: Option<u64>) -> PoolConfig {
    PoolConfig {
        size: ByteSize(size),
        backing: NAME.into(),
        dir,
        page_size: page.map(ByteSize),
        ..PoolConfig::default()
    }
}

fn free_pages(page: u64) -> u64 {
    hugetlb::pool(page).unwrap().free
}

fn run_suite(r: &Reserved) {
    let page = r.page;
    let mut good = vec![
        config(page * 2, None, Some(page)),
        config(page + 12345, None, Some(page)),
    ];
    let mut bad = vec![BadConfig {
        config: config(page * (r.available + 1000), None, Some(page)),
        expect: "cannot hold the pool",
    }];
    if let Some(m) = &r.mount {
        good.push(config(page * 2, Some(m.clone()), None));
        good.push(config(page * 2 - 1, Some(m.clone()), Some(page)));
        bad.push(BadConfig {
            config: config(page * (r.available + 1000), Some(m.clone()), None),
            expect: "cannot hold the pool",
        });
        let other = if page == 2 << 20 { 1 << 30 } else { 2 << 20 };
        bad.push(BadConfig {
            config: config(page, Some(m.clone()), Some(other)),
            expect: "does not match",
        });
    }
    let before = free_pages(page);
    let failures = conformance::run(&Suite {
        good,
        bad,
        populates_at_map: false,
    });
    assert!(
        failures.is_empty(),
        "conformance failures ({} pages):\n{}",
        r.page,
        failures
            .iter()
            .map(|f| f.to_string())
            .collect::<Vec<_>>()
            .join("\n")
    );
    assert_eq!(
        free_pages(page),
        before,
        "every huge page must be given back"
    );
}

#[test]
fn hugetlbfs_2m_passes_the_conformance_suite() {
    if let Some(r) = reserved(2 << 20, "2M") {
        run_suite(&r);
    }
}

#[test]
fn hugetlbfs_1g_passes_the_conformance_suite() {
    if let Some(r) = reserved(1 << 30, "1G") {
        run_suite(&r);
    }
}

#[test]
fn a_dir_that_is_not_hugetlbfs_is_a_clear_config_error() {
    let e = PoolPlan::new(config(2 << 20, Some("/dev/shm".into()), None)).unwrap_err();
    assert!(
        e.to_string()
            .contains("/dev/shm is not a hugetlbfs mount (it is tmpfs)"),
        "{e}"
    );
    assert_eq!(e.exit_code(), 2);
    let e = PoolPlan::new(config(2 << 20, Some("/nonexistent/huge".into()), None)).unwrap_err();
    assert!(e.to_string().contains("mount -t hugetlbfs"), "{e}");
}

#[test]
fn a_page_size_the_kernel_lacks_is_not_available() {
    let e = PoolPlan::new(config(4 << 20, None, Some(4 << 20))).unwrap_err();
    assert!(
        e.is_not_available() || e.to_string().contains("4 MiB"),
        "{e}"
    );
}

#[test]
fn a_shared_pool_without_a_mount_needs_the_socket_rendezvous() {
    let mut c = config(2 << 20, None, Some(2 << 20));
    c.sharing = Some(pool_core::SharingConfig {
        name: "x".into(),
        world: 2,
        rank: 0,
        attach_timeout_secs: 1.0,
        barrier_timeout_secs: 600.0,
        rendezvous: pool_core::Rendezvous::File,
        control_dir: None,
    });
    let e = PoolPlan::new(c.clone()).unwrap_err();
    assert!(e.is_usage(), "{e}");
    assert!(e.to_string().contains("rendezvous = \"socket\""), "{e}");
    // Over the socket, the creator's memfd is passed to every rank.
    if let Some(s) = c.sharing.as_mut() {
        s.rendezvous = pool_core::Rendezvous::Socket;
    }
    if hugetlb::pool(2 << 20).is_ok() {
        let plan = PoolPlan::new(c).unwrap();
        assert!(plan.report().files.is_empty(), "{:?}", plan.report());
        assert!(
            plan.report()
                .explain
                .iter()
                .any(|l| l.contains("memfd, passed to every rank")),
            "{:?}",
            plan.report().explain
        );
    }
}

#[test]
fn a_pool_larger_than_the_free_pages_fails_at_plan_time_with_the_sysfs_remedy() {
    let Some(r) = reserved(2 << 20, "2M") else {
        return;
    };
    let c = config((r.available + 10) * r.page, r.mount.clone(), Some(r.page));
    let plan = PoolPlan::new(c).unwrap();
    assert!(!plan.report().fits);
    let before = free_pages(r.page);
    let e = Pool::build(&plan, &Quiet).unwrap_err();
    let msg = e.to_string();
    assert!(
        msg.contains("cannot hold the pool") && msg.contains("hugepages-2048kB/nr_hugepages"),
        "{msg}"
    );
    assert_eq!(free_pages(r.page), before);
}

#[test]
fn plan_reports_page_size_pages_and_source() {
    let Some(r) = reserved(2 << 20, "2M") else {
        return;
    };
    let p = PoolPlan::new(config(5 << 20, None, Some(2 << 20))).unwrap();
    let rep = p.report();
    assert_eq!(rep.page_size, 2 << 20);
    assert_eq!(rep.mapped_bytes, 6 << 20);
    assert_eq!(rep.options, json!({"source": "memfd", "dir": null}));
    assert!(
        rep.explain.iter().any(|l| l.contains("3 pages of 2 MiB")),
        "{:?}",
        rep.explain
    );
    let _ = r.available;
}

#[test]
fn enomem_at_mmap_becomes_one_clear_error_when_pages_run_out_after_the_check() {
    // Capacity is checked before mapping; pages can still run out between
    // the check and the mmap (another process took them). Map directly,
    // past the check, to see the kernel's ENOMEM turned into the error.
    let Some(r) = reserved(2 << 20, "2M") else {
        return;
    };
    for dir in [r.mount.clone(), None] {
        let c = config((r.available + 8) * r.page, dir, Some(r.page));
        let plan = PoolPlan::new(c.clone()).unwrap();
        let before = free_pages(r.page);
        let pool_core::plugin::MemorySource::Files(files) = &plan.backing_plan().unwrap().source
        else {
            panic!(
                "hugetlbfs plans files: {:?}",
                plan.backing_plan().unwrap().source
            )
        };
        let e = pool_core::file::map_planned(files, plan.backing_plan().unwrap().size).unwrap_err();
        assert_eq!(e.errno(), Some(libc::ENOMEM), "{e:?}");
        let msg = e.to_string();
        assert!(
            msg.contains("could not reserve")
                && msg.contains("nr_hugepages")
                && msg.contains("2 MiB"),
            "{msg}"
        );
        assert_eq!(free_pages(r.page), before, "a failed mmap reserves nothing");
    }
}

#[test]
fn gc_scans_every_hugetlbfs_mount_and_nothing_else() {
    let record = pool_core::plugin::lookup::<BackingPlugin>(NAME).unwrap();
    let dirs = (record.gc_dirs.expect("the record names gc's directories"))();
    for d in &dirs {
        // A mount another process removed meanwhile cannot be examined.
        if let Ok(kind) = pool_core::host::fs::filesystem_kind(d) {
            assert!(matches!(kind, FsKind::Hugetlbfs { .. }), "{d:?}: {kind:?}");
        }
    }
    if let Some(mount) = std::env::var_os("HOSTPOOL_TEST_HUGETLBFS_2M") {
        assert!(dirs.contains(&PathBuf::from(mount)), "{dirs:?}");
    }
    let gc = pool_core::gc::default_dirs();
    assert_eq!(gc[0], PathBuf::from("/dev/shm"));
    assert!(dirs.iter().all(|d| gc.contains(d)), "{gc:?} {dirs:?}");
}
