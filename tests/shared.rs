//! File-backed and shared pools with real `hostpool` processes.
//!
//! Needs root and reserved 2 MiB huge pages for the hugetlbfs cases: under
//! `cargo xtask test` (HOSTPOOL_REQUIRE_HUGEPAGES=1) their absence fails the
//! test; elsewhere the test prints why it skips.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdout, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use rustix::process::{Pid, Signal, kill_process};
use serde_json::Value;

mod support;

use support::procs::Children as Ranks;
use support::procs::{
    HostpoolCommand, SmallTmpfs, addr, assert_truncate_refused, assert_usage_error, bin,
    exits_with, fails, fds_of, free_2m, hugetlbfs_2m, kill_and_reap, mem_read, mem_write, name,
    open_fd_of, read_report, resv_2m, root_or_skip, signal, size_sealed, stderr_of, succeeds,
    terminate, until, wait_stderr, wait_stopped, within,
};

const HUGE_2M: u64 = 2 << 20;

/// Tests that count free huge pages must not overlap: each holds this.
static HUGE_PAGES: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn huge_pages_lock() -> std::sync::MutexGuard<'static, ()> {
    HUGE_PAGES.lock().unwrap_or_else(|p| p.into_inner())
}

/// Files of pool `name` in `dir` and in /dev/shm (its control file).
/// Fails naming every file of pool `name` still in `dir` (and /dev/shm).
#[track_caller]
fn assert_no_pool_files(dir: &Path, name: &str, what: &str) {
    let left = pool_files(dir, name);
    assert!(left.is_empty(), "{what}: {left:?}");
}

fn pool_files(dir: &Path, name: &str) -> Vec<String> {
    let mut v = Vec::new();
    let mut dirs = vec![dir];
    if dir != Path::new("/dev/shm") {
        dirs.push(Path::new("/dev/shm"));
    }
    for d in dirs {
        for e in std::fs::read_dir(d).into_iter().flatten().flatten() {
            let f = e.file_name().to_string_lossy().into_owned();
            if f.contains(name) {
                v.push(e.path().display().to_string());
            }
        }
    }
    v
}

/// The control file of `pool`'s file rendezvous.
fn ctl_file(pool: &str) -> PathBuf {
    PathBuf::from(format!("/dev/shm/hostpool-{pool}.ctl"))
}

/// Bytes of `[addr, addr+len)` that process `pid` has in its page tables
/// (`Rss` for ordinary pages, `*_Hugetlb` for huge pages).
fn resident_in(pid: u32, addr: u64, len: u64) -> u64 {
    let smaps = std::fs::read_to_string(format!("/proc/{pid}/smaps")).unwrap();
    let mut total = 0;
    let mut inside = false;
    for line in smaps.lines() {
        if let Some((range, _)) = line.split_once(' ')
            && let Some((a, b)) = range.split_once('-')
            && let (Ok(a), Ok(b)) = (u64::from_str_radix(a, 16), u64::from_str_radix(b, 16))
        {
            inside = a >= addr && b <= addr + len;
            continue;
        }
        if inside {
            for field in ["Rss:", "Shared_Hugetlb:", "Private_Hugetlb:"] {
                if let Some(kb) = line.strip_prefix(field) {
                    total += kb
                        .trim()
                        .trim_end_matches(" kB")
                        .trim()
                        .parse::<u64>()
                        .unwrap()
                        * 1024;
                }
            }
        }
    }
    total
}

/// `hostpool alloc --config CFG --size SIZE`: a pool of the backing `cfg`
/// describes, for the caller to add a rank's flags to.
fn alloc(cfg: &TempFile, size: &str) -> Command {
    let mut c = bin();
    c.args(["alloc", "--config", cfg.path(), "--size", size]);
    c
}

/// Spawn `world` ranks of one shared pool with `--hold --json`, each rank
/// with the variables `env` lists for it (`(rank, name, value)`).
fn spawn_ranks(args: &[&str], pool: &str, world: u32, env: &[(u32, &str, &str)]) -> Ranks {
    Ranks(
        (0..world)
            .map(|r| {
                let mut c = bin();
                c.args(["alloc", "--hold", "--json"])
                    .rank(pool, world, r)
                    .args(["--attach-timeout", "20"])
                    .args(args);
                for (_, k, v) in env.iter().filter(|(rank, ..)| *rank == r) {
                    c.env(k, v);
                }
                c.spawn_piped()
            })
            .collect(),
    )
}

/// [`spawn_ranks`] without variables, once every rank holds the pool: the
/// ranks and their reports, in rank order.
fn held_ranks(args: &[&str], pool: &str, world: u32) -> (Ranks, Vec<Value>) {
    let mut ranks = spawn_ranks(args, pool, world, &[]);
    let reports = ranks.iter_mut().map(read_report).collect();
    (ranks, reports)
}

/// SIGTERM every rank at once; each must then exit 0 within `limit`.
#[track_caller]
fn release(ranks: &mut Ranks, limit: Duration) {
    for child in ranks.iter() {
        signal(child, libc::SIGTERM);
    }
    for (r, child) in ranks.iter_mut().enumerate() {
        exits_with(child, 0, limit, &format!("rank {r} after SIGTERM"));
    }
}

/// [`release`] held ranks (within 20 s), and require the pool's files in
/// /dev/shm to be gone.
#[track_caller]
fn release_held_ranks(ranks: &mut Ranks, pool: &str) {
    release(ranks, Duration::from_secs(20));
    assert!(pool_files(Path::new("/dev/shm"), pool).is_empty());
}

fn four_ranks_share_one_pool(args: &[&str], dir: &Path, tag: &str, huge: bool) {
    let pool = name(tag);
    let _serial = huge.then(huge_pages_lock);
    let free_before = free_2m();
    let (mut ranks, reports) = held_ranks(args, &pool, 4);

    let creators = reports
        .iter()
        .filter(|r| r["sharing"]["role"] == "creator")
        .count();
    assert_eq!(creators, 1, "exactly one creator: {reports:?}");
    for rep in &reports {
        let checks = rep["capacity"].as_array().unwrap();
        if rep["sharing"]["role"] == "creator" {
            assert!(!checks.is_empty(), "the creator ran the checks: {rep}");
            assert!(checks.iter().all(|c| c["verdict"] != "short"), "{rep}");
        } else {
            // Once the creator reserved the pages they look taken: a joiner
            // must not report the creator's checks re-run with a false short.
            assert!(
                checks.is_empty(),
                "a joiner lists no capacity checks: {rep}"
            );
        }
    }
    let mapped = reports[0]["mapped_bytes"].as_u64().unwrap();
    let mut covered = 0;
    for (r, rep) in reports.iter().enumerate() {
        assert_eq!(rep["sharing"]["rank"], r as u64);
        let shard = &rep["sharing"]["shard"];
        let (off, len) = (
            shard["offset"].as_u64().unwrap(),
            shard["len"].as_u64().unwrap(),
        );
        assert_eq!(off, covered, "shards are contiguous and in rank order");
        covered += len;
        assert_eq!(
            rep["prefault"]["bytes"], len,
            "rank {r} faulted only its shard"
        );
        let page = rep["page_size"].as_u64().unwrap();
        assert_eq!(off % page, 0, "shard boundaries on page boundaries");
        // Only this rank's shard is in its page tables.
        let res = resident_in(ranks[r].id(), addr(rep), mapped);
        assert_eq!(
            res, len,
            "rank {r} has {res} bytes resident, its shard is {len}"
        );
    }
    assert_eq!(covered, mapped, "shards cover the pool");
    assert_no_pool_files(dir, &pool, "files must be gone once all attached");

    // Every rank sees every rank's writes.
    for (r, rep) in reports.iter().enumerate() {
        let off = rep["sharing"]["shard"]["offset"].as_u64().unwrap() + 4096 + r as u64;
        mem_write(ranks[r].id(), addr(rep) + off, &[0xa0 + r as u8; 8]);
    }
    for (r, rep) in reports.iter().enumerate() {
        for (w, wrep) in reports.iter().enumerate() {
            let off = wrep["sharing"]["shard"]["offset"].as_u64().unwrap() + 4096 + w as u64;
            assert_eq!(
                mem_read(ranks[r].id(), addr(rep) + off, 8),
                vec![0xa0 + w as u8; 8],
                "rank {r} reading rank {w}'s write"
            );
        }
    }
    release(&mut ranks, Duration::from_secs(20));
    if huge {
        assert_eq!(free_2m(), free_before, "every huge page given back");
    }
    assert_no_pool_files(dir, &pool, "files left behind");
}

#[test]
fn four_ranks_share_a_hugetlbfs_pool_each_faulting_only_its_shard() {
    let Some(dir) = hugetlbfs_2m(64) else { return };
    let d = dir.to_str().unwrap();
    four_ranks_share_one_pool(
        &["--backing", "hugetlbfs", "--dir", d, "--size", "128MiB"],
        &dir,
        "huge4",
        true,
    );
}

/// The flags of a hugetlbfs pool of `size` in a memfd of `page` pages (no
/// mount).
fn memfd_pool<'a>(page: &'a str, size: &'a str) -> [&'a str; 6] {
    [
        "--backing",
        "hugetlbfs",
        "--page-size",
        page,
        "--size",
        size,
    ]
}

/// Free huge pages of `kib` KiB, from sysfs.
fn free_huge(kib: u64) -> u64 {
    std::fs::read_to_string(format!(
        "/sys/kernel/mm/hugepages/hugepages-{kib}kB/free_hugepages"
    ))
    .ok()
    .and_then(|s| s.trim().parse().ok())
    .unwrap_or(0)
}

#[test]
fn four_ranks_share_a_memfd_hugetlbfs_pool_without_a_mount() {
    // A pod with huge pages but no hugetlbfs volume: the creator's memfd
    // (MFD_HUGETLB) is passed to every rank over the socket.
    if hugetlbfs_2m(64).is_none() {
        return;
    }
    let args = memfd_pool("2MiB", "128MiB");
    four_ranks_share_one_pool(&args, Path::new("/dev/shm"), "memfd2m", true);
}

#[test]
fn two_ranks_share_a_memfd_pool_of_1gib_pages() {
    let _serial = huge_pages_lock();
    // Two pages: what `cargo xtask test` reserves (four were seldom free,
    // and the test always skipped).
    if !support::procs::free_1g_or_skip(2) {
        return;
    }
    let pool = name("memfd1g");
    let before = free_huge(1 << 20);
    let (mut ranks, reports) = held_ranks(&memfd_pool("1GiB", "2GiB"), &pool, 2);
    for (r, rep) in reports.iter().enumerate() {
        assert_eq!(rep["page_size"], 1u64 << 30, "rank {r}: {rep}");
        assert_eq!(
            rep["sharing"]["shard"]["len"],
            1u64 << 30,
            "rank {r}: {rep}"
        );
    }
    assert_eq!(free_huge(1 << 20), before - 2, "one pool of two pages");
    release(&mut ranks, Duration::from_secs(30));
    assert_eq!(free_huge(1 << 20), before, "every 1 GiB page given back");
    assert_no_pool_files(Path::new("/dev/shm"), &pool, "files left behind");
}

#[test]
fn a_memfd_pool_cannot_use_the_file_rendezvous() {
    let err = bin()
        .args(["plan", "--backing", "hugetlbfs", "--page-size", "2MiB"])
        .rank("memfd-file", 2, 0)
        .args(["--rendezvous", "file"])
        .fails(2);
    assert!(
        err.contains("rendezvous = \"socket\"") && err.contains("give dir"),
        "{err}"
    );
}

fn shm_config(segments: u32) -> TempFile {
    TempFile::new(
        &format!("shm{segments}.toml"),
        &format!("backing = \"shm-segmented\"\n[shm-segmented]\nsegments = {segments}\n"),
    )
}

#[test]
fn four_ranks_share_a_segmented_shm_pool_each_faulting_only_its_shard() {
    let cfg = shm_config(3);
    four_ranks_share_one_pool(
        &["--config", cfg.path(), "--size", "96MiB"],
        Path::new("/dev/shm"),
        "shm4",
        false,
    );
}

fn kill_one_rank_mid_prefault(args: &[&str], dir: &Path, tag: &str, huge: bool) {
    let pool = name(tag);
    let _serial = huge.then(huge_pages_lock);
    let free_before = free_2m();
    let at_barrier = ("HOSTPOOL_TEST_FAILPOINTS", "shared-before-barrier=stop");
    let mut ranks = spawn_ranks(
        args,
        &pool,
        4,
        &[
            (0, at_barrier.0, at_barrier.1),
            (1, at_barrier.0, at_barrier.1),
            (2, "HOSTPOOL_FAILPOINT_STALL_PREFAULT_MS", "60000"),
            (3, at_barrier.0, at_barrier.1),
        ],
    );
    // Rank 2 stalls as its prefault starts; the others reach the barrier,
    // where each stops itself until the test lets it in.
    for r in [0usize, 1, 3] {
        wait_stopped(ranks[r].id(), Duration::from_secs(20));
    }
    // Every other rank attached and mapped the pool, so the creator handed
    // it to all (rank 2 itself, when it creates): rank 2 mapped it too, and
    // nothing but its stalled prefault lies before its barrier.
    wait_all_mapped(&ranks, dir, "mid-prefault");
    assert!(
        ranks[2].try_wait().unwrap().is_none(),
        "rank 2 must still be mid-prefault"
    );
    for r in [0usize, 1, 3] {
        signal(&ranks[r], libc::SIGCONT);
    }
    kill_and_reap(&mut ranks[2]);
    for r in [0usize, 1, 3] {
        let what = format!("rank {r} must fail");
        let err = exits_with(&mut ranks[r], 1, Duration::from_secs(15), &what);
        assert!(err.contains("rank 2"), "rank {r} must name rank 2: {err}");
        assert!(!err.contains("panicked"), "{err}");
    }
    assert_no_pool_files(dir, &pool, "left behind");
    if huge {
        assert_eq!(free_2m(), free_before, "no huge page stays reserved");
    }
}

/// The creator stalls after creating and mapping its data files, before the
/// pool is ready (a failpoint), and is killed there with a joiner waiting:
/// the joiner fails naming it, and removes the files the creator made, so
/// nothing stays on disk or reserved.
fn kill_the_creator_before_ready(args: &[&str], dir: &Path, tag: &str, huge: bool) {
    let pool = name(tag);
    let _serial = huge.then(huge_pages_lock);
    let (free_before, resv_before) = (free_2m(), resv_2m());
    let start = |rank: u32, failpoints: &str| {
        bin()
            .args(["alloc", "--json"])
            .args(args)
            .rank(&pool, 2, rank)
            .args(["--attach-timeout", "30", "--rendezvous", "file"])
            .failpoints(failpoints)
            .spawn_piped()
    };
    let mut creator = Ranks(vec![start(0, "shared-before-ready=stall")]);
    until(
        20,
        || pool_files(dir, &pool).len() >= 2,
        || "the creator made its files".into(),
    );
    let mut joiner = Ranks(vec![start(1, "")]);
    // The joiner attaches (it claims its slot in the control file) and
    // waits for ready.
    until(
        20,
        || {
            assert!(matches!(joiner[0].try_wait(), Ok(None)), "the joiner waits");
            claimed_slot(joiner[0].id(), &pool)
        },
        || "the joiner never claimed its slot".into(),
    );
    kill_and_reap(&mut creator[0]);
    let err = exits_with(&mut joiner[0], 1, Duration::from_secs(10), "the joiner");
    assert!(err.contains("died before the pool was ready"), "{err}");
    assert_no_pool_files(dir, &pool, "left behind");
    if huge {
        assert_eq!(free_2m(), free_before, "no huge page stays taken");
        assert_eq!(resv_2m(), resv_before, "no huge page stays reserved");
    }
}

#[test]
fn a_creator_killed_before_the_pool_is_ready_leaves_no_hugetlbfs_file_or_reservation() {
    let Some(dir) = hugetlbfs_2m(16) else { return };
    kill_the_creator_before_ready(
        &["--dir", dir.to_str().unwrap(), "--size", "16MiB"],
        &dir,
        "ready-huge",
        true,
    );
}

#[test]
fn a_creator_killed_before_the_pool_is_ready_leaves_no_shm_file() {
    let cfg = shm_config(2);
    kill_the_creator_before_ready(
        &["--config", cfg.path(), "--size", "16MiB"],
        Path::new("/dev/shm"),
        "ready-shm",
        false,
    );
}

#[test]
fn sigkill_of_a_rank_mid_prefault_fails_its_hugetlbfs_peers_naming_it() {
    let Some(dir) = hugetlbfs_2m(64) else { return };
    let d = dir.to_str().unwrap();
    kill_one_rank_mid_prefault(
        &["--backing", "hugetlbfs", "--dir", d, "--size", "128MiB"],
        &dir,
        "hugekill",
        true,
    );
}

#[test]
fn sigkill_of_a_rank_mid_prefault_fails_its_shm_peers_naming_it() {
    let cfg = shm_config(2);
    kill_one_rank_mid_prefault(
        &["--config", cfg.path(), "--size", "64MiB"],
        Path::new("/dev/shm"),
        "shmkill",
        false,
    );
}

#[test]
fn a_pool_larger_than_the_free_huge_pages_fails_cleanly_without_sigbus() {
    let Some(dir) = hugetlbfs_2m(1) else { return };
    let _serial = huge_pages_lock();
    let free = free_2m();
    let size = format!("{}", (free + 16) * HUGE_2M);
    let d = dir.to_str().unwrap();
    for shared in [false, true] {
        let pool = name("toobig");
        let mut c = bin();
        c.args(["alloc", "--backing", "hugetlbfs", "--dir", d])
            .args(["--size", &size]);
        if shared {
            c.rank(&pool, 1, 0);
        }
        // Exit 1, not a signal.
        let err = c.fails(1);
        assert!(
            err.contains("cannot hold the pool") && err.contains("hugepages-2048kB/nr_hugepages"),
            "{err}"
        );
        assert!(err.contains("HugePages-"), "the Kubernetes remedy: {err}");
        assert_eq!(free_2m(), free, "nothing reserved afterwards");
        assert_no_pool_files(&dir, &pool, "files left behind");
    }
}

#[test]
fn joining_a_live_pool_with_another_size_is_a_clear_error() {
    let cfg = shm_config(1);
    let pool = name("mismatch");
    let mut creator = Ranks(vec![
        alloc(&cfg, "16MiB")
            .rank(&pool, 2, 0)
            .args(["--attach-timeout", "3", "--rendezvous", "file"])
            .spawn_piped(),
    ]);
    let ctl = ctl_file(&pool);
    until(10, || ctl.exists(), || format!("no {}", ctl.display()));
    let err = alloc(&cfg, "32MiB")
        .rank(&pool, 2, 1)
        .args(["--rendezvous", "file"])
        .fails(2);
    assert!(
        err.contains("was created for 2 ranks, 16 MiB") && err.contains("32 MiB"),
        "{err}"
    );
    let what = "the creator gives up after its attach timeout";
    let cerr = exits_with(&mut creator[0], 1, Duration::from_secs(15), what);
    assert!(cerr.contains("rank(s) 1 never attached"), "{cerr}");
    assert_no_pool_files(Path::new("/dev/shm"), &pool, "files left behind");
}

#[test]
fn stale_files_of_a_crashed_run_are_replaced_and_gc_removes_only_stale_ones() {
    let pool = name("stale");
    let stale_ctl = ctl_file(&pool);
    let stale_data = PathBuf::from(format!("/dev/shm/hostpool-{pool}.pool.0000"));
    for (p, bytes) in [(&stale_ctl, 100usize), (&stale_data, 1 << 20)] {
        std::fs::write(p, vec![7u8; bytes]).unwrap();
        std::fs::set_permissions(p, std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
    }
    let cfg = shm_config(1);
    let o = alloc(&cfg, "8MiB")
        .rank(&pool, 1, 0)
        .args(["--json", "--rendezvous", "file"])
        .output()
        .unwrap();
    succeeds(&o);
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("stale"),
        "the replacement is logged"
    );
    assert_no_pool_files(Path::new("/dev/shm"), &pool, "files left behind");

    // gc: a live pool (a rank waiting for its peer) is kept, a stale file goes.
    let live = name("live");
    let mut waiting = Ranks(vec![
        alloc(&cfg, "8MiB")
            .rank(&live, 2, 0)
            .args(["--attach-timeout", "30", "--rendezvous", "file"])
            .spawn_stderr(),
    ]);
    let live_ctl = ctl_file(&live);
    let live_files = || pool_files(Path::new("/dev/shm"), &live);
    until(
        10,
        || live_files().len() >= 2,
        || format!("{:?}", live_files()),
    );
    std::fs::write(&stale_data, vec![7u8; 4096]).unwrap();
    let r = bin().args(["gc", "--dir", "/dev/shm", "--json"]).succeeds();
    let removed: Vec<&str> = r["removed"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["path"].as_str().unwrap())
        .collect();
    assert!(removed.contains(&stale_data.to_str().unwrap()), "{r}");
    assert!(live_ctl.exists(), "gc must never touch a live pool: {r}");
    assert_eq!(live_files().len(), 2, "live control and data files stay");
    // Once its process is killed, the live pool's files are stale too.
    kill_and_reap(&mut waiting[0]);
    let gc = bin().args(["gc", "--dir", "/dev/shm"]).output().unwrap();
    assert_eq!(gc.status.code(), Some(0));
    assert!(
        live_files().is_empty(),
        "{}",
        String::from_utf8_lossy(&gc.stdout)
    );
}

#[test]
fn wrong_dirs_and_page_sizes_are_clear_usage_errors() {
    // `hostpool alloc --size 4MiB ARGS` is a usage error that says `says`.
    let refused = |args: &[&str], says: &str| {
        assert_usage_error(bin().args(["alloc", "--size", "4MiB"]).args(args), says);
    };
    let in_shm = ["--backing", "hugetlbfs", "--dir", "/dev/shm"];
    refused(&in_shm, "is not a hugetlbfs mount");
    let in_proc = ["--backing", "auto", "--dir", "/proc"];
    refused(&in_proc, "neither hugetlbfs nor tmpfs");
    refused(&["--numa-node", "63"], "NUMA node 63 does not exist");
    let Some(dir) = hugetlbfs_2m(2) else { return };
    let _serial = huge_pages_lock();
    let d = dir.to_str().unwrap();
    let of_1g = ["--backing", "hugetlbfs", "--dir", d, "--page-size", "1GiB"];
    refused(&of_1g, "does not match the 2 MiB pages");
    let p = ok_json(bin().args(["plan", "--dir", d, "--size", "4MiB", "--json"]));
    assert_eq!(
        p["backing"], "hugetlbfs",
        "auto picks hugetlbfs for a hugetlbfs dir"
    );
    assert_eq!(p["page_size"], HUGE_2M);
    let on_node_0 = ["--numa-node", "0", "--json"];
    let r = ok_json(
        bin()
            .args(["alloc", "--dir", d, "--size", "4MiB"])
            .args(on_node_0),
    );
    assert_eq!(r["numa"]["node"], 0);
    assert_eq!(r["numa"]["on_node"], r["numa"]["sampled"]);
}

#[test]
fn a_shared_pool_pinned_whole_attaches_to_its_peers_pages_first() {
    let cfg = shm_config(2);
    let pool = name("attach");
    let args = [
        "--config",
        cfg.path(),
        "--size",
        "64MiB",
        "--pin",
        "mlock",
        "--pin-required",
    ];
    let (mut ranks, reports) = held_ranks(&args, &pool, 2);
    for (r, rep) in reports.iter().enumerate() {
        assert_eq!(rep["pin"]["status"], "pinned", "{rep}");
        assert!(
            rep["phases"]["attach"].is_f64(),
            "rank {r} attaches before pinning: {}",
            rep["phases"]
        );
        let mapped = rep["mapped_bytes"].as_u64().unwrap();
        assert_eq!(
            rep["prefault"]["bytes"],
            mapped / 2,
            "it still faults only its shard"
        );
        assert_eq!(
            resident_in(ranks[r].id(), addr(rep), mapped),
            mapped,
            "rank {r} maps the whole pool"
        );
    }
    release_held_ranks(&mut ranks, &pool);
}

/// The creator stalls right after the barrier (a failpoint) and is killed
/// there, before it could unlink anything: the joiners unlink by inode
/// themselves, so nothing is left once they exit, whoever died.
#[test]
fn a_creator_killed_after_the_barrier_leaves_no_file_behind() {
    let cfg = shm_config(2);
    let pool = name("after-barrier");
    let start = |rank: u32, failpoints: &str| {
        alloc(&cfg, "8MiB")
            .arg("--json")
            .rank(&pool, 2, rank)
            .args(["--attach-timeout", "20", "--rendezvous", "file"])
            .failpoints(failpoints)
            .spawn_piped()
    };
    // Rank 0 is the creator: the joiner starts once its control file exists.
    let mut creator = Ranks(vec![start(0, "shared-after-barrier=stall")]);
    let ctl = ctl_file(&pool);
    until(
        20,
        || ctl.exists(),
        || "the creator made its control file".into(),
    );
    let report = succeeds(&start(1, "").wait_with_output().unwrap());
    assert_eq!(report["sharing"]["role"], "joiner", "{report}");
    // The creator passed the barrier and stalls before unlinking: kill it.
    assert!(
        matches!(creator[0].try_wait(), Ok(None)),
        "the creator is stalled"
    );
    kill_and_reap(&mut creator[0]);
    assert_no_pool_files(
        Path::new("/dev/shm"),
        &pool,
        "files left after the creator died past the barrier",
    );
}

/// `--shared` without `--dir` once built a private anonymous pool per rank,
/// silently (exit 0, no `sharing`, no barrier). Now `auto` gives the ranks
/// segmented files in /dev/shm that they share, and `--backing anon` with
/// `--shared` is a usage error that says what to do.
#[test]
fn shared_without_a_dir_is_really_shared_and_anon_refuses_sharing() {
    let pool = name("nodir");
    let (mut ranks, reports) = held_ranks(&["--size", "8MiB"], &pool, 2);
    for rep in &reports {
        assert_eq!(rep["backing"], "shm-segmented", "{rep}");
        assert_eq!(rep["sharing"]["name"], pool.as_str(), "{rep}");
    }
    mem_write(ranks[0].id(), addr(&reports[0]) + 4096, b"shared!!");
    assert_eq!(
        mem_read(ranks[1].id(), addr(&reports[1]) + 4096, 8),
        b"shared!!"
    );
    release_held_ranks(&mut ranks, &pool);

    let err = bin()
        .args(["alloc", "--backing", "anon", "--size", "8MiB"])
        .rank(&pool, 2, 0)
        .fails(2);
    assert!(
        err.contains("backing anon cannot be shared") && err.contains("/dev/shm"),
        "{err}"
    );
    assert_no_pool_files(Path::new("/dev/shm"), &pool, "files left behind");
}

/// `pool`'s socket name, as `/proc/net/unix` lists it.
fn socket_name(pool: &str) -> String {
    format!("@hostpool/{}/{pool}", rustix::process::geteuid().as_raw())
}

/// The lines of `/proc/net/unix` of `pool`'s socket name: the listener
/// and a socket per connection to it.
fn socket_lines(pool: &str) -> Vec<String> {
    let socket = socket_name(pool);
    std::fs::read_to_string("/proc/net/unix")
        .unwrap()
        .lines()
        .filter(|l| l.ends_with(&socket))
        .map(str::to_string)
        .collect()
}

/// Wait until some rank of `pool` has bound its socket name (the socket
/// rendezvous): from then on that rank is the creator.
#[track_caller]
fn wait_until_bound(pool: &str) {
    until(
        20,
        || !socket_lines(pool).is_empty(),
        || format!("no rank bound {}", socket_name(pool)),
    );
}

/// Wait (at most 20 s) until `joiners` ranks have connected to `pool`'s
/// socket: `/proc/net/unix` lists, with the socket's name, one socket per
/// connection the creator accepted or has in its backlog, besides the
/// listener (flags `00010000`, gone once every rank attached).
#[track_caller]
fn wait_connected(pool: &str, joiners: usize) {
    let connected = || {
        socket_lines(pool)
            .iter()
            .filter(|l| l.split_whitespace().nth(3) != Some("00010000"))
            .count()
    };
    until(
        20,
        || connected() >= joiners,
        || {
            format!(
                "{}: {} of {joiners} joiners connected",
                socket_name(pool),
                connected()
            )
        },
    );
}

/// Whether process `pid` maps a pool's file in `dir` shared and writable
/// (a `rw-s` line of `/proc/PID/maps`): a creator once it made and mapped
/// the pool, a joiner once it mapped what the creator handed it.
fn maps_pool_in(pid: u32, dir: &Path) -> bool {
    let dir = dir.canonicalize().unwrap_or_else(|_| dir.to_path_buf());
    let Ok(maps) = std::fs::read_to_string(format!("/proc/{pid}/maps")) else {
        return false;
    };
    maps.lines().any(|l| {
        let mut fields = l.split_whitespace();
        fields.nth(1) == Some("rw-s")
            && fields
                .nth(3)
                .is_some_and(|p| Path::new(p).starts_with(&dir))
    })
}

/// Wait (at most 20 s) until every rank maps the pool's files in `dir`:
/// every joiner has attached, so the creator, which hands the pool to every
/// rank before its own map step ends, is past it too. A rank that stalls as
/// its prefault starts is then in that stall (or on its way: nothing but
/// the prefault lies between its map and its barrier).
#[track_caller]
fn wait_all_mapped(ranks: &Ranks, dir: &Path, what: &str) {
    let unmapped = || -> Vec<usize> {
        (0..ranks.len())
            .filter(|r| !maps_pool_in(ranks[*r].id(), dir))
            .collect()
    };
    until(
        20,
        || unmapped().is_empty(),
        || {
            format!(
                "{what}: rank(s) {:?} never mapped the pool in {}",
                unmapped(),
                dir.display()
            )
        },
    );
}

/// Whether process `pid` holds an OFD lock through its descriptor of
/// `pool`'s control file (`/proc/PID/fdinfo`): a rank of the file
/// rendezvous that claimed its slot (its rank's byte), so the creator and
/// every later rank count it as attached.
fn claimed_slot(pid: u32, pool: &str) -> bool {
    let ctl = format!("hostpool-{pool}.ctl");
    let Ok(fds) = std::fs::read_dir(format!("/proc/{pid}/fd")) else {
        return false;
    };
    fds.flatten().any(|e| {
        std::fs::read_link(e.path()).is_ok_and(|l| l.file_name() == Some(ctl.as_ref()))
            && std::fs::read_to_string(format!(
                "/proc/{pid}/fdinfo/{}",
                e.file_name().to_string_lossy()
            ))
            .is_ok_and(|info| info.lines().any(|l| l.contains("OFDLCK")))
    })
}

/// SIGKILL a stopped process (and SIGCONT it, for good measure) and reap it.
fn kill_stopped(child: &mut Child) {
    signal(child, libc::SIGKILL);
    signal(child, libc::SIGCONT);
    let _ = child.wait();
}

/// A peer that attached and then stopped (SIGSTOP) once hung the others
/// forever: the barrier now has a deadline that names it and says it is
/// stopped, whether the stopped rank is a joiner or the creator.
#[test]
fn a_stopped_peer_fails_the_others_by_the_barrier_deadline() {
    let cfg = shm_config(2);
    for stopped_creates in [false, true] {
        let pool = name(&format!("stopped-{stopped_creates}"));
        let what = if stopped_creates { "creator" } else { "joiner" };
        let spawn = |rank: u32| {
            let mut c = alloc(&cfg, "64MiB");
            c.arg("--json").rank(&pool, 2, rank).args([
                "--barrier-timeout",
                "2",
                "--attach-timeout",
                "20",
            ]);
            if rank == 1 {
                c.env("HOSTPOOL_FAILPOINT_STALL_PREFAULT_MS", "60000");
            }
            c.spawn_stderr()
        };
        // The rank started first, once it has bound the name, creates.
        let first = u32::from(stopped_creates);
        let mut ranks = Ranks(vec![spawn(first)]);
        wait_until_bound(&pool);
        ranks.push(spawn(1 - first));
        if stopped_creates {
            ranks.swap(0, 1);
        }
        // Rank 1 stalls as its prefault starts, once both have the pool;
        // stop it there for good measure.
        wait_all_mapped(&ranks, Path::new("/dev/shm"), what);
        signal(&ranks[1], libc::SIGSTOP);
        let t = Instant::now();
        let err = exits_with(&mut ranks[0], 1, Duration::from_secs(20), what);
        assert!(
            err.contains("rank 1") && err.contains("did not reach the barrier within 2 s"),
            "{what}: {err}"
        );
        let pid = ranks[1].id();
        assert!(
            err.contains(&format!(
                "it is stopped (SIGSTOP, or a debugger): `kill -CONT {pid}`"
            )),
            "{what}: the message says the peer is stopped: {err}"
        );
        assert!(
            t.elapsed() < Duration::from_secs(10),
            "{what}: by the deadline: {:?}",
            t.elapsed()
        );
        kill_stopped(&mut ranks[1]);
        assert_no_pool_files(Path::new("/dev/shm"), &pool, "files left behind");
    }
}

/// A joiner whose creator stopped (SIGSTOP) while handing over the pool
/// fails at its attach timeout saying the creator is stopped and how to
/// resume it, not only that it is "still creating" the pool.
#[test]
fn a_joiner_of_a_stopped_creator_says_it_is_stopped() {
    let pool = name("stopped-creator");
    let mut ranks = Ranks(vec![
        bin()
            .args(["alloc", "--size", "16MiB"])
            .rank(&pool, 2, 0)
            .failpoints("shared-passing-fds=stop")
            .spawn_stderr(),
    ]);
    // Rank 0 is the creator once it has bound the pool's socket name.
    wait_until_bound(&pool);
    ranks.push(
        bin()
            .args(["alloc", "--size", "16MiB", "--attach-timeout", "2"])
            .rank(&pool, 2, 1)
            .spawn_stderr(),
    );
    // The creator stops itself (SIGSTOP) as it hands the files over.
    wait_stopped(ranks[0].id(), Duration::from_secs(20));
    let err = exits_with(&mut ranks[1], 1, Duration::from_secs(20), "the joiner");
    let pid = ranks[0].id();
    assert!(
        err.contains("was not ready after 2 s")
            && err.contains(&format!("`kill -CONT {pid}` resumes it")),
        "{err}"
    );
    kill_stopped(&mut ranks[0]);
}

/// A rank waiting for a peer that never comes ends within a second of
/// SIGTERM (exit 143), `--hold` or not, tearing down what it built and
/// leaving nothing answering on its socket; SIGHUP and SIGQUIT too. A held
/// pool released by SIGHUP exits 0.
#[test]
fn signals_end_a_rank_waiting_for_a_missing_peer_within_a_second() {
    let cfg = shm_config(2);
    for (sig, code, hold) in [
        (libc::SIGTERM, 143, true),
        (libc::SIGINT, 130, false),
        (libc::SIGHUP, 129, true),
        (libc::SIGQUIT, 131, false),
    ] {
        let pool = name(&format!("signal{sig}"));
        let mut c = alloc(&cfg, "16MiB");
        c.rank(&pool, 2, 0).args(["--attach-timeout", "60"]);
        if hold {
            c.arg("--hold");
        }
        let mut alone = Ranks(vec![c.spawn_piped()]);
        // It creates the pool (it holds the socket name and maps the
        // pool's files) and waits for rank 1.
        wait_until_bound(&pool);
        until(
            20,
            || maps_pool_in(alone[0].id(), Path::new("/dev/shm")),
            || format!("signal {sig}: it never mapped the pool"),
        );
        assert!(
            matches!(alone[0].try_wait(), Ok(None)),
            "it waits for rank 1"
        );
        let t = Instant::now();
        signal(&alone[0], sig);
        let what = format!("signal {sig}");
        let err = exits_with(&mut alone[0], code, Duration::from_secs(5), &what);
        assert!(
            t.elapsed() < Duration::from_secs(1),
            "signal {sig}: took {:?}",
            t.elapsed()
        );
        assert!(err.contains("interrupted by signal"), "{err}");
        assert_no_pool_files(Path::new("/dev/shm"), &pool, "signal {sig}");
        // Stopped on purpose: no helper keeps refusing the ranks of a
        // restart with this run's cause.
        assert!(
            refusal_helpers(&pool).is_empty() && unbound_soon(&pool),
            "signal {sig}: the stopped creator left its socket answering"
        );
    }
    // A held, ready pool released by SIGHUP tears down and exits 0.
    let pool = name("hup-held");
    let mut one = Ranks(vec![
        alloc(&cfg, "16MiB")
            .args(["--hold", "--json"])
            .rank(&pool, 1, 0)
            .spawn_piped(),
    ]);
    let _ = read_report(&mut one[0]);
    signal(&one[0], libc::SIGHUP);
    exits_with(&mut one[0], 0, Duration::from_secs(5), "after SIGHUP");
}

/// The socket rendezvous refuses a joiner that asks for another size (exit
/// 2, naming both sizes); the creator then names the rank that never came.
#[test]
fn socket_rendezvous_refuses_a_joiner_of_another_size() {
    let cfg = shm_config(1);
    let pool = name("sock-mismatch");
    let start = |size: &str, rank: &str| {
        alloc(&cfg, size)
            .rank(&pool, 2, rank)
            .args(["--attach-timeout", "3"])
            .spawn_piped()
    };
    let mut creator = Ranks(vec![start("16MiB", "0")]);
    // Rank 0 creates once it holds the socket name.
    wait_until_bound(&pool);
    let err = fails(&start("32MiB", "1").wait_with_output().unwrap(), 2);
    assert!(
        err.contains("asks for a pool of 32 MiB")
            && err.contains("16 MiB")
            && err.contains("same size"),
        "{err}"
    );
    let cerr = exits_with(&mut creator[0], 1, Duration::from_secs(15), "the creator");
    assert!(cerr.contains("rank(s) 1 never attached"), "{cerr}");
}

/// The variable that makes [`socket_helper`] act (this test binary run as
/// another user): `connect NAME` or `bind NAME`.
const HELPER: &str = "HOSTPOOL_TEST_SOCKET_HELPER";

/// Not a test of its own: the other user's process of the socket tests,
/// this binary re-run as uid 65534 with [`HELPER`] set.
#[test]
fn socket_helper() {
    let Ok(spec) = std::env::var(HELPER) else {
        return;
    };
    use rustix::net::{AddressFamily, SocketAddrUnix, SocketType};
    let (mode, name) = spec.split_once(' ').unwrap();
    let addr = SocketAddrUnix::new_abstract_name(name.as_bytes()).unwrap();
    let sock = rustix::net::socket(AddressFamily::UNIX, SocketType::SEQPACKET, None).unwrap();
    if mode == "bind" {
        rustix::net::bind(&sock, &addr).unwrap();
        rustix::net::listen(&sock, 4).unwrap();
        println!("helper: ready");
        std::thread::sleep(Duration::from_secs(30));
    } else {
        rustix::net::connect(&sock, &addr).unwrap();
        let mut buf = vec![0u8; 65536];
        let n = rustix::io::read(&sock, &mut buf).unwrap();
        println!("helper: {}", String::from_utf8_lossy(&buf[..n]));
    }
}

/// This test binary as uid 65534 (nobody), acting as [`socket_helper`].
fn as_nobody(mode: &str, name: &str) -> Child {
    Command::new("setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups"])
        .arg(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "socket_helper",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(HELPER, format!("{mode} {name}"))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("setpriv")
}

/// The line the helper printed, without its prefix.
fn helper_line(child: &mut Child) -> String {
    let reader = BufReader::new(child.stdout.as_mut().unwrap());
    reader
        .lines()
        .map_while(|l| l.ok())
        .find_map(|l| l.split_once("helper: ").map(|(_, said)| said.to_string()))
        .unwrap_or_default()
}

/// A process of another user that connects to a pool's socket is refused
/// and never gets the pool's memory; the real ranks still meet.
#[test]
fn socket_rendezvous_refuses_another_users_process() {
    if !root_or_skip("needs root to run a process as another user") {
        return;
    }
    let cfg = shm_config(1);
    let pool = name("sock-uid");
    let uid = rustix::process::geteuid().as_raw();
    let mut ranks = Ranks(Vec::new());
    let start = |rank: &str| {
        alloc(&cfg, "8MiB")
            .arg("--json")
            .rank(&pool, 2, rank)
            .args(["--attach-timeout", "20"])
            .spawn_piped()
    };
    ranks.push(start("0"));
    // Rank 0 creates once it holds the socket name.
    wait_until_bound(&pool);
    let mut intruder = as_nobody("connect", &format!("hostpool/{uid}/{pool}"));
    let said = helper_line(&mut intruder);
    let _ = intruder.wait();
    assert!(
        said.contains("Refused") && said.contains("not 65534"),
        "{said}"
    );
    ranks.push(start("1"));
    for (r, child) in ranks.iter_mut().enumerate() {
        let what = format!("rank {r}: the ranks meet");
        exits_with(child, 0, Duration::from_secs(20), &what);
    }
}

/// Another user's process that holds the pool's socket name first makes the
/// pool fail with a message naming it, rather than hand the ranks its memory.
#[test]
fn socket_rendezvous_refuses_a_name_held_by_another_user() {
    if !root_or_skip("needs root to run a process as another user") {
        return;
    }
    let pool = name("sock-squat");
    let uid = rustix::process::geteuid().as_raw();
    let mut squatter = Ranks(vec![as_nobody("bind", &format!("hostpool/{uid}/{pool}"))]);
    assert_eq!(helper_line(&mut squatter[0]), "ready");
    let cfg = shm_config(1);
    let err = alloc(&cfg, "8MiB")
        .rank(&pool, 2, 0)
        .args(["--attach-timeout", "5"])
        .fails(1);
    assert!(
        err.contains(&format!("held by pid {}", squatter[0].id())) && err.contains("uid 65534"),
        "{err}"
    );
}

/// One step of a shared pool's setup where a rank can die, and how the
/// victim is stopped there.
struct Step {
    name: &'static str,
    env: (&'static str, &'static str),
    /// Whether the barrier has passed: the survivors then succeed.
    after_barrier: bool,
}

impl Step {
    /// The victim stalls at failpoint `spec` (`name=stall`).
    const fn failpoint(name: &'static str, spec: &'static str, after_barrier: bool) -> Step {
        Step {
            name,
            env: ("HOSTPOOL_TEST_FAILPOINTS", spec),
            after_barrier,
        }
    }
}

const STEPS: [Step; 5] = [
    Step::failpoint("before connect", "shared-before-connect=stall", false),
    Step::failpoint("passing descriptors", "shared-passing-fds=stall", false),
    Step {
        name: "mid-prefault",
        env: ("HOSTPOOL_FAILPOINT_STALL_PREFAULT_MS", "60000"),
        after_barrier: false,
    },
    Step::failpoint("at the barrier", "shared-before-barrier=stall", false),
    Step::failpoint("after the barrier", "shared-after-barrier=stall", true),
];

/// Whether a survivor's error names the dead rank: by number, among the
/// ranks that never attached, or as the pool's creator by pid (the first rank
/// to bind the socket creates the pool, whichever it is, and a joiner that
/// lost it before the welcome knows it by pid only).
fn names_rank(err: &str, rank: impl std::fmt::Display, pid: u32) -> bool {
    let rank = rank.to_string();
    let listed = err.split("rank(s) ").skip(1).any(|rest| {
        rest.split(" never attached")
            .next()
            .is_some_and(|list| list.split(", ").any(|r| r == rank))
    });
    err.contains(&format!("rank {rank}"))
        || listed
        || (err.contains("creator") && err.contains(&format!("pid {pid}")))
}

/// Wait (at most 10 s) for every rank but `victim` to exit, watching them
/// all at once: each one's exit status and when it exited, counted from
/// `since` (so a rank that exited at once is not charged with the time an
/// earlier one took). Panics naming a rank that hangs.
fn exits(
    ranks: &mut Ranks,
    victim: usize,
    since: Instant,
    what: &str,
) -> Vec<Option<(ExitStatus, Duration)>> {
    let mut out: Vec<Option<(ExitStatus, Duration)>> = vec![None; ranks.len()];
    let end = Instant::now() + Duration::from_secs(10);
    loop {
        let mut waiting = false;
        for (r, c) in ranks.iter_mut().enumerate() {
            if r == victim || out[r].is_some() {
                continue;
            }
            match c.try_wait().unwrap() {
                Some(st) => out[r] = Some((st, since.elapsed())),
                None => waiting = true,
            }
        }
        if !waiting {
            return out;
        }
        assert!(Instant::now() < end, "{what}: a rank hung: {out:?}");
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// How a survivor of a rank's death ended.
struct Survivor {
    rank: usize,
    status: ExitStatus,
    /// From the death to its exit.
    took: Duration,
    err: String,
}

/// SIGKILL rank `victim` and wait (see [`exits`]) for the others: the
/// victim's pid and how each survivor ended, none of them with a panic.
fn kill_and_watch(ranks: &mut Ranks, victim: usize, what: &str) -> (u32, Vec<Survivor>) {
    signal(&ranks[victim], libc::SIGKILL);
    let killed = Instant::now();
    let victim_pid = ranks[victim].id();
    let _ = ranks[victim].wait();
    let ended = exits(ranks, victim, killed, what);
    let survivors = (0..ranks.len())
        .filter(|r| *r != victim)
        .map(|rank| {
            let (status, took) = ended[rank].expect("every survivor exited");
            let err = stderr_of(&mut ranks[rank]);
            assert!(!err.contains("panicked"), "{what}: {err}");
            Survivor {
                rank,
                status,
                took,
                err,
            }
        })
        .collect();
    (victim_pid, survivors)
}

/// Start the four ranks of `pool` (rank 0 first, so it is the creator unless
/// it stalls before connecting), `victim` with `env`.
fn start_four(args: &[&str], pool: &str, victim: Option<(u32, (&str, &str))>) -> Ranks {
    let mut ranks = Ranks(Vec::new());
    for r in 0..4u32 {
        let mut c = bin();
        c.args(["alloc", "--json"])
            .args(args)
            .rank(pool, 4, r)
            .args(["--attach-timeout", "3"]);
        if let Some((v, (k, val))) = victim
            && v == r
        {
            c.env(k, val);
        }
        ranks.push(c.spawn_piped());
        let stalls_before_connect =
            victim.is_some_and(|(v, (_, val))| v == 0 && val.starts_with("shared-before-connect"));
        if r == 0 && !stalls_before_connect {
            // Rank 0 creates once it holds the socket name.
            wait_until_bound(pool);
        }
    }
    ranks
}

/// The same four ranks again, with no failpoint: they must all succeed at
/// once, without `gc`.
fn restart_four(args: &[&str], pool: &str, what: &str) {
    let mut again = start_four(args, pool, None);
    for (r, child) in again.iter_mut().enumerate() {
        let what = format!("{what}, restart: rank {r}");
        exits_with(child, 0, Duration::from_secs(20), &what);
    }
}

/// The fault matrix: world 4, each rank (the creator included) SIGKILLed at
/// each step. Survivors exit 1 naming the dead rank within a second of its
/// death (a rank that never connected can only be named at the attach
/// timeout), or 0 once the barrier has passed; nothing panics; nothing is
/// left in any directory and no huge page stays taken; and a new pool of
/// the same name and size starts at once, without `gc`, where there is room
/// for exactly one.
fn fault_matrix(args: &[&str], dir: &Path, tag: &str, huge: bool) {
    let _serial = huge.then(huge_pages_lock);
    let (free_before, resv_before) = (free_2m(), resv_2m());
    for step in &STEPS {
        for victim in 0..4u32 {
            let pool = name(&format!("{tag}-{}-{victim}", step.name.replace(' ', "-")));
            let what = format!("{} of rank {victim}", step.name);
            let mut ranks = start_four(args, &pool, Some((victim, step.env)));
            let v = victim as usize;
            // The victim is at its step: a failpoint says so as it stalls
            // there; the prefault's stall has begun once every rank has the
            // pool.
            if step.env.0 == "HOSTPOOL_TEST_FAILPOINTS" {
                wait_stderr(
                    &mut ranks[v],
                    "stalling until killed",
                    Duration::from_secs(20),
                );
            } else {
                wait_all_mapped(&ranks, dir, &what);
            }
            // A creator stalls handing the pool to the first joiner it
            // accepts: the others must have connected too before it dies, or
            // they find no creator and wait out their attach timeout (at the
            // other steps every rank has, the creator having waited for all).
            if step.name == "passing descriptors" {
                wait_connected(&pool, 3);
            }
            assert!(
                matches!(ranks[v].try_wait(), Ok(None)),
                "{what}: the victim stalls"
            );
            let (victim_pid, survivors) = kill_and_watch(&mut ranks, v, &what);
            for Survivor {
                rank: r,
                status,
                took,
                err,
            } in survivors
            {
                if step.after_barrier {
                    assert_eq!(status.code(), Some(0), "{what}: rank {r}: {err}");
                    continue;
                }
                assert_eq!(status.code(), Some(1), "{what}: rank {r} must fail: {err}");
                assert!(
                    names_rank(&err, victim, victim_pid),
                    "{what}: rank {r} must name rank {victim}: {err}"
                );
                let limit = if step.name == "before connect" {
                    Duration::from_secs(5)
                } else {
                    Duration::from_secs(1)
                };
                assert!(
                    took < limit,
                    "{what}: rank {r} took {took:?} after the death"
                );
            }
            assert_no_pool_files(dir, &pool, "{what}: left");
            if huge {
                assert_eq!(free_2m(), free_before, "{what}: every huge page given back");
                assert_eq!(resv_2m(), resv_before, "{what}: no huge page reserved");
            }
            // The same pool again, at once.
            restart_four(args, &pool, &what);
        }
    }
}

/// The flags of a 16 MiB pool of segmented files in `dir`.
fn shm_in(dir: &str) -> [&str; 6] {
    [
        "--backing",
        "shm-segmented",
        "--dir",
        dir,
        "--size",
        "16MiB",
    ]
}

#[test]
fn fault_matrix_on_a_small_tmpfs_with_room_for_one_pool() {
    let Some(small) = SmallTmpfs::mount_or_skip("matrix", 20) else {
        return;
    };
    fault_matrix(&shm_in(small.path()), &small.0, "mx-shm", false);
    assert_eq!(small.used(), 0, "the tmpfs is empty again");
}

/// The randomized fault test: 50 runs of a world-4 pool, a random rank
/// SIGKILLed after a random delay. Whatever dies when, survivors either
/// succeed (the barrier had passed) or fail naming the dead rank, nothing
/// panics, nothing is left, and the pool restarts at once.
#[test]
fn randomly_killed_ranks_never_leave_anything_behind() {
    let Some(small) = SmallTmpfs::mount_or_skip("random", 20) else {
        return;
    };
    let args = shm_in(small.path());
    // xorshift64: the same runs every time, so a failure reproduces.
    let mut state = 0x9e37_79b9_7f4a_7c15u64;
    let mut next = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    for run in 0..50 {
        let pool = name(&format!("random-{run}"));
        let victim = (next() % 4) as usize;
        let delay = Duration::from_millis(next() % 400);
        let what = format!("run {run}: rank {victim} killed after {delay:?}");
        let mut ranks = start_four(&args, &pool, None);
        std::thread::sleep(delay);
        let (victim_pid, survivors) = kill_and_watch(&mut ranks, victim, &what);
        for Survivor {
            rank: r,
            status,
            took,
            err,
        } in survivors
        {
            match status.code() {
                Some(0) => {}
                Some(1) => {
                    assert!(
                        names_rank(&err, victim, victim_pid),
                        "{what}: rank {r} must name rank {victim}: {err}"
                    );
                    let never_came = err.contains("never attached");
                    let limit = Duration::from_secs(if never_came { 5 } else { 1 });
                    assert!(took < limit, "{what}: rank {r} took {took:?}: {err}");
                }
                other => panic!("{what}: rank {r} ended with {other:?}: {err}"),
            }
        }
        assert_no_pool_files(&small.0, &pool, "{what}");
        assert_eq!(
            small.used(),
            0,
            "{what}: the tmpfs holds pages after every rank exited"
        );
        restart_four(&args, &pool, &what);
    }
}

/// A rank that knows the cause of a failure exits at once: the creator whose
/// capacity check fails does not wait out the attach timeout for ranks that
/// have not come, and a rank that comes later learns the cause.
#[test]
fn a_creator_that_knows_the_cause_exits_at_once() {
    let Some(small) = SmallTmpfs::mount_or_skip("cause", 8) else {
        return;
    };
    let pool = name("cause");
    // Two ranks never come: the creator's helper would answer for them
    // until the attach timeout.
    let _helpers = Helpers(vec![&pool]);
    let start = |rank: &str| {
        bin()
            .arg("alloc")
            .args(shm_in(small.path()))
            .rank(&pool, 3, rank)
            .args(["--attach-timeout", "30"])
            .spawn_piped()
    };
    let t = Instant::now();
    let mut first = Ranks(vec![start("0")]);
    let err = exits_with(&mut first[0], 1, Duration::from_secs(10), "the creator");
    assert!(err.contains("cannot hold the pool"), "{err}");
    assert!(
        t.elapsed() < Duration::from_secs(3),
        "not the attach timeout: {:?}",
        t.elapsed()
    );
    let mut later = Ranks(vec![start("1")]);
    let err = exits_with(&mut later[0], 1, Duration::from_secs(10), "a later rank");
    assert!(err.contains("cannot hold the pool"), "{err}");
}

/// Pids of the `hostpool serve-refusal` helpers of `pool`: the processes
/// whose command line has the subcommand and the pool's name. One that
/// exited (a zombie has no command line) is not among them.
fn refusal_helpers(pool: &str) -> Vec<u32> {
    let mut pids = Vec::new();
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|p| p.parse().ok()) else {
            continue;
        };
        let Ok(cmdline) = std::fs::read(e.path().join("cmdline")) else {
            continue;
        };
        let args: Vec<&[u8]> = cmdline.split(|b| *b == 0).collect();
        if args.contains(&b"serve-refusal".as_slice()) && args.contains(&pool.as_bytes()) {
            pids.push(pid);
        }
    }
    pids
}

/// Whether `pool` has no `serve-refusal` helper left, or none within `limit`.
fn no_helper_within(pool: &str, limit: Duration) -> bool {
    within(limit, || refusal_helpers(pool).is_empty())
}

/// Whether no process has `pool`'s socket name bound, or none within a
/// second (an exiting process loses its command line before its
/// descriptors).
fn unbound_soon(pool: &str) -> bool {
    within(Duration::from_secs(1), || socket_lines(pool).is_empty())
}

/// The `serve-refusal` helpers of these pools, ended (SIGKILL) when the test
/// ends, passed or failed, so none outlives it.
struct Helpers<'a>(Vec<&'a str>);

impl Drop for Helpers<'_> {
    fn drop(&mut self) {
        for pool in &self.0 {
            for pid in refusal_helpers(pool) {
                if let Some(pid) = i32::try_from(pid).ok().and_then(Pid::from_raw) {
                    let _ = kill_process(pid, Signal::KILL);
                }
            }
        }
    }
}

/// Issue 19, for the CLI: a creator whose `mmap` fails (failpoint
/// `shared-creator-map=ENOMEM`) exits at once, status 1, yet a rank started
/// after it exited fails within a second with its cause, the errno's text
/// and the creator's pid, instead of becoming a creator itself and waiting
/// out its attach timeout: the creator left a `serve-refusal` helper
/// answering on its socket. The helper holds none of the CLI's pipes (the
/// creator's stderr ends when it exits), exits once the untold rank heard
/// the cause, at the attach deadline when nobody comes, and at once on
/// SIGTERM; each time the socket name goes with it.
#[test]
fn a_rank_started_after_its_cli_creator_failed_hears_the_cause_at_once() {
    let pools = [name("late-cli"), name("late-cli-dl"), name("late-cli-term")];
    let _helpers = Helpers(pools.iter().map(String::as_str).collect());
    let start = |pool: &str, rank: u32, failpoints: &str, timeout: &str| {
        bin()
            .args(["alloc", "--size", "8MiB"])
            .rank(pool, 2, rank)
            .args(["--attach-timeout", timeout])
            .failpoints(failpoints)
            .spawn_stderr()
    };
    // The creator fails and exits at once, its output read to the end: no
    // helper holds its stderr.
    let fail_creator = |pool: &str, timeout: &str| -> u32 {
        let t = Instant::now();
        let mut creator = Ranks(vec![start(pool, 0, "shared-creator-map=ENOMEM", timeout)]);
        let err = exits_with(&mut creator[0], 1, Duration::from_secs(10), pool);
        assert!(err.contains("Cannot allocate memory"), "{pool}: {err}");
        assert!(
            t.elapsed() < Duration::from_secs(3),
            "{pool}: the creator took {:?} to exit and close its stderr",
            t.elapsed()
        );
        assert_eq!(
            refusal_helpers(pool).len(),
            1,
            "{pool}: one helper answers on the failed pool's socket"
        );
        creator[0].id()
    };
    // The helper of `pool` ends within `limit` (else fail saying `what`),
    // and the socket name goes with it.
    let assert_helper_gone = |pool: &str, limit: Duration, what: &str| {
        assert!(no_helper_within(pool, limit), "{what}");
        assert!(
            unbound_soon(pool),
            "the failed pool's socket outlived its helper"
        );
    };

    // A rank that comes later hears the cause; then the helper is done.
    let pool = &pools[0];
    let creator = fail_creator(pool, "20");
    // Its helper holds the socket name: a rank that comes now connects to it.
    wait_until_bound(pool);
    let t = Instant::now();
    let mut late = Ranks(vec![start(pool, 1, "", "20")]);
    let err = exits_with(&mut late[0], 1, Duration::from_secs(10), "the late rank");
    let took = t.elapsed();
    assert!(took < Duration::from_secs(2), "took {took:?}: {err}");
    assert!(
        err.contains("Cannot allocate memory")
            && err.contains(&format!("its creator (pid {creator}) failed")),
        "the creator's cause and pid: {err}"
    );
    let what = "the helper outlived the last rank it had to tell";
    assert_helper_gone(pool, Duration::from_secs(2), what);

    // Nobody comes: the helper ends at the attach deadline.
    let pool = &pools[1];
    let t = Instant::now();
    fail_creator(pool, "1.5");
    assert!(
        no_helper_within(pool, Duration::from_secs(3)),
        "the helper outlived the attach deadline"
    );
    assert!(
        t.elapsed() >= Duration::from_millis(1400),
        "the helper ended before the attach deadline: {:?}",
        t.elapsed()
    );
    assert!(
        unbound_soon(pool),
        "the failed pool's socket outlived its helper"
    );

    // SIGTERM ends it at once.
    let pool = &pools[2];
    fail_creator(pool, "20");
    for pid in refusal_helpers(pool) {
        let pid = i32::try_from(pid).ok().and_then(Pid::from_raw).unwrap();
        kill_process(pid, Signal::TERM).unwrap();
    }
    assert_helper_gone(
        pool,
        Duration::from_secs(1),
        "SIGTERM did not end the helper",
    );
}

#[test]
fn fault_matrix_on_hugetlbfs() {
    let Some(dir) = hugetlbfs_2m(16) else { return };
    fault_matrix(
        &["--dir", dir.to_str().unwrap(), "--size", "16MiB"],
        &dir,
        "mx-huge",
        true,
    );
}

/// Run hostpool, require exit 0, and parse its JSON report.
#[track_caller]
fn ok_json(cmd: &mut Command) -> Value {
    let r = cmd.succeeds();
    assert!(!r.is_null(), "{cmd:?}: no JSON report");
    r
}

#[test]
fn mlock_on_a_hugetlbfs_pool_says_it_is_not_needed_and_on_anon_locks() {
    let pin = ["--pin", "mlock", "--json"];
    let r = ok_json(
        bin()
            .args(["alloc", "--size", "32MiB", "--pin-required"])
            .args(pin),
    );
    assert_eq!(r["pin"]["status"], "pinned");
    assert_eq!(r["pin"]["details"]["mlock_called"], true);
    assert!(r["phases"]["pin"].is_f64());
    let Some(dir) = hugetlbfs_2m(16) else { return };
    let _serial = huge_pages_lock();
    let d = dir.to_str().unwrap();
    let r = ok_json(
        bin()
            .args(["alloc", "--dir", d, "--size", "32MiB"])
            .args(pin),
    );
    assert_eq!(r["pin"]["status"], "pinned");
    assert_eq!(r["pin"]["details"]["mlock_called"], false);
    assert!(
        r["pin"]["details"]["note"]
            .as_str()
            .unwrap()
            .contains("never swapped"),
        "{r}"
    );
}

/// The crash of vLLM #54002: a pool's only rank dies (SIGKILL, here at a
/// failpoint after its barrier, before it unlinks) and leaves its files on a
/// tmpfs with room for exactly one pool. The restart with the same name and
/// size must start at once, without `gc`: the stale files are removed before
/// the capacity check counts them. Stale files of another pool are named in
/// the shortage, with `hostpool gc`.
#[test]
fn a_restart_after_a_crash_replaces_the_stale_files_on_a_node_with_room_for_one_pool() {
    let Some(small) = SmallTmpfs::mount_or_skip("restart", 16) else {
        return;
    };
    let dir = small.path();
    let pool = name("restart");
    // The crashed runs' control file stays in /dev/shm until a run replaces it.
    struct RemoveCtl(String);
    impl Drop for RemoveCtl {
        fn drop(&mut self) {
            let _ = std::fs::remove_file(ctl_file(&self.0));
        }
    }
    let _ctl = RemoveCtl(pool.clone());
    let run = |pool: &str, failpoints: &str| {
        bin()
            .args([
                "alloc",
                "--backing",
                "shm-segmented",
                "--dir",
                dir,
                "--size",
                "12MiB",
            ])
            .rank(pool, 1, 0)
            .args(["--json", "--rendezvous", "file"])
            .failpoints(failpoints)
            .spawn_piped()
    };
    // A run of `pool` that faulted its pool and is killed past its barrier,
    // before it unlinks its files.
    let crash = |pool: &str| {
        let mut crashed = Ranks(vec![run(pool, "shared-after-barrier=stall")]);
        until(
            30,
            || small.used() >= 12 << 20,
            || "the first run faulted its pool".into(),
        );
        assert!(
            matches!(crashed[0].try_wait(), Ok(None)),
            "it stalls past the barrier"
        );
        kill_and_reap(&mut crashed[0]);
    };
    crash(&pool);
    assert!(
        !pool_files(&small.0, &pool).is_empty(),
        "the crash left its files"
    );

    succeeds(&run(&pool, "").wait_with_output().unwrap());
    assert_no_pool_files(&small.0, &pool, "files left behind");

    // Another pool's leftovers: the shortage names them and `hostpool gc`.
    crash(&pool);
    let other = name("restart-other");
    let err = fails(&run(&other, "").wait_with_output().unwrap(), 1);
    assert!(
        err.contains("cannot hold the pool")
            && err.contains("stale pool file(s) of crashed runs")
            && err.contains(&format!("hostpool gc --dir {dir}")),
        "{err}"
    );
    bin().args(["gc", "--dir", dir]).succeeds();
    assert_eq!(
        std::fs::read_dir(&small.0).unwrap().count(),
        0,
        "gc removed them"
    );
}

/// What a child prints on stdout up to the end of its pretty-printed report
/// (a line "}"), or up to the end of its stdout (it exited), whichever
/// comes first, within `limit`; with its stdout, which the caller keeps
/// open while the child runs.
fn report_or_eof(child: &mut Child, limit: Duration) -> (String, BufReader<ChildStdout>) {
    let mut out = BufReader::new(child.stdout.take().expect("piped stdout"));
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut text = String::new();
        let mut line = String::new();
        while out.read_line(&mut line).is_ok_and(|n| n > 0) {
            text.push_str(&line);
            if line == "}\n" {
                break;
            }
            line.clear();
        }
        let _ = tx.send((text, out));
    });
    rx.recv_timeout(limit).unwrap_or_else(|_| {
        panic!(
            "pid {} neither reported nor exited within {limit:?}",
            child.id()
        )
    })
}

/// Two 40 MiB pools with `--prefault touch` started together on a 64 MiB
/// tmpfs: both capacity checks may pass, but the touch fallback never dies
/// of SIGBUS (exit 135): the second pool fails with exit 1 and the reason.
#[test]
fn touch_prefault_of_two_pools_on_a_small_tmpfs_never_dies_of_sigbus() {
    let Some(small) = SmallTmpfs::mount_or_skip("touch", 64) else {
        return;
    };
    let mut pools = Ranks(
        (0..2)
            .map(|_| {
                bin()
                    .args(["alloc", "--backing", "shm-segmented", "--dir", small.path()])
                    .args(["--size", "40MiB", "--prefault", "touch", "--hold", "--json"])
                    .spawn_piped()
            })
            .collect(),
    );
    // Both cannot hold their pages: at least one fails and says why (both
    // may, when their `fallocate`s interleave and each rolls back); one that
    // got its pages holds its pool until SIGTERM. Which one did what, each
    // says: a holder prints its report, one that failed exits, closing its
    // stdout.
    let mut failed = 0;
    for p in pools.iter_mut() {
        let (text, _stdout) = report_or_eof(p, Duration::from_secs(30));
        if text.ends_with("}\n") {
            let report: Value =
                serde_json::from_str(&text).unwrap_or_else(|e| panic!("no report ({e}): {text}"));
            assert_eq!(report["prefault"]["method"], "touch", "{report}");
            terminate(p, Duration::from_secs(20));
        } else {
            let what = "never a signal (135 is SIGBUS)";
            let err = exits_with(p, 1, Duration::from_secs(10), what);
            assert!(
                err.contains("cannot hold the pool") || err.contains("no SIGBUS"),
                "{err}"
            );
            failed += 1;
        }
    }
    assert!(failed >= 1, "two 40 MiB pools cannot both fit in 64 MiB");
    assert_eq!(
        std::fs::read_dir(&small.0).unwrap().count(),
        0,
        "nothing left"
    );
}

#[test]
fn a_full_tmpfs_is_a_clear_capacity_error() {
    let Some(small) = SmallTmpfs::mount_or_skip("full", 16) else {
        return;
    };
    let err = bin()
        .args(["alloc", "--backing", "shm-segmented", "--dir", small.path()])
        .args(["--size", "64MiB"])
        .fails(1);
    assert!(
        err.contains("cannot hold the pool") && err.contains("--shm-size"),
        "{err}"
    );
    assert_eq!(
        std::fs::read_dir(&small.0).unwrap().count(),
        0,
        "nothing left in the tmpfs"
    );
}

/// A config file removed on drop.
struct TempFile(PathBuf);

impl TempFile {
    fn new(name: &str, text: &str) -> TempFile {
        // Tests run in parallel: each file its own name, so that one test's
        // drop never removes another's config.
        static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let p = std::env::temp_dir().join(format!(
            "hostpool-shared-test-{}-{n}-{name}",
            std::process::id()
        ));
        std::fs::write(&p, text).unwrap();
        TempFile(p)
    }

    fn path(&self) -> &str {
        self.0.to_str().unwrap()
    }
}

impl Drop for TempFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// Eight ranks over a pool of four pages: half the ranks have an empty
/// shard. With `--pin-scope shard` such a rank pins nothing (it once pinned
/// the whole pool), and the others pin exactly their one page.
#[test]
fn ranks_with_an_empty_shard_pin_nothing() {
    let cfg = shm_config(1);
    let pool = name("empty-shard");
    let pin = ["--pin", "mlock", "--pin-scope", "shard"];
    let args = [
        "--config",
        cfg.path(),
        "--size",
        "16KiB",
        pin[0],
        pin[1],
        pin[2],
        pin[3],
    ];
    let (mut ranks, reports) = held_ranks(&args, &pool, 8);
    let mut empty = 0;
    for (r, rep) in reports.iter().enumerate() {
        assert_eq!(rep["mapped_bytes"], 16384, "{rep}");
        let shard = rep["sharing"]["shard"]["len"].as_u64().unwrap();
        if shard == 0 {
            empty += 1;
            assert_eq!(rep["pin"]["status"], "skipped", "rank {r}: {rep}");
            assert!(
                rep["pin"]["reason"].as_str().unwrap().contains("empty"),
                "rank {r}: {rep}"
            );
            assert!(rep["phases"]["pin"].is_null(), "rank {r} pinned: {rep}");
        } else {
            assert_eq!(shard, 4096, "rank {r}: {rep}");
            assert_eq!(rep["pin"]["status"], "pinned", "rank {r}: {rep}");
            assert_eq!(rep["pin"]["details"]["bytes"], shard, "rank {r}: {rep}");
        }
    }
    assert_eq!(empty, 4, "four of eight ranks get no page: {reports:?}");
    release_held_ranks(&mut ranks, &pool);
}

/// The memfd the ranks of a shared pool share is sealed against shrinking
/// and growing: a rank, or any process that opens a rank's
/// `/proc/PID/fd/N`, that `ftruncate`s it gets `EPERM` (an unsealed one
/// could be cut under every rank, whose next touch of the lost range is a
/// SIGBUS), and the pool lives on whole.
#[test]
fn no_holder_can_truncate_a_shared_memfd() {
    if hugetlbfs_2m(8).is_none() {
        return;
    }
    let _serial = huge_pages_lock();
    let pool = name("sealed");
    let size = 8 << 20;
    let (mut ranks, reports) = held_ranks(&memfd_pool("2MiB", "8MiB"), &pool, 2);
    for (r, child) in ranks.iter().enumerate() {
        let memfds = fds_of(child.id(), "/memfd:hostpool");
        assert!(!memfds.is_empty(), "rank {r} holds the pool's memfd");
        for (fd, link) in memfds {
            let f = open_fd_of(child.id(), fd);
            let what = format!("rank {r}'s {link}");
            assert!(size_sealed(&f), "{what} is sealed");
            assert_truncate_refused(&f, 0, &what);
            assert_truncate_refused(&f, 2 * size, &what);
            assert_eq!(f.metadata().unwrap().len(), size, "{what}");
        }
    }
    // Still one pool, to its last byte.
    mem_write(ranks[0].id(), addr(&reports[0]) + size - 8, b"sealed!!");
    assert_eq!(
        mem_read(ranks[1].id(), addr(&reports[1]) + size - 8, 8),
        b"sealed!!"
    );
    release_held_ranks(&mut ranks, &pool);
}

/// A file in a directory cannot take seals (tmpfs), so whoever maps a
/// handed-over file checks its length first: a joiner whose file was
/// truncated between the creator's hand-over and its `mmap` (here by the
/// test, through the joiner's `/proc/PID/fd/N`) maps nothing, says which
/// file and by how much, and does not die of SIGBUS; its creator fails
/// naming it, and nothing is left in /dev/shm.
#[test]
fn a_joiner_refuses_a_file_truncated_before_it_maps_naming_it() {
    let cfg = shm_config(2);
    let pool = name("short-join");
    let spawn = |rank: u32, failpoints: &str| {
        alloc(&cfg, "8MiB")
            .args(["--json", "--hold", "--attach-timeout", "20"])
            .rank(&pool, 2, rank)
            .failpoints(failpoints)
            .spawn_stderr()
    };
    let mut ranks = Ranks(vec![spawn(0, "")]);
    wait_until_bound(&pool);
    ranks.push(spawn(1, "shared-passing-fds=stop"));
    let joiner = ranks[1].id();
    // The joiner stops once it holds the creator's descriptors.
    wait_stopped(joiner, Duration::from_secs(20));
    let files = fds_of(joiner, "/dev/shm/");
    assert_eq!(files.len(), 2, "two segments: {files:?}");
    // The last file is rank 1's shard, which the creator never touches.
    let (fd, link) = &files[1];
    open_fd_of(joiner, *fd).set_len(0).unwrap();
    signal(&ranks[1], libc::SIGCONT);
    let err = exits_with(&mut ranks[1], 1, Duration::from_secs(20), link);
    assert!(
        err.contains("file 1 is 0 B long, shorter than its 4 MiB extent at offset 4194304")
            && err.contains("nothing was mapped"),
        "{err}"
    );
    let err = exits_with(&mut ranks[0], 1, Duration::from_secs(20), "the creator");
    assert!(names_rank(&err, 1, joiner), "{err}");
    assert_no_pool_files(Path::new("/dev/shm"), &pool, "files left behind");
}
