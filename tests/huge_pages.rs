//! `huge_pages = "required" | "prefer" | "off"` (issue 20) with real huge
//! pages: `prefer` falls back to 4 KiB pages and says why when the huge
//! page pool cannot hold the pool, uses huge pages when it can; `required`
//! fails with the remedy; `off` never uses them; the ranks of a shared pool
//! all take their creator's choice. Needs the 2 MiB pages and the hugetlbfs
//! mount `cargo xtask test` reserves; elsewhere it prints why it skips.

mod support;

use std::process::{Output, Stdio};
use std::time::Duration;

use serde_json::Value;
use support::procs::{
    Children, bin, free_2m, hugetlbfs_2m, name, read_report, signal, wait_timeout,
};

const MIB: u64 = 1 << 20;

/// The tests count free huge pages: one at a time.
static HUGE_PAGES: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// `hostpool ARGS`, run to its end.
fn run(args: &[&str]) -> Output {
    bin().args(args).output().unwrap()
}

fn report(out: &Output) -> Value {
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

/// Hold all free 2 MiB pages but `leave` (a hugetlbfs pool held by a
/// process of its own), so that a pool of more than `leave` pages is short.
fn hold_all_but(dir: &std::path::Path, leave: u64) -> Children {
    let take = free_2m() - leave;
    let mut holder = bin()
        .args([
            "alloc",
            "--backing",
            "hugetlbfs",
            "--hold",
            "--json",
            "--dir",
        ])
        .arg(dir)
        .args(["--size", &format!("{}MiB", take * 2)])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    read_report(&mut holder);
    assert_eq!(free_2m(), leave);
    Children(vec![holder])
}

fn release(mut held: Children) {
    signal(&held[0], libc::SIGTERM);
    assert_eq!(
        wait_timeout(&mut held[0], Duration::from_secs(10)).and_then(|s| s.code()),
        Some(0)
    );
}

#[test]
fn prefer_falls_back_and_says_why_required_fails_and_off_never_uses_them() {
    let _serial = HUGE_PAGES.lock().unwrap_or_else(|p| p.into_inner());
    let Some(dir) = hugetlbfs_2m(64) else {
        return;
    };
    // Enough huge pages: `prefer` uses them (a memfd: no dir needed).
    let r = report(&run(&[
        "alloc",
        "--size",
        "16MiB",
        "--huge-pages",
        "prefer",
        "--json",
    ]));
    assert_eq!(
        (r["backing"].as_str(), r["page_size"].as_u64()),
        (Some("hugetlbfs"), Some(2 * MIB)),
        "{r}"
    );
    assert_eq!(r["huge_pages"]["fell_back"], false, "{r}");
    assert_eq!(r["huge_pages"]["reason"], "the huge page pool holds it");

    // Too few: `prefer` falls back to anonymous 4 KiB pages, says why in the
    // report, the plan and a warning; `required` fails naming the remedy.
    let held = hold_all_but(&dir, 4);
    let plan = report(&run(&[
        "plan",
        "--size",
        "16MiB",
        "--huge-pages",
        "prefer",
        "--json",
    ]));
    assert_eq!(plan["backing"], "anon", "{plan}");
    assert_eq!(plan["huge_pages"]["fell_back"], true, "{plan}");
    assert!(
        plan["explain"].as_array().unwrap().iter().any(|l| l
            .as_str()
            .unwrap()
            .contains("huge pages cannot hold the pool")),
        "{plan}"
    );
    let out = run(&[
        "alloc",
        "--size",
        "16MiB",
        "--huge-pages",
        "prefer",
        "--json",
    ]);
    let warned = String::from_utf8_lossy(&out.stderr).into_owned();
    let r = report(&out);
    assert_eq!(
        (r["backing"].as_str(), r["page_size"].as_u64()),
        (Some("anon"), Some(4096)),
        "{r}"
    );
    let reason = r["huge_pages"]["reason"].as_str().unwrap();
    assert!(
        reason.contains("2 MiB huge page pool needs 16 MiB, 8 MiB free")
            && reason.contains("4 KiB pages instead"),
        "{reason}"
    );
    assert_eq!(
        warned.matches("huge_pages = prefer").count(),
        1,
        "warned once: {warned}"
    );
    let out = run(&["alloc", "--size", "16MiB", "--huge-pages", "required"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains("cannot hold the pool") && err.contains("nr_hugepages"),
        "{err}"
    );
    // A shared pool falls back to segmented /dev/shm (4 KiB), whose ranks
    // can open it.
    let plan = report(
        &bin()
            .args([
                "plan",
                "--size",
                "16MiB",
                "--huge-pages",
                "prefer",
                "--json",
            ])
            .args(["--shared", &name("fallback"), "--world", "2", "--rank", "0"])
            .output()
            .unwrap(),
    );
    assert_eq!(plan["backing"], "shm-segmented", "{plan}");
    release(held);

    // `off`: never huge pages, and a hugetlbfs dir with it is a usage error.
    let r = report(&run(&[
        "alloc",
        "--size",
        "16MiB",
        "--huge-pages",
        "off",
        "--json",
    ]));
    assert_eq!(r["page_size"], 4096, "{r}");
    for (args, says) in [
        (
            vec!["--huge-pages", "off", "--dir", dir.to_str().unwrap()],
            "a hugetlbfs mount",
        ),
        (
            vec!["--huge-pages", "required", "--dir", "/dev/shm"],
            "maps 4 KiB pages",
        ),
        (
            vec!["--huge-pages", "prefer", "--backing", "anon"],
            "needs backing = \"auto\"",
        ),
    ] {
        let out = bin()
            .args(["plan", "--size", "16MiB"])
            .args(&args)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert!(err.contains(says), "{args:?}: {err}");
    }
}

/// Two ranks of a shared pool with `huge_pages = "prefer"` and huge pages
/// for exactly one pool: the creator takes them, the joiner, which finds
/// them taken when it plans, takes the creator's choice instead of a pool of
/// its own pages, and both map the same 2 MiB pages.
#[test]
fn the_ranks_of_a_shared_pool_all_take_their_creators_choice() {
    let _serial = HUGE_PAGES.lock().unwrap_or_else(|p| p.into_inner());
    let Some(dir) = hugetlbfs_2m(64) else {
        return;
    };
    let held = hold_all_but(&dir, 8);
    let pool = name("prefer-shared");
    let rank = |r: &str| {
        bin()
            .args([
                "alloc",
                "--size",
                "16MiB",
                "--huge-pages",
                "prefer",
                "--hold",
                "--json",
            ])
            .args(["--shared", &pool, "--world", "2", "--rank", r])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap()
    };
    let mut ranks = Children(vec![rank("0")]);
    // The creator has mapped (reserved) the 8 pages before the joiner plans.
    let end = std::time::Instant::now() + Duration::from_secs(10);
    while free_2m() != 0 && std::time::Instant::now() < end {
        std::thread::sleep(Duration::from_millis(10));
    }
    ranks.push(rank("1"));
    let reports: Vec<Value> = ranks.iter_mut().map(read_report).collect();
    for (r, rep) in reports.iter().enumerate() {
        assert_eq!(
            (rep["backing"].as_str(), rep["page_size"].as_u64()),
            (Some("hugetlbfs"), Some(2 * MIB)),
            "rank {r}: {rep}"
        );
    }
    assert_eq!(reports[0]["sharing"]["role"], "creator");
    assert!(
        reports[1]["huge_pages"]["reason"]
            .as_str()
            .unwrap()
            .contains("creator has 2 MiB pages"),
        "{}",
        reports[1]
    );
    for c in ranks.iter() {
        signal(c, libc::SIGTERM);
    }
    for c in ranks.iter_mut() {
        assert_eq!(
            wait_timeout(c, Duration::from_secs(10)).and_then(|s| s.code()),
            Some(0)
        );
    }
    release(held);
}

/// `[anon] thp = true` is a hint: the report's `thp` says how much of the
/// pool the kernel really backed with transparent huge pages (its
/// `AnonHugePages`, after prefault). Where THP is on (`always` or
/// `madvise`), a prefaulted, aligned pool gets some; a pool without the
/// hint has no `thp` object.
#[test]
fn the_report_says_how_much_of_a_thp_pool_huge_pages_back() {
    let dir = support::TempDir::new("thp");
    let config = dir.0.join("thp.toml");
    std::fs::write(
        &config,
        "size = \"64MiB\"\nbacking = \"anon\"\n[anon]\nthp = true\n",
    )
    .unwrap();
    let r = report(
        &bin()
            .args(["alloc", "--json", "--config"])
            .arg(&config)
            .output()
            .unwrap(),
    );
    let thp = &r["thp"];
    let backed = thp["backed_bytes"]
        .as_u64()
        .unwrap_or_else(|| panic!("{r}"));
    assert_eq!(thp["mapped_bytes"], 64 * MIB, "{r}");
    assert!(backed <= 64 * MIB && backed.is_multiple_of(2 * MIB), "{r}");
    match thp["mode"].as_str() {
        Some("always" | "madvise") => assert!(backed > 0, "THP is on, none backs the pool: {r}"),
        mode => eprintln!("THP mode {mode:?}: the kernel may back nothing"),
    }
    let plain = report(&run(&[
        "alloc",
        "--json",
        "--size",
        "8MiB",
        "--backing",
        "anon",
    ]));
    assert!(plain.get("thp").is_none(), "{plain}");
}
