//! `hostpool keep` and engines that lease from it, with real processes
//! killed at every step. Needs root (a small tmpfs of its own, so that what
//! is left on it is exact; another user's process): under `cargo xtask
//! test` its absence fails the test, elsewhere the test prints why it skips.

mod support;

use std::process::{Child, Output};
use std::time::{Duration, Instant};

use serde_json::Value;
use support::procs::{
    Children, HostpoolCommand, SmallTmpfs, addr, assert_usage_error, bin, exits_with, fails,
    kill_and_reap, mem_read, mem_write, name, read_json_line, read_report, root_or_skip, signal,
    stderr_of, succeeds, terminate, until, wait_stderr, wait_timeout,
};

const MIB: u64 = 1 << 20;

/// The tests that count free huge pages must not overlap: each holds this.
static HUGE_PAGES: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn huge_pages_lock() -> std::sync::MutexGuard<'static, ()> {
    HUGE_PAGES.lock().unwrap_or_else(|p| p.into_inner())
}

/// A 32 MiB tmpfs of the test's own and a pool name, both after `tag`;
/// `None` where this process may not mount it (the test skips).
fn tmpfs_and_pool(tag: &str) -> Option<(SmallTmpfs, String)> {
    Some((SmallTmpfs::mount_or_skip(tag, 32)?, name(tag)))
}

/// The flags of a keeper's 8 MiB pool of segmented files on `tmpfs`.
fn pool_on(tmpfs: &SmallTmpfs) -> [&str; 6] {
    let dir = tmpfs.path();
    ["--size", "8MiB", "--backing", "shm-segmented", "--dir", dir]
}

/// A keeper of one 8 MiB pool named `pool` on `tmpfs`, with `args` and
/// failpoints `fail`; its ready line.
fn keeper(pool: &str, tmpfs: &SmallTmpfs, args: &[&str], fail: &str) -> (Children, Value) {
    keeper_with(pool, &[&pool_on(tmpfs), args].concat(), fail)
}

/// A keeper of one hugetlbfs pool of `size` named `pool` in `dir`, with
/// failpoints `fail`; its ready line.
fn huge_keeper(pool: &str, dir: &std::path::Path, size: &str, fail: &str) -> (Children, Value) {
    let dir = dir.to_str().expect("a UTF-8 mount path");
    let args = ["--size", size, "--backing", "hugetlbfs", "--dir", dir];
    keeper_with(pool, &args, fail)
}

/// `hostpool keep --name pool --json ARGS` with failpoints `fail`; its
/// ready line.
fn keeper_with(pool: &str, args: &[&str], fail: &str) -> (Children, Value) {
    let mut k = Children(vec![
        bin()
            .args(["keep", "--name", pool, "--json"])
            .args(args)
            .failpoints(fail)
            .spawn_piped(),
    ]);
    let ready = read_json_line(&mut k[0]);
    assert_eq!(ready["name"], pool, "{ready}");
    (k, ready)
}

/// An engine that leases `pool` and holds it (`alloc --keeper --hold
/// --json`), with `args` and failpoints `fail`.
fn engine(pool: &str, args: &[&str], fail: &str) -> Child {
    bin()
        .args(["alloc", "--keeper", pool, "--hold", "--json"])
        .args(args)
        .failpoints(fail)
        .spawn_piped()
}

/// An [`engine`] without failpoints, once it holds its lease: the engine
/// and its report.
fn lease(pool: &str, args: &[&str]) -> (Children, Value) {
    let mut e = Children(vec![engine(pool, args, "")]);
    let report = read_report(&mut e[0]);
    (e, report)
}

/// Every 2 MiB huge page is free again and as many reserved as `resv`.
#[track_caller]
fn assert_huge_pages_back(free: u64, resv: u64) {
    until(
        5,
        || support::procs::free_2m() == free,
        || {
            let now = support::procs::free_2m();
            format!("every huge page is free again: {now} of {free} are")
        },
    );
    assert_eq!(support::procs::resv_2m(), resv, "none is reserved");
}

/// A keeper of `pool` like [`keeper`]'s, run to its end (one that fails at start).
fn keep_once(pool: &str, tmpfs: &SmallTmpfs) -> Output {
    bin()
        .args(["keep", "--name", pool])
        .args(pool_on(tmpfs))
        .output()
        .unwrap()
}

/// An engine that leases `pool`, prints its report and releases it.
fn engine_once(pool: &str, args: &[&str]) -> Output {
    bin()
        .args(["alloc", "--keeper", pool, "--json"])
        .args(args)
        .output()
        .unwrap()
}

fn status(pool: &str) -> Value {
    let all = bin()
        .args(["keep", "status", "--name", pool, "--json"])
        .succeeds();
    all[0].clone()
}

/// Wait (at most `secs`) until the status of the keeper of `pool` is
/// `done`; else fail with its status.
#[track_caller]
fn until_status(pool: &str, secs: u64, done: impl Fn(&Value) -> bool) {
    until(secs, || done(&status(pool)), || format!("{}", status(pool)));
}

/// Wait (at most 10 s) until the keeper of `pool` says it is `stopping`:
/// its serve loop has taken a stop request (SIGTERM) in. Until then a
/// second SIGTERM could merge with the first (standard signals do not
/// queue); from then on it is a stop request of its own. A keeper that
/// says so also still runs (it answered).
#[track_caller]
fn until_stopping(pool: &str) {
    until(
        10,
        || status(pool)["state"] == "stopping",
        || format!("the keeper never said it is stopping: {}", status(pool)),
    );
}

/// SIGTERM the keeper of `pool` once it is stopping after a first one: it
/// must exit 0 within `limit`; how long it took after the second.
#[track_caller]
fn second_sigterm(keeper: &mut Child, pool: &str, limit: Duration) -> Duration {
    until_stopping(pool);
    let t = Instant::now();
    terminate(keeper, limit);
    t.elapsed()
}

/// SIGTERM a keeper, or an engine that holds a lease: it must exit 0
/// within 10 s.
#[track_caller]
fn stop(child: &mut Child) {
    terminate(child, Duration::from_secs(10));
}

#[track_caller]
fn assert_clean(tmpfs: &SmallTmpfs, what: &str) {
    // The kernel frees an unlinked file's pages as its last holder exits.
    until(
        5,
        || tmpfs.used() == 0,
        || format!("{what}: the tmpfs still holds {} bytes", tmpfs.used()),
    );
    assert!(tmpfs.files().is_empty(), "{what}: {:?}", tmpfs.files());
}

/// `hostpool doctor`'s findings of the area `keepers` about `pool`.
fn keepers_findings(pool: &str) -> Vec<Value> {
    let doctor = bin().args(["doctor", "--json"]).output().unwrap();
    let doctor: Value = serde_json::from_slice(&doctor.stdout).unwrap();
    doctor["findings"]
        .as_array()
        .unwrap_or_else(|| panic!("no findings: {doctor}"))
        .iter()
        .filter(|f| f["area"] == "keepers" && f["item"] == pool)
        .cloned()
        .collect()
}

/// The offsets each generation writes its mark at: first, middle, last.
const MARKS: [u64; 3] = [0, 4 * MIB, 8 * MIB - 4];

/// An engine SIGKILLed and restarted 20 times against one keeper: every
/// attach succeeds, is resident (no prefault), counts the generation up,
/// hears that the previous lease died (and its pid) and the tag it stored;
/// with content = keep it finds the previous generation's bytes, with
/// content = zero only zeros. Nothing is left once the keeper stops.
#[test]
fn an_engine_killed_and_restarted_20_times_finds_its_bytes_or_zeros() {
    for content in ["keep", "zero"] {
        let Some((tmpfs, pool)) = tmpfs_and_pool(&format!("restart-{content}")) else {
            return;
        };
        let (mut k, ready) = keeper(&pool, &tmpfs, &["--content", content], "");
        assert_eq!(ready["content"], content);
        assert_eq!(ready["prefault"]["bytes"], 8 * MIB, "{ready}");
        let instance = ready["instance"].as_str().unwrap().to_string();
        let mut last_pid = 0;
        for generation in 1..=20u8 {
            let tag = format!("gen-{generation}");
            let (mut e, report) = lease(&pool, &["--keeper-tag", &tag]);
            let lease = &report["keeper"];
            let what = format!("content {content}, generation {generation}: {lease}");
            assert_eq!(lease["generation"], u64::from(generation), "{what}");
            assert_eq!(lease["instance"], instance.as_str(), "{what}");
            assert_eq!(lease["content"], content, "{what}");
            assert!(lease["attach_seconds"].as_f64().unwrap() < 5.0, "{what}");
            assert_eq!(report["prefault"]["bytes"], 0, "{what}");
            assert_eq!(report["mapped_bytes"], 8 * MIB, "{what}");
            if generation == 1 {
                assert!(lease["previous"].is_null(), "{what}");
                assert!(lease["tag"].is_null(), "{what}");
            } else {
                assert_eq!(lease["previous"]["how"], "died", "{what}");
                assert_eq!(lease["previous"]["pid"], last_pid, "{what}");
                assert_eq!(lease["tag"], format!("gen-{}", generation - 1), "{what}");
            }
            let pid = e[0].id();
            let base = addr(&report);
            for off in MARKS {
                let found = mem_read(pid, base + off, 4);
                let expect = if content == "keep" && generation > 1 {
                    [generation - 1; 4]
                } else {
                    [0; 4]
                };
                assert_eq!(found, expect, "{what}: offset {off}");
                mem_write(pid, base + off, &[generation; 4]);
            }
            kill_and_reap(&mut e[0]);
            last_pid = pid;
        }
        let st = status(&pool);
        assert_eq!(st["generation"], 20, "{st}");
        assert_eq!(st["previous"]["how"], "died", "{st}");
        stop(&mut k[0]);
        assert_clean(&tmpfs, content);
    }
}

/// Two engines race for one pool: one lease, and the other is refused,
/// naming the holder's pid. A process of another user is refused, unless
/// the pool allows its uid.
#[test]
fn one_lease_at_a_time_and_only_for_allowed_users() {
    if !root_or_skip("needs root to mount a small tmpfs and to run as another user") {
        return;
    }
    let tmpfs = SmallTmpfs::mount("race", 32);
    let pool = name("race");
    let (_k, _) = keeper(&pool, &tmpfs, &[], "");
    let mut both = Children(vec![engine(&pool, &[], ""), engine(&pool, &[], "")]);
    let mut outcomes = Vec::new();
    for i in 0..2 {
        let end = Instant::now() + Duration::from_secs(10);
        loop {
            if let Some(st) = both[i].try_wait().unwrap() {
                let err = stderr_of(&mut both[i]);
                outcomes.push((i, Err((st.code(), err))));
                break;
            }
            if status(&pool)["lease"]["pid"] == both[i].id() {
                outcomes.push((i, Ok(())));
                break;
            }
            assert!(Instant::now() < end, "engine {i} neither leased nor failed");
            std::thread::sleep(Duration::from_millis(20));
        }
    }
    let winner = outcomes
        .iter()
        .find(|(_, o)| o.is_ok())
        .expect("one lease")
        .0;
    let (_, lost) = outcomes
        .iter()
        .find(|(_, o)| o.is_err())
        .expect("one refusal");
    let Err((code, err)) = lost else {
        unreachable!()
    };
    assert_eq!(*code, Some(1), "{err}");
    assert!(
        err.contains(&format!("is leased by pid {}", both[winner].id()))
            && err.contains("one lease at a time"),
        "{err}"
    );
    stop(&mut both[winner]);

    // Another user: refused by the keeper's credentials check.
    let as_nobody = |pool: &str| {
        std::process::Command::new("setpriv")
            .args(["--reuid=65534", "--regid=65534", "--clear-groups"])
            .arg(env!("CARGO_BIN_EXE_hostpool"))
            .args(["alloc", "--keeper", pool, "--json"])
            .env_remove("RUST_LOG")
            .output()
            .expect("setpriv")
    };
    let err = fails(&as_nobody(&pool), 1);
    assert!(
        err.contains("uid 65534 may not use kept pool") && err.contains("allow_uids"),
        "{err}"
    );
    let other = name("race-allowed");
    let (_k2, _) = keeper(&other, &tmpfs, &["--allow-uid", "65534"], "");
    let report = succeeds(&as_nobody(&other));
    assert_eq!(report["keeper"]["generation"], 1);
    assert_eq!(status(&other)["previous"]["how"], "closed");
}

/// A socket name held by another process fails the keeper at start, naming
/// that process; a second keeper of a name is told the first one's pid.
#[test]
fn a_squatted_socket_name_fails_the_keeper_at_start() {
    let Some((tmpfs, pool)) = tmpfs_and_pool("squat") else {
        return;
    };
    let squatter = {
        use rustix::net::{AddressFamily, SocketAddrUnix, SocketType};
        let a =
            SocketAddrUnix::new_abstract_name(format!("hostpool-keep/{pool}").as_bytes()).unwrap();
        // Close-on-exec: the other tests' children must not hold the name.
        let s = rustix::net::socket_with(
            AddressFamily::UNIX,
            SocketType::SEQPACKET,
            rustix::net::SocketFlags::CLOEXEC,
            None,
        )
        .unwrap();
        rustix::net::bind(&s, &a).unwrap();
        rustix::net::listen(&s, 4).unwrap();
        s
    };
    let t = Instant::now();
    let err = fails(&keep_once(&pool, &tmpfs), 1);
    assert!(
        err.contains(&format!(
            "@hostpool-keep/{pool} is held by pid {}",
            std::process::id()
        )) && err.contains("not a keeper"),
        "{err}"
    );
    assert!(t.elapsed() < Duration::from_secs(10), "{:?}", t.elapsed());
    assert_clean(&tmpfs, "refused keeper");
    drop(squatter);
    let (first, _) = keeper(&pool, &tmpfs, &[], "");
    let err = fails(&keep_once(&pool, &tmpfs), 1);
    assert!(
        err.contains(&format!(
            "a keeper of `{pool}` already runs (pid {}",
            first[0].id()
        )),
        "{err}"
    );
}

/// The keeper SIGKILLed while leased: the engine goes on reading and
/// writing its pool; a new attach fails at once naming the socket and how to
/// start it; a restarted keeper serves again (a new instance, generation
/// 1); nothing is left once the keepers and the engines are gone.
#[test]
fn a_keeper_killed_while_leased_leaves_its_engine_working() {
    let Some((tmpfs, pool)) = tmpfs_and_pool("kill-keeper") else {
        return;
    };
    let (mut k, ready) = keeper(&pool, &tmpfs, &["--content", "keep"], "");
    let (mut e, report) = lease(&pool, &[]);
    let (pid, base) = (e[0].id(), addr(&report));
    mem_write(pid, base + 12345, b"before");
    kill_and_reap(&mut k[0]);
    mem_write(pid, base + 7 * MIB, b"after");
    assert_eq!(mem_read(pid, base + 12345, 6), b"before");
    assert_eq!(mem_read(pid, base + 7 * MIB, 5), b"after");
    assert_eq!(tmpfs.used(), 8 * MIB, "the engine holds the pool's pages");
    let t = Instant::now();
    let err = fails(&engine_once(&pool, &[]), 1);
    assert!(
        err.contains(&format!(
            "no keeper answers for kept pool `{pool}` on @hostpool-keep/{pool}"
        )) && err.contains("hostpool keep --name"),
        "{err}"
    );
    assert!(t.elapsed() < Duration::from_secs(2), "{:?}", t.elapsed());
    let (mut k2, ready2) = keeper(&pool, &tmpfs, &[], "");
    assert_ne!(ready2["instance"], ready["instance"]);
    let (mut e2, r2) = lease(&pool, &[]);
    assert_eq!(r2["keeper"]["generation"], 1, "{r2}");
    assert_eq!(r2["keeper"]["instance"], ready2["instance"], "{r2}");
    assert_eq!(
        mem_read(e2[0].id(), addr(&r2) + 12345, 6),
        [0; 6],
        "a new pool"
    );
    // A held pool exits 0 on SIGTERM, keeper or not.
    stop(&mut e[0]);
    stop(&mut e2[0]);
    stop(&mut k2[0]);
    assert_clean(&tmpfs, "keepers and engines gone");
}

/// One step of the fault matrix: who stalls at which failpoint, and who is
/// killed there.
struct Step {
    what: &'static str,
    /// The keeper's failpoint (empty: none).
    keeper_fail: &'static str,
    /// The engine's failpoint (empty: none).
    engine_fail: &'static str,
    /// Whose stall the test waits for before the kill.
    stalls: Who,
    /// Who is SIGKILLed there.
    victim: Who,
}

#[derive(Clone, Copy, PartialEq, Debug)]
enum Who {
    Keeper,
    Engine,
}

impl Step {
    /// The engine stalls at failpoint `fail` and is killed there.
    const fn engine(what: &'static str, fail: &'static str) -> Step {
        Step {
            what,
            keeper_fail: "",
            engine_fail: fail,
            stalls: Who::Engine,
            victim: Who::Engine,
        }
    }

    /// The keeper stalls at failpoint `fail` and is killed there.
    const fn keeper(what: &'static str, fail: &'static str) -> Step {
        Step {
            what,
            keeper_fail: fail,
            engine_fail: "",
            stalls: Who::Keeper,
            victim: Who::Keeper,
        }
    }
}

/// The keeper protocol's fault matrix: the engine and the keeper each
/// killed at each step (connect, descriptor passing, attach, lease end,
/// zeroing), with the shared-pool matrix's rules: the survivor fails within
/// seconds naming what happened, or goes on with a lease that stays valid;
/// a killed engine's lease ends as "died" and the pool goes back to the
/// keeper; nothing is left once every process is gone; and a keeper started
/// again serves a new engine.
#[test]
fn fault_matrix_of_the_keeper_protocol() {
    if !root_or_skip("needs root to mount a small tmpfs") {
        return;
    }
    let steps = [
        Step::engine(
            "engine killed before it connects",
            "keeper-before-connect=stall",
        ),
        Step::keeper("keeper killed as it reads the hello", "keeper-hello=stall"),
        Step::engine(
            "engine killed holding the descriptors",
            "keeper-passing-fds=stall",
        ),
        Step::keeper(
            "keeper killed passing the descriptors",
            "keeper-passing-fds=stall",
        ),
        Step::engine("engine killed once attached", "keeper-attached=stall"),
        Step::keeper("keeper killed once it leased", "keeper-leased=stall"),
        Step::engine("engine killed releasing", "keeper-release=stall"),
        Step::keeper("keeper killed at the lease's end", "keeper-lease-end=stall"),
        // The keeper stalls; the engine waiting for it is killed.
        Step {
            victim: Who::Engine,
            ..Step::keeper(
                "engine killed waiting for the zeroing",
                "keeper-zeroing=stall",
            )
        },
        Step::keeper("keeper killed zeroing", "keeper-zeroing=stall"),
    ];
    for (i, step) in steps.iter().enumerate() {
        let what = step.what;
        let tmpfs = SmallTmpfs::mount(&format!("matrix-{i}"), 32);
        let pool = name(&format!("matrix-{i}"));
        let (mut k, _) = keeper(&pool, &tmpfs, &[], step.keeper_fail);
        let lease_end = step.keeper_fail.starts_with("keeper-lease-end")
            || step.keeper_fail.starts_with("keeper-zeroing");
        let mut first_pid = None;
        if lease_end || step.engine_fail.starts_with("keeper-release") {
            // A first engine leases and releases (or dies releasing).
            let mut first = engine(&pool, &[], step.engine_fail);
            first_pid = Some(first.id());
            let _ = read_report(&mut first);
            signal(&first, libc::SIGTERM);
            if step.stalls == Who::Engine {
                wait_stderr(&mut first, "stalling until killed", Duration::from_secs(10));
                first.kill().unwrap();
            }
            first.wait().unwrap();
        }
        let mut e = Children(Vec::new());
        if !lease_end && !step.engine_fail.starts_with("keeper-release") {
            e.push(engine(&pool, &[], step.engine_fail));
        } else if step.keeper_fail.starts_with("keeper-zeroing") {
            // The next engine waits for the zeroing.
            e.push(engine(&pool, &[], ""));
        }
        match step.stalls {
            Who::Keeper => {
                wait_stderr(&mut k[0], "stalling until killed", Duration::from_secs(10));
            }
            Who::Engine if !e.is_empty() => {
                wait_stderr(&mut e[0], "stalling until killed", Duration::from_secs(10));
            }
            Who::Engine => {}
        }
        if step.keeper_fail.starts_with("keeper-zeroing") {
            // The next engine is waiting for the zeroing before the kill.
            until(
                10,
                || status(&pool)["waiting"] == 1,
                || format!("{what}: {}", status(&pool)),
            );
        }
        let killed = Instant::now();
        match step.victim {
            Who::Keeper => {
                kill_and_reap(&mut k[0]);
                if let Some(c) = e.first_mut() {
                    if step.keeper_fail.starts_with("keeper-leased") {
                        // Leased before the keeper died: the engine goes on.
                        let report = read_report(c);
                        let (pid, base) = (c.id(), addr(&report));
                        mem_write(pid, base + 5, b"alive");
                        assert_eq!(mem_read(pid, base + 5, 5), b"alive", "{what}");
                        stop(c);
                    } else {
                        let err = exits_with(c, 1, Duration::from_secs(5), what);
                        assert!(
                            err.contains(&format!("the keeper of `{pool}`"))
                                && err.contains("died"),
                            "{what}: {err}"
                        );
                        assert!(
                            killed.elapsed() < Duration::from_secs(3),
                            "{what}: {:?}",
                            killed.elapsed()
                        );
                    }
                }
            }
            Who::Engine => {
                // The engine killed releasing is the first one, killed above.
                let victim_pid = match e.first_mut() {
                    Some(c) => {
                        kill_and_reap(c);
                        c.id()
                    }
                    None => first_pid.expect("the first engine"),
                };
                // The keeper takes the pool back (or drops the waiter).
                until(
                    5,
                    || {
                        let st = status(&pool);
                        st["lease"].is_null() && st["waiting"] == 0
                    },
                    || format!("{what}: {}", status(&pool)),
                );
                if step.engine_fail.starts_with("keeper-passing-fds")
                    || step.engine_fail.starts_with("keeper-attached")
                    || step.engine_fail.starts_with("keeper-release")
                {
                    let st = status(&pool);
                    assert_eq!(st["previous"]["how"], "died", "{what}: {st}");
                    assert_eq!(st["previous"]["pid"], victim_pid, "{what}: {st}");
                }
                if step.keeper_fail.is_empty() {
                    // The keeper serves the next engine.
                    succeeds(&engine_once(&pool, &[]));
                }
                kill_and_reap(&mut k[0]);
            }
        }
        drop(e);
        assert_clean(&tmpfs, what);
        // A keeper started again serves.
        let (mut k2, _) = keeper(&pool, &tmpfs, &[], "");
        let report = succeeds(&engine_once(&pool, &[]));
        assert_eq!(report["keeper"]["generation"], 1, "{what}");
        stop(&mut k2[0]);
        assert_clean(&tmpfs, what);
    }
}

/// A world of 4 ranks leases one kept pool; one SIGKILLed mid-attach fails
/// the others, naming it; the pool goes back to the keeper (not to the
/// kernel), and a new world leases it.
#[test]
fn four_ranks_share_a_lease_and_one_killed_mid_attach_fails_the_others() {
    let Some((tmpfs, pool)) = tmpfs_and_pool("world") else {
        return;
    };
    let (_k, _) = keeper(&pool, &tmpfs, &["--content", "keep"], "");
    let engine_name = name("world-engine");
    // Rank `r` of a world of 4 of engine `shared`, with failpoints `fail`.
    let rank = |shared: &str, r: u32, fail: &str| {
        let r = r.to_string();
        engine(
            &pool,
            &["--shared", shared, "--world", "4", "--rank", &r],
            fail,
        )
    };
    let mut ranks = Children(
        (0..4)
            .map(|r| {
                let fail = if r == 2 { "keeper-attached=stall" } else { "" };
                rank(&engine_name, r, fail)
            })
            .collect(),
    );
    wait_stderr(
        &mut ranks[2],
        "stalling until killed",
        Duration::from_secs(10),
    );
    // Every rank has its lease before the victim dies.
    until_status(&pool, 10, |st| {
        st["lease"]["ranks"].as_array().map_or(0, Vec::len) >= 4
    });
    let victim = ranks[2].id();
    kill_and_reap(&mut ranks[2]);
    for r in [0, 1, 3] {
        let what = format!("rank {r}: a survivor fails");
        let err = exits_with(&mut ranks[r], 1, Duration::from_secs(5), &what);
        assert!(
            err.contains(&format!(
                "rank 2 (pid {victim}) died before the barrier completed"
            )),
            "rank {r}: {err}"
        );
    }
    let st = status(&pool);
    assert!(st["lease"].is_null(), "{st}");
    assert_eq!(st["previous"]["how"], "died", "{st}");
    assert_eq!(st["previous"]["pid"], victim, "{st}");
    assert_eq!(tmpfs.used(), 8 * MIB, "the pool went back to the keeper");

    // A rank of an engine whose lease failed that comes late hears why at
    // once, instead of waiting out its attach timeout for ranks that are gone.
    let late = name("world-late");
    let mut first = Children(vec![
        rank(&late, 0, ""),
        rank(&late, 1, "keeper-attached=stall"),
    ]);
    wait_stderr(
        &mut first[1],
        "stalling until killed",
        Duration::from_secs(10),
    );
    let dead = first[1].id();
    kill_and_reap(&mut first[1]);
    exits_with(&mut first[0], 1, Duration::from_secs(5), "rank 0 fails");
    let t = Instant::now();
    let err = fails(
        &engine_once(&pool, &["--shared", &late, "--world", "4", "--rank", "3"]),
        1,
    );
    assert!(
        err.contains("failed before rank 3 attached")
            && err.contains(&format!(
                "rank 1 (pid {dead}) died before the barrier completed"
            )),
        "{err}"
    );
    assert!(t.elapsed() < Duration::from_secs(2), "{:?}", t.elapsed());
    // Generation 3: the first world's lease, the late engine's, this one.
    let mut world = Children((0..4).map(|r| rank(&engine_name, r, "")).collect());
    let reports: Vec<Value> = world.iter_mut().map(read_report).collect();
    for (r, report) in reports.iter().enumerate() {
        assert_eq!(report["keeper"]["generation"], 3, "rank {r}");
        assert_eq!(report["sharing"]["rank"], r, "rank {r}");
        assert_eq!(report["sharing"]["rendezvous"], "keeper", "rank {r}");
    }
    // They map the same memory.
    mem_write(world[1].id(), addr(&reports[1]) + 100, b"rank1");
    assert_eq!(
        mem_read(world[3].id(), addr(&reports[3]) + 100, 5),
        b"rank1"
    );
    // A rank of the live lease cannot be leased again, nor by another engine.
    let out = engine_once(
        &pool,
        &["--shared", &engine_name, "--world", "4", "--rank", "1"],
    );
    assert_eq!(out.status.code(), Some(1));
    for c in world.iter_mut() {
        stop(c);
    }
    until_status(&pool, 5, |st| st["previous"]["how"] == "closed");
}

/// What an engine asks for is checked: another size or page size is a
/// usage error; no keeper is a runtime error naming the socket, or, with
/// lease.fallback = build, a pool of the engine's own (the report says
/// why).
#[test]
fn sizes_are_checked_and_a_missing_keeper_fails_or_falls_back() {
    let Some((tmpfs, pool)) = tmpfs_and_pool("checks") else {
        return;
    };
    let (_k, _) = keeper(&pool, &tmpfs, &[], "");
    let err = fails(&engine_once(&pool, &["--size", "16MiB"]), 2);
    assert!(
        err.contains("asks for 16 MiB, but kept pool") && err.contains("8 MiB"),
        "{err}"
    );
    succeeds(&engine_once(&pool, &["--size", "8MiB"]));
    // The engine pins what it leased, as any pool: its page tables are
    // filled first (the attach phase), then the pin takes the whole pool.
    let report = succeeds(&engine_once(&pool, &["--pin", "mlock", "--pin-required"]));
    assert_eq!(report["pin"]["status"], "pinned", "{report}");
    assert!(report["phases"]["attach"].as_f64().is_some(), "{report}");
    let err = fails(&engine_once(&pool, &["--page-size", "2MiB"]), 2);
    assert!(err.contains("asks for 2 MiB pages"), "{err}");

    let absent = name("absent");
    let err = fails(&engine_once(&absent, &["--size", "4MiB"]), 1);
    assert!(
        err.contains(&format!("@hostpool-keep/{absent}"))
            && err.contains("fallback = \"build\" in the [lease] table (--keeper-fallback build"),
        "{err}"
    );
    let fallback = ["--size", "4MiB", "--keeper-fallback", "build"];
    let report = succeeds(&engine_once(&absent, &fallback));
    assert!(report["keeper"].is_null(), "{report}");
    assert!(
        report["keeper_fallback"]
            .as_str()
            .unwrap()
            .contains("no keeper answers"),
        "{report}"
    );
    assert_eq!(
        report["prefault"]["bytes"],
        4 * MIB,
        "built and prefaulted: {report}"
    );
}

/// SIGTERM: the keeper refuses new leases and waits for the lease to end,
/// then tears down (exit 0); a second SIGTERM ends it at once, and the
/// engine keeps its mapping.
#[test]
fn sigterm_drains_and_a_second_one_ends_the_keeper_at_once() {
    let Some((tmpfs, pool)) = tmpfs_and_pool("drain") else {
        return;
    };
    let (mut k, _) = keeper(&pool, &tmpfs, &[], "");
    let (mut e, _) = lease(&pool, &[]);
    signal(&k[0], libc::SIGTERM);
    // It took the SIGTERM in (it says it is stopping) and, its lease still
    // in force, answers rather than exits.
    until_stopping(&pool);
    assert!(
        k[0].try_wait().unwrap().is_none(),
        "the keeper waits for its lease"
    );
    let err = fails(&engine_once(&pool, &[]), 1);
    assert!(err.contains("is stopping and takes no new leases"), "{err}");
    stop(&mut e[0]);
    let what = "the keeper ends with its lease";
    exits_with(&mut k[0], 0, Duration::from_secs(5), what);
    assert_clean(&tmpfs, "drained");

    let (mut k2, _) = keeper(&pool, &tmpfs, &[], "");
    let (mut e2, report) = lease(&pool, &[]);
    signal(&k2[0], libc::SIGTERM);
    let took = second_sigterm(&mut k2[0], &pool, Duration::from_secs(2));
    assert!(took < Duration::from_secs(1), "{took:?}");
    mem_write(e2[0].id(), addr(&report) + 1, b"still");
    assert_eq!(mem_read(e2[0].id(), addr(&report) + 1, 5), b"still");
    stop(&mut e2[0]);
    assert_clean(&tmpfs, "ended at once");

    // A second SIGTERM while the pool is being cleared ends the clearing
    // too, at its next 64 MiB step: 256 MiB on one thread, each step slowed
    // to a second, would take four.
    let big = SmallTmpfs::mount("drain-clearing", 300);
    let mut k3 = Children(vec![
        bin()
            .args(["keep", "--name", &pool, "--json", "--size", "256MiB"])
            .args(["--backing", "shm-segmented", "--dir", big.path()])
            .args(["--threads", "1"])
            .env("HOSTPOOL_FAILPOINT_ZERO_STEP_MS", "1000")
            .spawn_piped(),
    ]);
    read_json_line(&mut k3[0]);
    succeeds(&engine_once(&pool, &[]));
    until_status(&pool, 5, |st| st["state"] == "clearing");
    signal(&k3[0], libc::SIGTERM);
    let took = second_sigterm(&mut k3[0], &pool, Duration::from_secs(5));
    assert!(
        took < Duration::from_millis(1800),
        "the clearing stopped at its next step: {took:?}"
    );
    assert_clean(&big, "stopped while clearing");
}

/// A kept pool of 2 MiB huge pages: the lease comes resident in huge pages,
/// the zeroing between leases clears them in place (zeros, the same huge
/// pages: none goes back to the kernel while it runs, for another process to
/// take), and once the keeper stops, or dies while clearing, every huge page
/// is free again and none is reserved.
#[test]
fn a_kept_hugetlbfs_pool_is_cleared_between_leases_and_given_back() {
    let _serial = huge_pages_lock();
    let Some(dir) = support::procs::hugetlbfs_2m(8) else {
        return;
    };
    let (free, resv) = (support::procs::free_2m(), support::procs::resv_2m());
    let pool = name("huge");
    let (mut k, ready) = huge_keeper(&pool, &dir, "16MiB", "");
    assert_eq!(ready["page_size"], 2 * MIB, "{ready}");
    assert_eq!(ready["backing"], "hugetlbfs", "{ready}");
    assert_eq!(
        support::procs::free_2m(),
        free - 8,
        "the keeper faulted its 8 pages"
    );
    for generation in 1..=3u8 {
        let (mut e, report) = lease(&pool, &["--page-size", "2MiB"]);
        assert_eq!(report["page_size"], 2 * MIB);
        assert_eq!(report["keeper"]["generation"], u64::from(generation));
        let (pid, base) = (e[0].id(), addr(&report));
        assert_eq!(
            mem_read(pid, base + 3 * MIB, 4),
            [0; 4],
            "generation {generation}"
        );
        mem_write(pid, base + 3 * MIB, &[generation; 4]);
        kill_and_reap(&mut e[0]);
    }
    // The lease and the zeroing take no page of their own.
    until_status(&pool, 5, |st| st["state"] == "idle");
    assert_eq!(support::procs::free_2m(), free - 8);
    stop(&mut k[0]);
    assert_huge_pages_back(free, resv);

    // A keeper held at the start of its clearing (a failpoint) keeps every
    // page: the clearing frees none of them before it zeroes them.
    let (mut k, _) = huge_keeper(&pool, &dir, "16MiB", "keeper-zeroing=stall");
    succeeds(&engine_once(&pool, &[]));
    until_status(&pool, 5, |st| st["state"] == "clearing");
    // The clearing thread reached the failpoint: whatever it does before
    // zeroing, it has done.
    wait_stderr(
        &mut k[0],
        "failpoint keeper-zeroing: stalling until killed",
        Duration::from_secs(10),
    );
    assert_eq!(
        support::procs::free_2m(),
        free - 8,
        "no page of the pool went back to the kernel while it is cleared"
    );
    kill_and_reap(&mut k[0]);
    assert_huge_pages_back(free, resv);
}

/// `hostpool keep status` lists the pool, its lease and its last lease's
/// end, as text and JSON; `hostpool doctor` reports the keepers it sees.
#[test]
fn status_and_doctor_report_the_kept_pool_and_its_lease() {
    let Some((tmpfs, pool)) = tmpfs_and_pool("status") else {
        return;
    };
    let args = ["--content", "keep", "--allow-uid", "1234"];
    let (_k, ready) = keeper(&pool, &tmpfs, &args, "");
    let (mut e, _) = lease(&pool, &[]);
    let st = status(&pool);
    for (key, want) in [
        ("size", Value::from(8 * MIB)),
        ("page_size", Value::from(4096)),
        ("backing", Value::from("shm-segmented")),
        ("content", Value::from("keep")),
        ("state", Value::from("leased")),
        ("generation", Value::from(1)),
        ("instance", ready["instance"].clone()),
        ("allow_uids", serde_json::json!([1234])),
    ] {
        assert_eq!(st[key], want, "{key}: {st}");
    }
    assert_eq!(st["lease"]["pid"], e[0].id(), "{st}");
    assert_eq!(st["lease"]["ranks"][0]["rank"], 0, "{st}");
    let text = keep_status(&[]);
    assert!(
        text.contains(&format!("{pool}: 8 MiB (4 KiB pages, shm-segmented)"))
            && text.contains(&format!("leased by pid {}", e[0].id())),
        "{text}"
    );
    let found = keepers_findings(&pool)
        .first()
        .cloned()
        .unwrap_or_else(|| panic!("no keepers finding of {pool}"));
    assert!(
        found["value"].as_str().unwrap().contains("leased by pid"),
        "{found}"
    );
    assert_eq!(found["details"]["size"], 8 * MIB, "{found}");
    kill_and_reap(&mut e[0]);
    until_status(&pool, 5, |st| st["previous"]["how"] == "died");
    let text = keep_status(&["--name", &pool]);
    assert!(
        text.contains(&format!("last lease: pid {} died at", e[0].id())),
        "{text}"
    );
    let absent = bin()
        .args(["keep", "status", "--name", &name("nobody-keeps")])
        .output()
        .unwrap();
    assert_eq!(absent.status.code(), Some(1));
}

/// `hostpool keep status ARGS` as text.
fn keep_status(args: &[&str]) -> String {
    let out = bin().args(["keep", "status"]).args(args).output().unwrap();
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// `hostpool keep --config keep.toml` keeps every [[pool]] of the file,
/// each on its own socket with its own content policy, prints a ready line
/// for each, and releases each on SIGTERM; flags and configs it cannot use
/// are usage errors that say what to do.
#[test]
fn a_keepers_config_keeps_each_pool_and_bad_invocations_are_usage_errors() {
    let Some(tmpfs) = SmallTmpfs::mount_or_skip("config", 32) else {
        return;
    };
    let (a, b) = (name("config-a"), name("config-b"));
    let file = tmpfs.0.with_extension("toml");
    struct Remove(std::path::PathBuf);
    impl Drop for Remove {
        fn drop(&mut self) {
            let _ = std::fs::remove_file(&self.0);
        }
    }
    let _file = Remove(file.clone());
    std::fs::write(
        &file,
        format!(
            "[[pool]]\nname = \"{a}\"\nsize = \"8MiB\"\nbacking = \"shm-segmented\"\ndir = \"{d}\"\n\
             content = \"keep\"\n\n[[pool]]\nname = \"{b}\"\nsize = \"4MiB\"\nbacking = \
             \"shm-segmented\"\ndir = \"{d}\"\n",
            d = tmpfs.path()
        ),
    )
    .unwrap();
    let mut k = Children(vec![
        bin()
            .args(["keep", "--json", "--config"])
            .arg(&file)
            .spawn_piped(),
    ]);
    let first = read_json_line(&mut k[0]);
    let second = read_json_line(&mut k[0]);
    assert_eq!(
        (first["name"].as_str(), second["name"].as_str()),
        (Some(a.as_str()), Some(b.as_str()))
    );
    assert_eq!(
        (first["content"].as_str(), second["content"].as_str()),
        (Some("keep"), Some("zero"))
    );
    assert_eq!(tmpfs.used(), 12 * MIB, "both pools are resident");
    for (pool, mib) in [(&a, 8), (&b, 4)] {
        let report = succeeds(&engine_once(pool, &[]));
        assert_eq!(report["mapped_bytes"], mib * MIB);
    }
    let listed = bin().args(["keep", "status", "--json"]).output().unwrap();
    let listed: Value = serde_json::from_slice(&listed.stdout).unwrap();
    for pool in [&a, &b] {
        assert!(
            listed
                .as_array()
                .unwrap()
                .iter()
                .any(|s| s["name"] == pool.as_str()),
            "{pool}: {listed}"
        );
    }
    signal(&k[0], libc::SIGTERM);
    let released = support::procs::read_until(&mut k[0], |l| l.contains(&format!("\"{b}\"")));
    assert!(released.contains("\"released\":true"), "{released}");
    exits_with(&mut k[0], 0, Duration::from_secs(10), "the keeper stops");
    assert_clean(&tmpfs, "both pools released");

    // A keeper whose second pool cannot be built fails (exit 1) without
    // saying the first was ready, and gives the first back.
    std::fs::write(
        &file,
        format!(
            "[[pool]]\nname = \"{a}\"\nsize = \"8MiB\"\nbacking = \"shm-segmented\"\ndir = \"{d}\"\n\n\
             [[pool]]\nname = \"{b}\"\nsize = \"64MiB\"\nbacking = \"shm-segmented\"\ndir = \"{d}\"\n",
            d = tmpfs.path()
        ),
    )
    .unwrap();
    let out = bin()
        .args(["keep", "--json", "--config"])
        .arg(&file)
        .output()
        .unwrap();
    let err = fails(&out, 1);
    assert!(err.contains("cannot hold the pool"), "{err}");
    assert!(
        out.stdout.is_empty(),
        "no pool was said to be ready: {}",
        String::from_utf8_lossy(&out.stdout)
    );
    assert_clean(&tmpfs, "the first pool of a keeper that failed");
    let long_tag = "t".repeat(20_000);

    for (args, says) in [
        (vec!["keep"], "needs --name NAME"),
        (
            vec!["keep", "--config", file.to_str().unwrap(), "--size", "1GiB"],
            "pool flags go with --name",
        ),
        (
            vec!["keep", "--name", "x", "--backing", "anon"],
            "cannot be handed to another process",
        ),
        (
            vec!["keep", "--name", "x", "--pin", "mlock"],
            "belong to the process that uses the memory",
        ),
        (vec!["keep", "--name", "bad name"], "must be 1 to 64"),
        (
            vec!["keep", "--name", "x", "--prefault", "none"],
            "hands engines resident memory",
        ),
        (
            vec!["keep", "--name", "x", "--drain-timeout=-1"],
            "--drain-timeout",
        ),
        (
            vec!["keep", "--name", "x", "--drain-timeout", "-1"],
            "from 0 to one day",
        ),
        (
            vec!["keep", "--name", "x", "--drain-timeout", "1e300"],
            "from 0 to one day",
        ),
        (
            vec!["keep", "--name", "x", "--drain-timeout", "NaN"],
            "from 0 to one day",
        ),
        (vec!["keep", "--content", "keep"], "--name"),
        (vec!["alloc", "--keeper", "a b"], "keeper name `a b`"),
        (vec!["alloc", "--keeper", ""], "keeper name ``"),
        (vec!["alloc", "--attach-timeout", "3"], "goes with --shared"),
        (
            vec!["alloc", "--keeper", "x", "--attach-timeout", "0"],
            "`lease.attach_timeout_secs` (--attach-timeout, Python keeper_attach_timeout=) = 0 s",
        ),
        (
            vec!["alloc", "--keeper", "x", "--attach-timeout", "1e30"],
            "at most one day",
        ),
        (
            vec!["alloc", "--keeper", "x", "--keeper-tag", &long_tag],
            "`lease.tag` (--keeper-tag, Python keeper_tag=) is 20000 bytes",
        ),
    ] {
        assert_usage_error(bin().args(&args), says);
    }
}

/// A keeper of 2 MiB pages SIGKILLed while an engine leases its pool: the
/// engine keeps its pages; once both are gone every huge page is free and
/// none is reserved.
#[test]
fn a_kept_hugetlbfs_pool_goes_back_to_the_kernel_when_keeper_and_engine_die() {
    let _serial = huge_pages_lock();
    let Some(dir) = support::procs::hugetlbfs_2m(4) else {
        return;
    };
    let (free, resv) = (support::procs::free_2m(), support::procs::resv_2m());
    let pool = name("huge-kill");
    let (mut k, _) = huge_keeper(&pool, &dir, "8MiB", "");
    let (mut e, report) = lease(&pool, &[]);
    kill_and_reap(&mut k[0]);
    mem_write(e[0].id(), addr(&report) + 5 * MIB, b"huge");
    assert_eq!(mem_read(e[0].id(), addr(&report) + 5 * MIB, 4), b"huge");
    assert_eq!(
        support::procs::free_2m(),
        free - 4,
        "the engine holds the pages"
    );
    kill_and_reap(&mut e[0]);
    assert_huge_pages_back(free, resv);
}

/// A client of the keeper of `pool`'s socket, as a bare process of the
/// keeper's protocol would connect (no engine behind it).
fn raw_client(pool: &str) -> std::os::fd::OwnedFd {
    use rustix::net::{AddressFamily, SocketAddrUnix, SocketFlags, SocketType};
    let addr =
        SocketAddrUnix::new_abstract_name(format!("hostpool-keep/{pool}").as_bytes()).unwrap();
    let s = rustix::net::socket_with(
        AddressFamily::UNIX,
        SocketType::SEQPACKET,
        SocketFlags::CLOEXEC,
        None,
    )
    .unwrap();
    rustix::net::connect(&s, &addr).unwrap();
    s
}

/// A hello of a bare client of the keeper of `pool`, in the lease protocol
/// that keeper speaks (`keep status` says which): `fields` are the rest of
/// it.
fn raw_hello(pool: &str, fields: &str) -> Vec<u8> {
    let protocol = &status(pool)["protocol"];
    format!(r#"{{"Hello":{{"protocol":{protocol},{fields}}}}}"#).into_bytes()
}

/// Send `message` on `client` and return the keeper's answer.
fn ask(client: &std::os::fd::OwnedFd, message: &[u8]) -> String {
    use rustix::net::{RecvFlags, SendFlags};
    rustix::net::send(client, message, SendFlags::empty()).unwrap();
    let mut answer = vec![0u8; 4096];
    let n = rustix::net::recv(client, &mut answer, RecvFlags::empty())
        .unwrap()
        .0;
    String::from_utf8_lossy(&answer[..n]).into_owned()
}

/// Hostile clients and a sick keeper: clients that connect and say
/// nothing, send junk or ask for absurd numbers do not stop the keeper
/// serving; a keeper whose clearing fails refuses every later lease with
/// why (and doctor warns); the engine of a stopped keeper is told so at its
/// attach timeout.
#[test]
fn a_keeper_survives_hostile_clients_and_says_when_it_is_sick() {
    let Some((tmpfs, pool)) = tmpfs_and_pool("hostile") else {
        return;
    };
    let (_k, _) = keeper(&pool, &tmpfs, &[], "keeper-clear=EIO");
    let absurd_hello = raw_hello(
        &pool,
        r#""world":4294967295,"rank":7,"engine":"x","size":18446744073709551615,"page":0,"tag":null,"attach_timeout_secs":-1e308,"barrier_timeout_secs":1e308"#,
    );
    let _silent = raw_client(&pool);
    let junk = raw_client(&pool);
    rustix::net::send(&junk, b"\x00junk{", rustix::net::SendFlags::empty()).unwrap();
    // A message longer than the keeper reads is refused with why, not
    // dropped (which the client would take for a keeper that died).
    let mut big = b"{\"Hello\":".to_vec();
    big.resize(100_000, b' ');
    let long = raw_client(&pool);
    let answer = ask(&long, &big);
    assert!(
        answer.contains("Refused") && answer.contains("longer than 64 KiB"),
        "{answer}"
    );
    let absurd = raw_client(&pool);
    let answer = ask(&absurd, &absurd_hello);
    assert!(
        answer.contains("Refused") && answer.contains("world must be 1 to"),
        "{answer}"
    );
    // The keeper serves on.
    succeeds(&engine_once(&pool, &[]));
    // That lease's end was to clear the pool, which fails (a failpoint):
    // every later lease is refused with why.
    until_status(&pool, 5, |st| st["state"] == "broken");
    let err = fails(&engine_once(&pool, &[]), 1);
    assert!(
        err.contains(&format!(
            "kept pool `{pool}` is unusable: clearing it between leases failed"
        )) && err.contains("Input/output error")
            && err.contains("restart its keeper"),
        "{err}"
    );
    let findings = keepers_findings(&pool);
    assert!(
        findings.iter().any(|f| f["verdict"] == "warn"),
        "{findings:?}"
    );
    // A stopped keeper: its engine is told so at its attach timeout.
    let other = name("hostile-stopped");
    let (k2, _) = keeper(&other, &tmpfs, &[], "");
    signal(&k2[0], libc::SIGSTOP);
    let t = Instant::now();
    let out = engine_once(&other, &["--attach-timeout", "1"]);
    let took = t.elapsed();
    // `keep status` says the same of it.
    let listed = bin()
        .args(["keep", "status", "--name", &other])
        .output()
        .unwrap();
    signal(&k2[0], libc::SIGCONT);
    let err = fails(&out, 1);
    assert!(
        err.contains("did not hand over the pool within 1 s") && err.contains("it is stopped"),
        "{err}"
    );
    assert!(took < Duration::from_secs(5), "{took:?}");
    let listed = String::from_utf8_lossy(&listed.stderr);
    assert!(
        listed.contains("did not answer a status request") && listed.contains("it is stopped"),
        "{listed}"
    );
    // Resumed, the keeper reads the hello of the engine that gave up: it is
    // no lease (no generation counted, no lease that `died`).
    let report = succeeds(&engine_once(&other, &[]));
    assert_eq!(report["keeper"]["generation"], 1, "{report}");
    assert!(report["keeper"]["previous"].is_null(), "{report}");
}

/// A lease that does not end within the drain timeout does not keep the
/// keeper: it stops anyway (exit 0), and the engine keeps its mapping.
#[test]
fn a_lease_that_outlasts_the_drain_timeout_does_not_keep_the_keeper() {
    let Some((tmpfs, pool)) = tmpfs_and_pool("drain-timeout") else {
        return;
    };
    let (mut k, _) = keeper(&pool, &tmpfs, &["--drain-timeout", "0.5"], "");
    let (mut e, report) = lease(&pool, &[]);
    let t = Instant::now();
    signal(&k[0], libc::SIGTERM);
    let st = wait_timeout(&mut k[0], Duration::from_secs(5)).expect("the keeper stops");
    assert_eq!(st.code(), Some(0));
    assert!(
        t.elapsed() >= Duration::from_millis(450),
        "{:?}",
        t.elapsed()
    );
    let err = stderr_of(&mut k[0]);
    assert!(
        err.contains("did not end within 0.5 s of the stop request"),
        "{err}"
    );
    mem_write(e[0].id(), addr(&report) + 9, b"kept");
    assert_eq!(mem_read(e[0].id(), addr(&report) + 9, 4), b"kept");
    stop(&mut e[0]);
    assert_clean(&tmpfs, "the engine gone");
}

/// A client that leases the pool with the keeper's own protocol, truncates
/// every file it was handed and hangs up: what an engine (or a child it
/// gave the descriptors to) must never do.
fn lease_and_truncate(pool: &str) {
    let (_conn, fds) = lease_raw(pool);
    assert!(!fds.is_empty());
    for fd in fds {
        rustix::fs::ftruncate(&fd, 0).unwrap();
    }
}

/// Lease `pool` as a bare client of the keeper's protocol would: the
/// connection (the lease lasts while it is open) and the descriptors the
/// keeper handed over.
fn lease_raw(pool: &str) -> (std::os::fd::OwnedFd, Vec<std::os::fd::OwnedFd>) {
    use rustix::net::{RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags};
    let hello = raw_hello(
        pool,
        r#""world":1,"rank":0,"engine":"","size":null,"page":null,"tag":null,"attach_timeout_secs":5.0,"barrier_timeout_secs":5.0"#,
    );
    let s = raw_client(pool);
    rustix::net::send(&s, &hello, rustix::net::SendFlags::empty()).unwrap();
    let mut buf = vec![0u8; 65536];
    let mut space = [std::mem::MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(8))];
    let mut control = RecvAncillaryBuffer::new(&mut space);
    let got = rustix::net::recvmsg(
        &s,
        &mut [std::io::IoSliceMut::new(&mut buf)],
        &mut control,
        RecvFlags::CMSG_CLOEXEC,
    )
    .unwrap();
    let text = String::from_utf8_lossy(&buf[..got.bytes]).into_owned();
    assert!(text.contains("\"Lease\""), "{text}");
    let mut files = Vec::new();
    for m in control.drain() {
        if let RecvAncillaryMessage::ScmRights(fds) = m {
            files.extend(fds);
        }
    }
    assert!(!files.is_empty(), "{text}");
    (s, files)
}

/// A kept hugetlbfs pool without a mount is a memfd, sealed against
/// shrinking and growing before any lease: an engine (or a process that
/// opened its `/proc/PID/fd/N`) that `ftruncate`s it gets `EPERM`, so no
/// lease can break the pool, and the next lease is granted as usual.
#[test]
fn a_leased_memfd_cannot_be_truncated() {
    let Some(_dir) = support::procs::hugetlbfs_2m(4) else {
        return;
    };
    let _serial = huge_pages_lock();
    let pool = name("sealed");
    let args = [
        "--size",
        "8MiB",
        "--backing",
        "hugetlbfs",
        "--page-size",
        "2MiB",
    ];
    let (mut k, _) = keeper_with(&pool, &args, "");
    let (conn, fds) = lease_raw(&pool);
    for fd in &fds {
        let f = std::fs::File::from(fd.try_clone().unwrap());
        assert!(
            support::procs::size_sealed(&f),
            "the leased memfd is sealed"
        );
        support::procs::assert_truncate_refused(&f, 0, "shrinking the leased memfd");
        support::procs::assert_truncate_refused(&f, 16 * MIB, "growing the leased memfd");
    }
    // The keeper's own descriptor is the same file, as sealed.
    let held = support::procs::fds_of(k[0].id(), "/memfd:hostpool");
    assert!(!held.is_empty(), "the keeper holds its memfd");
    for (fd, link) in held {
        let f = support::procs::open_fd_of(k[0].id(), fd);
        support::procs::assert_truncate_refused(&f, 0, &link);
    }
    drop(fds);
    drop(conn);
    let rep = succeeds(&engine_once(&pool, &[]));
    assert_eq!(rep["keeper"]["name"], pool.as_str(), "{rep}");
    let st = status(&pool);
    assert!(st["broken"].is_null(), "{st}");
    assert_eq!(st["generation"], 2, "{st}");
    stop(&mut k[0]);
}

/// A file in a directory cannot take seals (tmpfs), so an engine checks
/// each leased file's length before it maps it: one truncated between the
/// keeper's hand-over and the engine's `mmap` (here by the test, through
/// the engine's `/proc/PID/fd/N`) is refused naming it, the engine does not
/// die of SIGBUS, and the keeper, alive, marks its pool broken.
#[test]
fn an_engine_refuses_a_leased_file_truncated_before_it_maps_naming_it() {
    let Some((tmpfs, pool)) = tmpfs_and_pool("short-lease") else {
        return;
    };
    let (mut k, _) = keeper(&pool, &tmpfs, &["--content", "keep"], "");
    let mut e = Children(vec![engine(&pool, &[], "keeper-passing-fds=stop")]);
    let pid = e[0].id();
    support::procs::wait_stopped(pid, Duration::from_secs(20));
    let files = support::procs::fds_of(pid, tmpfs.path());
    assert!(!files.is_empty(), "the engine holds the leased files");
    let (fd, _) = files.last().unwrap();
    support::procs::open_fd_of(pid, *fd).set_len(0).unwrap();
    signal(&e[0], libc::SIGCONT);
    let err = exits_with(&mut e[0], 1, Duration::from_secs(20), "the engine");
    assert!(
        err.contains(&format!("kept pool `{pool}`'s file"))
            && err.contains("is 0 B long, shorter than its")
            && err.contains("nothing was mapped"),
        "{err}"
    );
    // The next lease finds the pool broken and is refused saying why.
    until(
        10,
        || {
            let _ = engine_once(&pool, &[]);
            status(&pool)["state"] == "broken"
        },
        || format!("the keeper marks its pool broken: {}", status(&pool)),
    );
    assert!(k[0].try_wait().unwrap().is_none(), "the keeper lives");
    stop(&mut k[0]);
    assert_clean(&tmpfs, "the keeper stopped");
}

/// A lease that truncates the pool's files (its memory is gone) breaks the
/// kept pool, with `content = "zero"` (whose clearing would touch every
/// page) and `"keep"` alike: the keeper does not die of SIGBUS, every later
/// lease is refused saying why, and no engine maps the truncated files.
#[test]
fn a_lease_that_truncates_the_pools_files_breaks_it_and_kills_nothing() {
    let Some(tmpfs) = SmallTmpfs::mount_or_skip("truncated", 32) else {
        return;
    };
    for content in ["zero", "keep"] {
        let pool = name(&format!("truncated-{content}"));
        let (mut k, _) = keeper(&pool, &tmpfs, &["--content", content], "");
        lease_and_truncate(&pool);
        until(
            5,
            || {
                let _ = engine_once(&pool, &[]);
                status(&pool)["state"] == "broken"
            },
            || format!("{content}: {}", status(&pool)),
        );
        assert!(
            k[0].try_wait().unwrap().is_none(),
            "{content}: the keeper lives"
        );
        let err = fails(&engine_once(&pool, &[]), 1);
        assert!(
            err.contains(&format!("kept pool `{pool}` is unusable"))
                && err.contains("was truncated to 0 B"),
            "{content}: {err}"
        );
        assert!(
            status(&pool)["broken"]
                .as_str()
                .is_some_and(|b| b.contains("truncated")),
            "{content}: {}",
            status(&pool)
        );
        stop(&mut k[0]);
    }
    assert_clean(&tmpfs, "both keepers stopped");
}

/// A kept pool of 8192 files (32 MiB in 4 KiB segments): its lease hands
/// over every descriptor with its extent in messages that each stay small
/// (the extents of 8192 files in one message were more than a message
/// holds, and no engine could lease the pool), and the engine sees the
/// keeper's bytes at both ends.
#[test]
fn a_kept_pool_of_thousands_of_files_is_leased_whole() {
    let Some(tmpfs) = SmallTmpfs::mount_or_skip("many-files", 64) else {
        return;
    };
    // Each process holds a descriptor per file: raise the soft limit
    // (children inherit it) where it is lower than that.
    let (soft, hard) = {
        let l = rustix::process::getrlimit(rustix::process::Resource::Nofile);
        (l.current.unwrap_or(u64::MAX), l.maximum.unwrap_or(u64::MAX))
    };
    if soft < 20_000 {
        rustix::process::setrlimit(
            rustix::process::Resource::Nofile,
            rustix::process::Rlimit {
                current: Some(hard.min(20_000)),
                maximum: Some(hard),
            },
        )
        .expect("raise RLIMIT_NOFILE");
    }
    let pool = name("many-files");
    let config = tmpfs.0.with_extension("toml");
    std::fs::write(&config, "[shm-segmented]\nsegments = 8192\n").unwrap();
    let mut args = vec!["--config", config.to_str().unwrap()];
    args.extend(["--size", "32MiB", "--backing", "shm-segmented"]);
    args.extend(["--dir", tmpfs.path(), "--content", "keep"]);
    let (mut k, ready) = keeper_with(&pool, &args, "");
    let _ = std::fs::remove_file(&config);
    assert_eq!(ready["mapped"], 32 * MIB, "{ready}");
    let (mut e, report) = lease(&pool, &[]);
    assert_eq!(report["mapped_bytes"], 32 * MIB, "{report}");
    let (pid, base) = (e[0].id(), addr(&report));
    mem_write(pid, base, b"head");
    mem_write(pid, base + 32 * MIB - 4, b"tail");
    stop(&mut e[0]);
    let (mut again, report) = lease(&pool, &[]);
    let (pid, base) = (again[0].id(), addr(&report));
    assert_eq!(mem_read(pid, base, 4), b"head");
    assert_eq!(mem_read(pid, base + 32 * MIB - 4, 4), b"tail");
    assert_eq!(report["keeper"]["generation"], 2, "{report}");
    signal(&again[0], libc::SIGTERM);
    wait_timeout(&mut again[0], Duration::from_secs(10)).expect("the engine stops");
    // An engine whose open-file limit is below the pool's files is told so,
    // not that the keeper died while handing over the pool.
    let hostpool = bin().get_program().to_owned();
    let out = std::process::Command::new("sh")
        .arg("-c")
        .arg(format!(
            "ulimit -n 1024 && exec \"$0\" alloc --keeper {pool} --json"
        ))
        .arg(&hostpool)
        .output()
        .unwrap();
    let err = fails(&out, 1);
    assert!(
        err.contains("may open 1024 files (RLIMIT_NOFILE)") && err.contains("ulimit -n"),
        "{err}"
    );
    stop(&mut k[0]);
    assert_clean(&tmpfs, "8192 files given back");
}

/// The tenants of `st` (a keeper's status).
fn tenants_of(st: &Value) -> Vec<Value> {
    st["tenants"].as_array().cloned().unwrap_or_default()
}

/// A keeper of `--tenants 2`: two engines lease the pool at once (one
/// keeper instance, generations 1 and 2, the same memory: what one writes
/// the other reads), and `keep status` lists both; a third is refused at
/// once naming the limit and both holders. One SIGKILLed ends its lease
/// alone: the other keeps its lease and its bytes (with content = zero no
/// clearing under a live tenant), a new engine takes the freed place, and
/// the survivor releases cleanly. Once the last tenant is gone the pool is
/// cleared before the next lease.
#[test]
fn two_tenants_lease_one_pool_at_once_and_each_ends_alone() {
    let Some((tmpfs, pool)) = tmpfs_and_pool("tenants") else {
        return;
    };
    let (mut k, ready) = keeper(&pool, &tmpfs, &["--tenants", "2"], "");
    assert_eq!(ready["max_tenants"], 2, "{ready}");
    assert_eq!(ready["content"], "zero", "{ready}");
    let (mut a, ra) = lease(&pool, &[]);
    let (mut b, rb) = lease(&pool, &[]);
    let (pa, pb) = (a[0].id(), b[0].id());
    for (report, generation) in [(&ra, 1), (&rb, 2)] {
        let lease = &report["keeper"];
        assert_eq!(lease["generation"], generation, "{lease}");
        assert_eq!(lease["instance"], ready["instance"], "{lease}");
        assert_eq!(lease["tenants"], 2, "the keeper's limit: {lease}");
        assert_eq!(report["mapped_bytes"], 8 * MIB, "the whole pool: {report}");
        assert_eq!(report["prefault"]["bytes"], 0, "resident: {report}");
    }
    // One pool: what the first tenant writes, the second reads.
    mem_write(pa, addr(&ra) + 100, b"tenant-a");
    assert_eq!(mem_read(pb, addr(&rb) + 100, 8), b"tenant-a");
    let st = status(&pool);
    let tenants = tenants_of(&st);
    assert_eq!(tenants.len(), 2, "{st}");
    assert_eq!(
        (&tenants[0]["pids"], &tenants[1]["pids"]),
        (&serde_json::json!([pa]), &serde_json::json!([pb])),
        "{st}"
    );
    assert_eq!(
        (&tenants[0]["generation"], &tenants[1]["generation"]),
        (&Value::from(1), &Value::from(2)),
        "{st}"
    );
    assert!(tenants.iter().all(|t| t["live"] == true), "{st}");
    assert!(
        tenants
            .iter()
            .all(|t| (&t["stored"], &t["hits"], &t["hits_from_others"])
                == (&Value::from(0), &Value::from(0), &Value::from(0))),
        "no tier asked yet: {st}"
    );
    assert_eq!(
        (&st["max_tenants"], &st["state"]),
        (&Value::from(2), &Value::from("leased"))
    );
    assert_eq!(
        st["lease"]["pid"], pa,
        "the first tenant, as before tenants: {st}"
    );
    let text = keep_status(&["--name", &pool]);
    assert!(
        text.contains("2 of at most 2 tenants")
            && text.contains(&format!("tenant of generation 1: pid(s) {pa}, since"))
            && text.contains(&format!("tenant of generation 2: pid(s) {pb}, since"))
            && text.contains("live, tier: 0 stored, 0 hit(s) (0 stored by others)"),
        "{text}"
    );
    // `doctor` names both engines, not only the first.
    let found = keepers_findings(&pool);
    let value = found[0]["value"].as_str().unwrap_or_default();
    assert!(
        value.contains(&format!("leased by 2 engines (pid {pa}, pid {pb})")),
        "{found:?}"
    );

    // A third engine: refused at once, naming the limit and both holders.
    let t = Instant::now();
    let err = fails(&engine_once(&pool, &[]), 1);
    assert!(t.elapsed() < Duration::from_secs(2), "{:?}", t.elapsed());
    assert!(
        err.contains(&format!(
            "kept pool `{pool}` holds its limit of 2 tenants (`--tenants 2`)"
        )) && err.contains(&format!("(pid {pa}, since"))
            && err.contains(&format!("(pid {pb}, since"))
            && err.contains("start its keeper with more --tenants"),
        "{err}"
    );
    assert_eq!(
        status(&pool)["generation"],
        2,
        "a refusal counts no generation"
    );

    // The first tenant SIGKILLed: its lease alone ends, as died.
    kill_and_reap(&mut a[0]);
    until_status(&pool, 5, |st| tenants_of(st).len() == 1);
    let st = status(&pool);
    assert_eq!(tenants_of(&st)[0]["pids"], serde_json::json!([pb]), "{st}");
    assert_eq!(
        (&st["previous"]["how"], &st["previous"]["pid"]),
        (&Value::from("died"), &Value::from(pa))
    );
    assert_eq!(
        (&st["state"], &st["lease"]["pid"]),
        (&Value::from("leased"), &Value::from(pb))
    );
    // The survivor still works on the same bytes: nothing was cleared.
    assert_eq!(mem_read(pb, addr(&rb) + 100, 8), b"tenant-a");
    mem_write(pb, addr(&rb) + 200, b"tenant-b");
    // A new engine takes the freed place at once, on the same memory.
    let (mut c, rc) = lease(&pool, &[]);
    let pc = c[0].id();
    assert_eq!(rc["keeper"]["generation"], 3, "{rc}");
    assert_eq!(rc["keeper"]["previous"]["pid"], pa, "{rc}");
    assert_eq!(mem_read(pc, addr(&rc) + 200, 8), b"tenant-b");
    // The survivor releases cleanly; the newcomer goes on.
    stop(&mut b[0]);
    until_status(&pool, 5, |st| st["previous"]["pid"] == pb);
    let st = status(&pool);
    assert_eq!(st["previous"]["how"], "closed", "{st}");
    assert_eq!(tenants_of(&st)[0]["pids"], serde_json::json!([pc]), "{st}");
    mem_write(pc, addr(&rc) + 300, b"tenant-c");
    assert_eq!(mem_read(pc, addr(&rc) + 300, 8), b"tenant-c");
    // The last tenant gone, the pool is cleared before the next lease.
    stop(&mut c[0]);
    let (mut d, rd) = lease(&pool, &[]);
    assert_eq!(rd["keeper"]["generation"], 4, "{rd}");
    assert_eq!(mem_read(d[0].id(), addr(&rd) + 100, 8), [0; 8], "cleared");
    assert_eq!(mem_read(d[0].id(), addr(&rd) + 300, 8), [0; 8], "cleared");
    stop(&mut d[0]);
    stop(&mut k[0]);
    assert_clean(&tmpfs, "tenants gone");
}

/// `tenants = 2` in a keeper's config: a world of 2 ranks of one engine
/// (one tenant, both ranks its lease) and an engine without an id (another)
/// lease the pool at once; SIGTERM waits for both tenants' leases to end.
/// `tenants` out of range, or not a number, and `--tenants` without
/// `--name` are usage errors naming the range.
#[test]
fn a_keepers_config_sets_tenants_and_the_drain_waits_for_every_tenant() {
    let Some(tmpfs) = SmallTmpfs::mount_or_skip("config-tenants", 32) else {
        return;
    };
    let pool = name("config-tenants");
    let file = tmpfs.0.with_extension("toml");
    struct Remove(std::path::PathBuf);
    impl Drop for Remove {
        fn drop(&mut self) {
            let _ = std::fs::remove_file(&self.0);
        }
    }
    let _file = Remove(file.clone());
    let config = |tenants: &str| {
        format!(
            "[[pool]]\nname = \"{pool}\"\nsize = \"8MiB\"\nbacking = \"shm-segmented\"\ndir = \
             \"{}\"\ntenants = {tenants}\n",
            tmpfs.path()
        )
    };
    std::fs::write(&file, config("2")).unwrap();
    let mut k = Children(vec![
        bin()
            .args(["keep", "--json", "--config"])
            .arg(&file)
            .spawn_piped(),
    ]);
    let ready = read_json_line(&mut k[0]);
    assert_eq!(
        (&ready["name"], &ready["max_tenants"]),
        (&Value::from(pool.as_str()), &Value::from(2))
    );
    let engine_name = name("config-tenants-world");
    let mut world = Children(
        (0..2)
            .map(|r| {
                let r = r.to_string();
                engine(
                    &pool,
                    &["--shared", &engine_name, "--world", "2", "--rank", &r],
                    "",
                )
            })
            .collect(),
    );
    let reports: Vec<Value> = world.iter_mut().map(read_report).collect();
    for (r, report) in reports.iter().enumerate() {
        assert_eq!(
            report["keeper"]["generation"], 1,
            "rank {r}: one lease: {report}"
        );
    }
    let (mut anon, report) = lease(&pool, &[]);
    assert_eq!(
        report["keeper"]["generation"], 2,
        "a tenant of its own: {report}"
    );
    let st = status(&pool);
    let tenants = tenants_of(&st);
    assert_eq!(tenants.len(), 2, "{st}");
    assert_eq!(tenants[0]["engine"], engine_name.as_str(), "{st}");
    assert_eq!(
        tenants[0]["ranks"].as_array().map(Vec::len),
        Some(2),
        "{st}"
    );
    assert_eq!(tenants[1]["engine"], "", "{st}");
    // SIGTERM: the keeper drains, and goes on while either tenant holds.
    signal(&k[0], libc::SIGTERM);
    until_stopping(&pool);
    stop(&mut anon[0]);
    until_status(&pool, 5, |st| tenants_of(st).len() == 1);
    assert!(
        k[0].try_wait().unwrap().is_none(),
        "the world's lease is still in force"
    );
    for rank in world.iter_mut() {
        stop(rank);
    }
    exits_with(
        &mut k[0],
        0,
        Duration::from_secs(5),
        "the keeper ends with its last tenant",
    );
    assert_clean(&tmpfs, "drained");

    for (tenants, says) in [
        (
            "0",
            "tenants = 0 is out of range: a kept pool is leased to 1 to 64 engines at once",
        ),
        (
            "65",
            "tenants = 65 is out of range: a kept pool is leased to 1 to 64 engines",
        ),
        ("\"two\"", "`tenants` must be a whole number, not \"two\""),
    ] {
        std::fs::write(&file, config(tenants)).unwrap();
        assert_usage_error(bin().args(["keep", "--config"]).arg(&file), says);
    }
    for (args, says) in [
        (
            vec!["keep", "--name", "x", "--tenants", "0"],
            "tenants = 0 is out of range",
        ),
        (
            vec!["keep", "--name", "x", "--tenants", "65"],
            "1 to 64 engines",
        ),
        (vec!["keep", "--tenants", "2"], "--name"),
    ] {
        assert_usage_error(bin().args(&args), says);
    }
    assert_clean(&tmpfs, "nothing built for a bad config");
}
