//! `mlock` through a real pool, and under a real memlock limit: a child
//! process without CAP_IPC_LOCK and with `ulimit -l` (via capsh).

use std::process::Command;

use backing_anon as _;
use pinner_mlock as _;
use pool_core::{ByteSize, PinStatus, Pool, PoolConfig, PoolPlan, Quiet};

fn config(size: u64, required: bool, ignore: bool) -> PoolConfig {
    let mut c = PoolConfig {
        size: ByteSize(size),
        backing: "anon".into(),
        ..PoolConfig::default()
    };
    c.pin.kind = Some("mlock".into());
    c.pin.required = required;
    if ignore {
        c.pin.memlock_bound = pool_core::host::memlock::MemlockPolicy::Ignore;
    }
    c
}

#[test]
fn mlock_locks_the_pool_and_teardown_unlocks_it() {
    if std::env::var("HOSTPOOL_MLOCK_CHILD").is_ok() {
        return;
    }
    let before = pinner_mlock::locked_bytes().unwrap();
    let pool = Pool::build(
        &PoolPlan::new(config(64 << 20, true, false)).unwrap(),
        &Quiet,
    )
    .unwrap();
    let r = pool.report();
    assert_eq!(r.pin.status, PinStatus::Pinned);
    assert_eq!(r.pin.details["mlock_called"], true);
    // The mlock call's own time: some, and within the pin phase that timed it.
    let seconds = r.pin.details["seconds"].as_f64().unwrap();
    let phase = r.phases.pin.expect("the pin phase is timed");
    assert!(
        seconds > 0.0 && seconds <= phase,
        "mlock took {seconds} s of a {phase} s pin phase"
    );
    assert!(
        pinner_mlock::locked_bytes().unwrap() >= before + (64 << 20),
        "VmLck grows by the pool"
    );
    let done = pool.teardown();
    assert!(done.teardown_issues.is_empty());
    assert!(
        pinner_mlock::locked_bytes().unwrap() < before + (64 << 20),
        "munlock on teardown"
    );
}

/// The scenarios run in a child without CAP_IPC_LOCK and with a 1 MiB limit.
#[test]
fn child_scenarios_under_a_memlock_limit() {
    let Ok(scenario) = std::env::var("HOSTPOOL_MLOCK_CHILD") else {
        return;
    };
    let rl = rustix::process::getrlimit(rustix::process::Resource::Memlock);
    assert_eq!(rl.maximum, Some(1 << 20), "the parent set ulimit -l 1024");
    match scenario.as_str() {
        "required" => {
            let e = Pool::build(
                &PoolPlan::new(config(64 << 20, true, false)).unwrap(),
                &Quiet,
            )
            .unwrap_err();
            let msg = e.to_string();
            assert!(e.is_not_available(), "{e:?}");
            assert!(
                msg.contains("64 MiB")
                    && msg.contains("hard RLIMIT_MEMLOCK of 1 MiB")
                    && msg.contains("ulimit -l"),
                "{msg}"
            );
        }
        "best-effort" => {
            let pool = Pool::build(
                &PoolPlan::new(config(64 << 20, false, false)).unwrap(),
                &Quiet,
            )
            .unwrap();
            assert_eq!(pool.report().pin.status, PinStatus::Skipped);
            assert!(
                pool.report()
                    .pin
                    .reason
                    .as_deref()
                    .unwrap()
                    .contains("RLIMIT_MEMLOCK")
            );
        }
        "ignored" => {
            // With the check off, the kernel itself refuses: ENOMEM from mlock.
            let e = Pool::build(
                &PoolPlan::new(config(64 << 20, true, true)).unwrap(),
                &Quiet,
            )
            .unwrap_err();
            assert_eq!(e.errno(), Some(libc::ENOMEM), "{e:?}");
            assert!(
                e.to_string().contains("mlock") && e.to_string().contains("LimitMEMLOCK"),
                "{e}"
            );
        }
        other => panic!("unknown scenario {other}"),
    }
}

#[test]
fn without_cap_ipc_lock_the_memlock_limit_is_enforced_and_explained() {
    if std::env::var("HOSTPOOL_MLOCK_CHILD").is_ok() {
        return;
    }
    let capsh = std::path::Path::new("/usr/sbin/capsh");
    if !capsh.exists() || !rustix::process::geteuid().is_root() {
        assert!(
            std::env::var("HOSTPOOL_REQUIRE_HUGEPAGES").as_deref() != Ok("1"),
            "CI must have capsh and root"
        );
        eprintln!("skip: needs root and /usr/sbin/capsh to drop CAP_IPC_LOCK");
        return;
    }
    let exe = std::env::current_exe().unwrap();
    for scenario in ["required", "best-effort", "ignored"] {
        let cmd = format!(
            "ulimit -l 1024 && exec {} --exact child_scenarios_under_a_memlock_limit --nocapture --test-threads 1",
            exe.display()
        );
        let out = Command::new(capsh)
            .args(["--drop=cap_ipc_lock", "--", "-c", &cmd])
            .env("HOSTPOOL_MLOCK_CHILD", scenario)
            .output()
            .unwrap();
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(out.status.success(), "scenario {scenario}:\n{text}");
        assert!(
            text.contains("1 passed"),
            "scenario {scenario} must really run:\n{text}"
        );
    }
}
