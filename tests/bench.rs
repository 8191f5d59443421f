//! `hostpool bench` through the shipped binary, at a small size: every row is
//! there, measured or skipped with a reason, its ratios make sense, and the
//! run leaves nothing behind. Nothing here asserts on speed.
//!
//! Huge pages: the hugetlbfs rows are measured when pages are free and
//! skipped with a reason otherwise; under `cargo xtask test`
//! (`HOSTPOOL_REQUIRE_HUGEPAGES=1`) the 2 MiB rows must be measured.

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::process::{Command, Output, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use serde_json::Value;

/// Runs that map memory go one at a time, so one run's huge pages never show
/// up in another's before/after counts.
static HEAVY: Mutex<()> = Mutex::new(());

fn heavy() -> std::sync::MutexGuard<'static, ()> {
    HEAVY.lock().unwrap_or_else(|p| p.into_inner())
}

fn hostpool(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_hostpool"))
        .args(args)
        .env_remove("RUST_LOG")
        .output()
        .expect("run hostpool")
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

fn assert_exit(o: &Output, code: i32) {
    assert_eq!(
        o.status.code(),
        Some(code),
        "stdout:\n{}\nstderr:\n{}",
        text(&o.stdout),
        text(&o.stderr)
    );
    let e = text(&o.stderr);
    assert!(!e.contains("panicked"), "{e}");
}

fn required() -> bool {
    std::env::var("HOSTPOOL_REQUIRE_HUGEPAGES").as_deref() == Ok("1")
}

fn cores() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

/// `free_hugepages` per page size directory in sysfs.
fn free_huge_pages() -> Vec<(String, u64)> {
    let Ok(dir) = std::fs::read_dir("/sys/kernel/mm/hugepages") else {
        return Vec::new();
    };
    let mut out: Vec<(String, u64)> = dir
        .filter_map(Result::ok)
        .map(|e| {
            let free = std::fs::read_to_string(e.path().join("free_hugepages"))
                .ok()
                .and_then(|s| s.trim().parse().ok())
                .unwrap_or(0);
            (e.file_name().to_string_lossy().into_owned(), free)
        })
        .collect();
    out.sort();
    out
}

fn shm_entries() -> BTreeSet<String> {
    std::fs::read_dir("/dev/shm")
        .map(|d| {
            d.filter_map(Result::ok)
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default()
}

/// A file path removed when dropped.
struct TempPath(PathBuf);

impl Drop for TempPath {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

fn find<'a>(rows: &'a [Value], method: &str, backing: &str, page: u64, threads: u64) -> &'a Value {
    rows.iter()
        .find(|r| {
            r["method"] == method
                && r["backing"] == backing
                && r["page_size_bytes"] == page
                && r["threads"] == threads
        })
        .unwrap_or_else(|| panic!("no row {method} {backing} {page} {threads} threads"))
}

fn positive_finite(v: &Value, what: &str) -> f64 {
    let x = v
        .as_f64()
        .unwrap_or_else(|| panic!("{what} is not a number: {v}"));
    assert!(x.is_finite() && x > 0.0, "{what} = {x}");
    x
}

const KIB4: u64 = 4 << 10;
const MIB2: u64 = 2 << 20;
const GIB1: u64 = 1 << 30;

#[test]
fn json_has_every_row_with_sane_ratios_and_leaves_nothing_behind() {
    let _guard = heavy();
    let out = TempPath(
        std::env::temp_dir().join(format!("hostpool-bench-test-{}.json", std::process::id())),
    );
    let out_arg = out.0.to_str().expect("a UTF-8 temp path");
    let shm_before = shm_entries();
    let huge_before = free_huge_pages();

    let child = Command::new(env!("CARGO_BIN_EXE_hostpool"))
        .args([
            "bench", "--size", "32MiB", "--repeat", "1", "--json", "--out", out_arg,
        ])
        .env_remove("RUST_LOG")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start hostpool");
    let pid = child.id();
    let o = child.wait_with_output().expect("run hostpool");
    assert_exit(&o, 0);

    let report: Value = serde_json::from_slice(&o.stdout)
        .unwrap_or_else(|e| panic!("stdout is not JSON ({e}):\n{}", text(&o.stdout)));
    let file: Value = serde_json::from_str(&std::fs::read_to_string(&out.0).expect("--out file"))
        .expect("--out is JSON");
    assert_eq!(file, report, "--out must hold the same report");

    // The environment.
    let env = &report["environment"];
    assert_eq!(env["size_bytes"], 32u64 << 20);
    assert_eq!(env["repeat"], 1);
    assert_eq!(env["cores"], cores() as u64);
    assert!(!env["kernel"].as_str().unwrap_or("").is_empty(), "{env}");
    assert!(env["date"].as_str().unwrap_or("").ends_with('Z'), "{env}");

    let rows = report["rows"].as_array().expect("rows");
    let mut threads = vec![1u64, cores() as u64];
    threads.dedup();

    // Every row is present, and says what became of it.
    for row in rows {
        let status = row["status"].as_str().unwrap_or("");
        match status {
            "measured" => {
                positive_finite(&row["seconds"], "seconds");
                positive_finite(&row["gb_per_s"], "gb_per_s");
                assert!(row["reason"].is_null(), "{row}");
            }
            "skipped" | "no-op" => {
                let reason = row["reason"].as_str().unwrap_or("");
                assert!(reason.len() > 10, "a {status} row needs a reason: {row}");
            }
            _ => panic!("unexpected status {status}: {row}"),
        }
        for key in ["ratio_to_memset", "ratio_to_raw_c"] {
            if !row[key].is_null() {
                positive_finite(&row[key], key);
            }
        }
    }
    for &t in &threads {
        let memset = find(rows, "memset", "anon", KIB4, t);
        assert_eq!(memset["status"], "measured", "{memset}");
        assert!((memset["ratio_to_memset"].as_f64().unwrap() - 1.0).abs() < 1e-9);
    }
    let kinds = [
        ("anon", KIB4),
        ("shm-segmented", KIB4),
        ("hugetlbfs", MIB2),
        ("hugetlbfs", GIB1),
    ];
    for (backing, page) in kinds {
        let mut methods: Vec<(&str, u64)> = threads
            .iter()
            .flat_map(|&t| {
                [
                    ("raw-c", t),
                    ("populate-write", t),
                    ("touch", t),
                    ("alloc", t),
                ]
            })
            .collect();
        methods.push(("map-populate", 1));
        for (method, t) in methods {
            let row = find(rows, method, backing, page, t);
            if backing != "hugetlbfs" || (page == MIB2 && required()) {
                assert_eq!(row["status"], "measured", "{row}");
            }
            if row["status"] == "measured" {
                // Every prefault figure has both ratios at the default threads.
                positive_finite(&row["ratio_to_memset"], "ratio_to_memset");
                positive_finite(&row["ratio_to_raw_c"], "ratio_to_raw_c");
            } else {
                // Only huge pages may be missing; the reason was checked above.
                assert_eq!(row["status"], "skipped", "{row}");
                assert_eq!(backing, "hugetlbfs", "{row}");
            }
            if method == "raw-c" && row["status"] == "measured" {
                assert!((row["ratio_to_raw_c"].as_f64().unwrap() - 1.0).abs() < 1e-9);
            }
        }
    }

    // mlock per page size; on hugetlb it is a no-op, said so.
    let mlock_4k = find(rows, "mlock", "anon", KIB4, 1);
    assert!(
        matches!(mlock_4k["status"].as_str(), Some("measured" | "skipped")),
        "{mlock_4k}"
    );
    let thp = find(rows, "mlock", "anon-thp", MIB2, 1);
    assert!(
        matches!(thp["status"].as_str(), Some("measured" | "skipped")),
        "{thp}"
    );
    let huge = find(rows, "mlock", "hugetlbfs", MIB2, 1);
    assert_eq!(huge["status"], "no-op", "{huge}");
    assert!(
        huge["gb_per_s"].is_null() && huge["seconds"].is_null(),
        "{huge}"
    );
    assert!(
        huge["reason"].as_str().unwrap_or("").contains("nothing"),
        "{huge}"
    );

    // The keeper: a build, an attach (with its speed-up over the build) and
    // the clearing between leases, on 4 KiB and 2 MiB pages.
    for (backing, page) in [("shm-segmented", KIB4), ("hugetlbfs", MIB2)] {
        let t = cores() as u64;
        for method in ["build", "attach", "clear"] {
            let row = find(rows, method, backing, page, t);
            assert_eq!(row["section"], "keeper", "{row}");
            if backing == "shm-segmented" || required() {
                assert_eq!(row["status"], "measured", "{row}");
                positive_finite(&row["ratio_to_memset"], "ratio_to_memset");
            }
        }
        let attach = find(rows, "attach", backing, page, t);
        if attach["status"] == "measured" {
            let speedup = positive_finite(&attach["speedup_over_build"], "speedup_over_build");
            let (a, b) = (
                positive_finite(&attach["seconds"], "seconds"),
                positive_finite(&find(rows, "build", backing, page, t)["seconds"], "seconds"),
            );
            assert!((speedup - b / a).abs() < 1e-6 * speedup, "{attach}");
        }
    }

    // Nothing left behind: no file of this run in /dev/shm (a fallback
    // private file would carry the pid), no new hostpool files, and every
    // huge page back in the free pool.
    let leftover: Vec<String> = shm_entries()
        .difference(&shm_before)
        .filter(|n| n.contains(&pid.to_string()) || n.contains("hostpool"))
        .cloned()
        .collect();
    assert!(leftover.is_empty(), "left in /dev/shm: {leftover:?}");
    // Freed pages can take a moment to show; allow it, without timing anything.
    let deadline = Instant::now() + Duration::from_secs(5);
    while free_huge_pages() != huge_before && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(100));
    }
    assert_eq!(
        free_huge_pages(),
        huge_before,
        "huge page free counts changed"
    );
}

#[test]
fn table_names_every_method_and_the_hugetlb_mlock_no_op() {
    let _guard = heavy();
    let o = hostpool(&["bench", "--size", "8MiB", "--repeat", "1", "--threads", "1"]);
    assert_exit(&o, 0);
    let out = text(&o.stdout);
    for word in [
        "method",
        "GB/s",
        "x memset",
        "x raw C",
        "memset",
        "raw-c",
        "populate-write",
        "touch",
        "map-populate",
        "alloc",
        "mlock",
        "shm-segmented",
        "hugetlbfs",
        "no-op",
    ] {
        assert!(out.contains(word), "no {word} in:\n{out}");
    }
}

#[test]
fn bad_sizes_exit_2_and_too_large_exits_1() {
    for size in ["abc", "12GB", "1G", "0", ""] {
        let o = hostpool(&["bench", "--size", size, "--json"]);
        assert_exit(&o, 2);
        assert!(o.stdout.is_empty(), "size {size:?}: {}", text(&o.stdout));
        assert!(!o.stderr.is_empty(), "size {size:?} needs an error");
    }
    let o = hostpool(&["bench", "--threads", "0"]);
    assert_exit(&o, 2);
    let o = hostpool(&["bench", "--size", "1000TiB"]);
    assert_exit(&o, 1);
    let e = text(&o.stderr);
    assert!(e.contains("MemAvailable"), "{e}");
    assert!(o.stdout.is_empty(), "{}", text(&o.stdout));
}

#[test]
fn out_in_a_missing_directory_is_refused_before_measuring() {
    let o = hostpool(&[
        "bench",
        "--size",
        "8MiB",
        "--out",
        "/nonexistent-hostpool-dir/report.json",
    ]);
    assert_exit(&o, 2);
    assert!(
        text(&o.stderr).contains("does not exist"),
        "{}",
        text(&o.stderr)
    );
}
