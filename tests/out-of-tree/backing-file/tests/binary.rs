//! The `file-pool` binary as a user runs it: a config file that selects the
//! `file` backing by name, the JSON report it prints, its exit status, and
//! `--list`, which proves the plugin crate is really linked into it.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use serde_json::Value;

/// A scratch directory on the target directory's filesystem, removed on drop.
struct Scratch(PathBuf);

impl Scratch {
    fn new(tag: &str) -> Scratch {
        static N: AtomicU64 = AtomicU64::new(0);
        let d = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!(
            "file-pool-{tag}-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::create_dir_all(d.join("pool")).unwrap();
        Scratch(d)
    }

    /// The directory the pool's file goes in.
    fn pool_dir(&self) -> PathBuf {
        self.0.join("pool")
    }

    /// Write a config file next to (not inside) the pool directory.
    fn config(&self, name: &str, text: &str) -> PathBuf {
        let p = self.0.join(name);
        std::fs::write(&p, text).unwrap();
        p
    }

    fn pool_dir_entries(&self) -> Vec<PathBuf> {
        std::fs::read_dir(self.pool_dir())
            .unwrap()
            .map(|e| e.unwrap().path())
            .collect()
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn file_pool(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_file-pool"))
        .args(args)
        .output()
        .expect("run file-pool")
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

fn assert_exit(o: &Output, code: i32) {
    assert_eq!(
        o.status.code(),
        Some(code),
        "stdout:\n{}\nstderr:\n{}",
        text(&o.stdout),
        text(&o.stderr)
    );
    assert!(!text(&o.stderr).contains("panicked"), "{}", text(&o.stderr));
}

fn report(o: &Output) -> Value {
    assert_exit(o, 0);
    serde_json::from_slice(&o.stdout)
        .unwrap_or_else(|e| panic!("stdout is not JSON ({e}):\n{}", text(&o.stdout)))
}

/// Run file-pool on `config`: its report, and how long the process ran.
fn timed_report(config: &Path) -> (Value, Duration) {
    let started = Instant::now();
    let o = file_pool(&[config.to_str().unwrap()]);
    let wall = started.elapsed();
    (report(&o), wall)
}

/// The report fields every successful run has, for a pool of `size` bytes,
/// of a process that ran for `wall`.
fn check_report(r: &Value, wall: Duration, size: u64, dir: &Path) {
    assert_eq!(r["backing"], "file", "{r:#}");
    let page = r["page_size"].as_u64().unwrap();
    assert!(page.is_power_of_two() && page >= 4096, "{r:#}");
    assert_eq!(r["logical_bytes"], size);
    assert_eq!(r["mapped_bytes"], size.div_ceil(page) * page);
    assert!(r["address"].as_str().unwrap().starts_with("0x"), "{r:#}");
    assert_eq!(
        r["segments"],
        serde_json::json!([{"offset": 0, "len": r["mapped_bytes"]}])
    );
    assert_eq!(r["options"]["dir"], dir.display().to_string());
    assert_eq!(r["prefault"]["bytes"], r["mapped_bytes"], "{r:#}");
    // Each phase took some time, and all of them together no more than the
    // process ran.
    let phases = r["phases"].as_object().unwrap();
    for phase in ["map", "prefault", "teardown"] {
        assert!(phases.contains_key(phase), "{phase}: {r:#}");
    }
    for (phase, seconds) in phases {
        let seconds = seconds.as_f64().unwrap();
        assert!(seconds.is_finite() && seconds > 0.0, "{phase}: {r:#}");
    }
    let total: f64 = phases.values().map(|s| s.as_f64().unwrap()).sum();
    assert!(
        total <= wall.as_secs_f64(),
        "the phases took {total} s, the process ran {wall:?}: {r:#}"
    );
    assert_eq!(r["pin"]["status"], "off");
    assert_eq!(r["teardown_issues"], serde_json::json!([]));
    let capacity = r["capacity"].as_array().unwrap();
    assert!(
        !capacity.is_empty() && capacity.iter().all(|c| c["verdict"] == "fits"),
        "{r:#}"
    );
}

#[test]
fn file_pool_builds_the_file_pool_a_toml_config_selects_and_prints_its_report() {
    let s = Scratch::new("toml");
    let cfg = s.config(
        "pool.toml",
        &format!(
            "backing = \"file\"\ndir = \"{}\"\nsize = \"128MiB\"\nthreads = 2\n\n[file]\n",
            s.pool_dir().display()
        ),
    );
    let (r, wall) = timed_report(&cfg);
    check_report(&r, wall, 128 << 20, &s.pool_dir());
    assert_eq!(r["options"]["path"], Value::Null, "private by default");
    // Two threads: the engine gives each at least 64 MiB.
    assert_eq!(r["prefault"]["threads"], 2);
    let space = &r["capacity"][0];
    if r["options"]["filesystem"] != "tmpfs" {
        assert!(
            space["resource"]
                .as_str()
                .unwrap()
                .starts_with("file system space")
                && space["source"].as_str().unwrap().starts_with("statvfs("),
            "{space:#}"
        );
    }
    assert!(
        s.pool_dir_entries().is_empty(),
        "{:?}",
        s.pool_dir_entries()
    );
}

#[test]
fn file_pool_reads_json_configs_and_the_visible_file_is_gone_afterwards() {
    let s = Scratch::new("json");
    let cfg = s.config(
        "pool.json",
        &serde_json::json!({
            "backing": "file",
            "dir": s.pool_dir(),
            "size": 5_000_000,
            "file": {"name_prefix": "kv-pool"},
        })
        .to_string(),
    );
    let (r, wall) = timed_report(&cfg);
    check_report(&r, wall, 5_000_000, &s.pool_dir());
    let path = r["options"]["path"].as_str().unwrap();
    assert!(
        path.starts_with(&format!("{}/kv-pool-", s.pool_dir().display())),
        "{path}"
    );
    assert!(
        s.pool_dir_entries().is_empty(),
        "teardown must unlink {path}"
    );
}

#[test]
fn file_pool_lists_exactly_the_backings_it_links() {
    // The fix for the linking pitfall, checked: `file` is registered because
    // main.rs names the crate. The exact set, not just "contains", also
    // catches a plugin linked by accident.
    let o = file_pool(&["--list"]);
    assert_exit(&o, 0);
    let out = text(&o.stdout);
    let rows: Vec<Vec<&str>> = out.lines().map(|l| l.split('\t').collect()).collect();
    let names: Vec<&str> = rows.iter().map(|r| r[0]).collect();
    assert_eq!(names, ["file"], "{out}");
    assert_eq!(rows[0][1], "hostpool-example-backing-file", "{out}");
    assert!(rows[0][2].contains("plain file"), "{out}");
}

#[test]
fn a_backing_that_is_not_linked_is_a_usage_error_naming_the_ones_that_are() {
    let s = Scratch::new("anon");
    let cfg = s.config("pool.toml", "backing = \"anon\"\nsize = \"4MiB\"\n");
    let o = file_pool(&[cfg.to_str().unwrap()]);
    assert_exit(&o, 2);
    let err = text(&o.stderr);
    assert!(
        err.contains("unknown backing `anon`; available: file")
            && err.contains("use the_crate as _;"),
        "{err}"
    );
    assert!(o.stdout.is_empty());
}

#[test]
fn configuration_errors_exit_2_with_the_fix_and_runtime_shortfalls_exit_1() {
    let s = Scratch::new("errors");
    let missing = s.0.join("nowhere");
    let cfg = s.config(
        "missing.toml",
        &format!("backing = \"file\"\ndir = \"{}\"\n", missing.display()),
    );
    let o = file_pool(&[cfg.to_str().unwrap()]);
    assert_exit(&o, 2);
    let err = text(&o.stderr);
    assert!(
        err.contains("does not exist") && err.contains("mkdir -p"),
        "{err}"
    );

    let cfg = s.config(
        "typo.toml",
        &format!(
            "backing = \"file\"\ndir = \"{}\"\n[file]\nname_prefx = \"kv\"\n",
            s.pool_dir().display()
        ),
    );
    let o = file_pool(&[cfg.to_str().unwrap()]);
    assert_exit(&o, 2);
    assert!(
        text(&o.stderr).contains("name_prefx"),
        "{}",
        text(&o.stderr)
    );

    let cfg = s.config(
        "huge.toml",
        &format!(
            "backing = \"file\"\ndir = \"{}\"\nsize = \"10PiB\"\n",
            s.pool_dir().display()
        ),
    );
    let o = file_pool(&[cfg.to_str().unwrap()]);
    assert_exit(&o, 1);
    assert!(
        text(&o.stderr).contains("cannot hold the pool"),
        "{}",
        text(&o.stderr)
    );
    assert!(s.pool_dir_entries().is_empty());

    let o = file_pool(&[s.0.join("absent.toml").to_str().unwrap()]);
    assert_exit(&o, 2);
    assert!(text(&o.stderr).contains("cannot read config file"));
}

#[test]
fn bad_arguments_are_usage_errors() {
    for args in [&[][..], &["--nope"], &["a.toml", "b.toml"]] {
        let o = file_pool(args);
        assert_exit(&o, 2);
        assert!(text(&o.stderr).contains("usage: file-pool"), "{args:?}");
    }
    let o = file_pool(&["--help"]);
    assert_exit(&o, 0);
    assert!(text(&o.stdout).contains("file-pool --list"));
}
