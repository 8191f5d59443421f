//! The `hostpool` binary as operators' scripts use it: flags, exit status,
//! JSON report fields, errors on stderr, `--hold` and signals.

use std::io::{BufRead, BufReader, Read};
use std::path::PathBuf;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use rustix::process::{Pid, Signal, kill_process};
use serde_json::Value;

mod support;
use support::assert_tiles_on_unit;

fn hostpool(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_hostpool"))
        .args(args)
        .env_remove("RUST_LOG")
        .output()
        .expect("run hostpool")
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// No panic message or backtrace ever reaches the operator.
fn assert_no_panic(o: &Output) {
    let e = stderr(o);
    assert!(
        !e.contains("panicked") && !e.contains("RUST_BACKTRACE") && !e.contains("stack backtrace"),
        "{e}"
    );
}

fn assert_exit(o: &Output, code: i32) {
    assert_eq!(
        o.status.code(),
        Some(code),
        "stdout:\n{}\nstderr:\n{}",
        stdout(o),
        stderr(o)
    );
    assert_no_panic(o);
}

fn json(o: &Output) -> Value {
    serde_json::from_slice(&o.stdout)
        .unwrap_or_else(|e| panic!("stdout is not JSON ({e}):\n{}", stdout(o)))
}

/// A config file that is removed when dropped.
struct TempFile(PathBuf);

impl TempFile {
    fn to_str(&self) -> Option<&str> {
        self.0.to_str()
    }
}

impl Drop for TempFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

fn temp_file(name: &str, text: &str) -> TempFile {
    let path =
        std::env::temp_dir().join(format!("hostpool-cli-test-{}-{name}", std::process::id()));
    std::fs::write(&path, text).unwrap();
    TempFile(path)
}

#[test]
fn the_binary_registers_exactly_the_built_in_plugins() {
    let o = hostpool(&["plugins", "--json"]);
    assert_exit(&o, 0);
    let v = json(&o);
    let names = |kind: &str| -> Vec<String> {
        v[kind]
            .as_array()
            .unwrap()
            .iter()
            .map(|p| p["name"].as_str().unwrap().to_string())
            .collect()
    };
    // Update these lists when a plugin lands; a plugin that silently stops
    // being linked fails here.
    assert_eq!(names("backings"), ["anon", "hugetlbfs", "shm-segmented"]);
    assert_eq!(names("pinners"), ["cuda", "mlock"]);
    assert_eq!(names("registrars"), ["nixl", "rdma"]);
    assert_eq!(names("adapters"), ["mooncake"]);
    assert_eq!(v["backings"][0]["origin"], "backing-anon");
    assert_eq!(v["adapters"][0]["origin"], "adapter-mooncake");
    assert!(
        v["adapters"][0]["summary"]
            .as_str()
            .unwrap()
            .contains("[mooncake] max_region"),
        "{v:#}"
    );
    let human = hostpool(&["plugins"]);
    assert_exit(&human, 0);
    assert!(stdout(&human).contains("anon"));
    assert!(
        stdout(&human).contains("adapters:\n  mooncake ")
            && stdout(&human).contains("[adapter-mooncake]"),
        "{}",
        stdout(&human)
    );
}

#[test]
fn a_mooncake_table_is_checked_by_its_adapter_when_planning() {
    let good = temp_file(
        "mooncake.toml",
        "size = \"64MiB\"\n[mooncake]\nmax_region = \"1GiB\"\n",
    );
    let o = hostpool(&["plan", "--config", good.to_str().unwrap(), "--json"]);
    assert_exit(&o, 0);
    assert_eq!(json(&o)["fits"], true);

    let typo = temp_file(
        "mooncake-typo.toml",
        "size = \"64MiB\"\n[mooncake]\nmax_regon = 1\n",
    );
    let o = hostpool(&["plan", "--config", typo.to_str().unwrap()]);
    assert_exit(&o, 2);
    let e = stderr(&o);
    assert!(e.contains("[mooncake]") && e.contains("max_regon"), "{e}");

    let zero = temp_file(
        "mooncake-zero.toml",
        "size = \"64MiB\"\n[mooncake]\nmax_region = 0\n",
    );
    let o = hostpool(&["plan", "--config", zero.to_str().unwrap()]);
    assert_exit(&o, 2);
    assert!(
        stderr(&o).contains("[mooncake] max_region is 0"),
        "{}",
        stderr(&o)
    );

    // A table no plugin owns lists the adapter among the tables available.
    let unknown = temp_file("mooncakes.toml", "size = \"64MiB\"\n[mooncakes]\nx = 1\n");
    let o = hostpool(&["plan", "--config", unknown.to_str().unwrap()]);
    assert_exit(&o, 2);
    let e = stderr(&o);
    assert!(
        e.contains("table [mooncakes] belongs to no registered plugin") && e.contains("mooncake,"),
        "{e}"
    );
}

#[test]
fn alloc_4gib_json_reports_every_contract_field() {
    let o = hostpool(&["alloc", "--size", "4GiB", "--json"]);
    assert_exit(&o, 0);
    let r = json(&o);
    assert_eq!(r["backing"], "anon");
    assert_eq!(r["page_size"], 4096);
    assert_eq!(r["logical_bytes"], 4u64 << 30);
    assert_eq!(r["mapped_bytes"], 4u64 << 30);
    for phase in ["map", "prefault", "teardown"] {
        assert!(
            r["phases"][phase].is_f64(),
            "phases.{phase} must be seconds as a float: {}",
            r["phases"]
        );
    }
    assert!(r["phases"].get("pin").is_none(), "pin did not run");
    assert_eq!(r["pin"]["kind"], "off");
    assert_eq!(r["pin"]["status"], "off");
    assert!(r["pin"]["reason"].is_null());
    assert_eq!(r["registrations"], serde_json::json!([]));
    assert_eq!(r["prefault"]["bytes"], 4u64 << 30);
    assert_eq!(r["prefault"]["method"], "populate-write");
    assert_eq!(r["teardown_issues"], serde_json::json!([]));
    assert!(
        stderr(&o).is_empty(),
        "no progress bar with --json: {}",
        stderr(&o)
    );
}

#[test]
fn alloc_with_no_arguments_allocates_one_gib_of_anonymous_memory() {
    let o = hostpool(&["alloc", "--json"]);
    assert_exit(&o, 0);
    let r = json(&o);
    assert_eq!(r["logical_bytes"], 1u64 << 30);
    assert_eq!(r["backing"], "anon");
    let human = hostpool(&[
        "alloc",
        "--size",
        "8MiB",
        "--threads",
        "1",
        "--prefault",
        "touch",
    ]);
    assert_exit(&human, 0);
    let out = stdout(&human);
    assert!(
        out.contains("pool built, prefaulted and released") && out.contains("touch"),
        "{out}"
    );
}

#[test]
fn decimal_sizes_are_usage_errors_that_show_the_iec_spelling() {
    for size in ["384G", "384GB"] {
        let o = hostpool(&["alloc", "--size", size]);
        assert_exit(&o, 2);
        assert!(stderr(&o).contains("384GiB"), "{}", stderr(&o));
    }
    let cfg = temp_file("decimal.toml", "size = \"384GB\"\n");
    let o = hostpool(&["plan", "--config", cfg.to_str().unwrap()]);
    assert_exit(&o, 2);
    assert!(
        stderr(&o).contains("384GiB") && stderr(&o).contains("decimal.toml"),
        "{}",
        stderr(&o)
    );
}

#[test]
fn unknown_backing_is_a_usage_error_listing_the_available_ones() {
    let o = hostpool(&["alloc", "--backing", "nope", "--size", "1MiB"]);
    assert_exit(&o, 2);
    let e = stderr(&o);
    assert!(
        e.contains("unknown backing `nope`") && e.contains("available: anon"),
        "{e}"
    );
    assert_eq!(e.trim().lines().count(), 1, "one paragraph: {e}");
}

#[test]
fn a_pool_the_node_cannot_hold_fails_with_exit_1_before_mapping() {
    let o = hostpool(&["alloc", "--size", "1PiB"]);
    assert_exit(&o, 1);
    let e = stderr(&o);
    assert!(
        e.contains("cannot hold the pool") && e.contains("1 PiB") && e.contains("MemAvailable"),
        "{e}"
    );
    // plan says the same without side effects, and exits 1 so scripts can gate on it.
    let p = hostpool(&["plan", "--size", "1PiB", "--json"]);
    assert_exit(&p, 1);
    assert_eq!(json(&p)["fits"], false);
}

#[test]
fn config_files_work_in_toml_and_json_and_flags_override_them() {
    let toml = temp_file(
        "pool.toml",
        "size = \"16MiB\"\nbacking = \"anon\"\nthreads = 1\n[anon]\nshared = true\n",
    );
    let o = hostpool(&["alloc", "--config", toml.to_str().unwrap(), "--json"]);
    assert_exit(&o, 0);
    let r = json(&o);
    assert_eq!(r["logical_bytes"], 16 << 20);
    assert_eq!(r["options"]["shared"], true);
    let o = hostpool(&[
        "alloc",
        "--config",
        toml.to_str().unwrap(),
        "--size",
        "8MiB",
        "--json",
    ]);
    assert_exit(&o, 0);
    assert_eq!(
        json(&o)["logical_bytes"],
        8 << 20,
        "--size overrides the file"
    );
    let js = temp_file(
        "pool.json",
        "{\"size\": \"12MiB\", \"anon\": {\"thp\": true}}",
    );
    let o = hostpool(&["alloc", "--config", js.to_str().unwrap(), "--json"]);
    assert_exit(&o, 0);
    assert_eq!(json(&o)["options"]["thp"], true);
}

#[test]
fn unknown_config_keys_are_usage_errors_naming_the_key() {
    let bad = temp_file("bad.toml", "size = \"8MiB\"\nthreadz = 2\n");
    let o = hostpool(&["alloc", "--config", bad.to_str().unwrap()]);
    assert_exit(&o, 2);
    assert!(
        stderr(&o).contains("unknown key `threadz`"),
        "{}",
        stderr(&o)
    );
    let bad = temp_file("badtable.toml", "[anon]\nhuge = true\n");
    let o = hostpool(&["alloc", "--config", bad.to_str().unwrap()]);
    assert_exit(&o, 2);
    assert!(
        stderr(&o).contains("[anon]") && stderr(&o).contains("huge"),
        "{}",
        stderr(&o)
    );
    let o = hostpool(&["alloc", "--config", "/nonexistent/pool.toml"]);
    assert_exit(&o, 2);
}

#[test]
fn plan_explains_its_choices_and_changes_nothing() {
    let o = hostpool(&["plan", "--size", "2GiB", "--threads", "2"]);
    assert_exit(&o, 0);
    let out = stdout(&o);
    for want in [
        "anon",
        "no dir given",
        "MADV_POPULATE_WRITE",
        "2 prefault thread(s)",
        "MemAvailable",
        "fits",
    ] {
        assert!(out.contains(want), "plan must explain {want:?}:\n{out}");
    }
    let j = hostpool(&["plan", "--size", "2GiB", "--json"]);
    assert_exit(&j, 0);
    let p = json(&j);
    assert_eq!(p["mapped_bytes"], 2u64 << 30);
    assert_eq!(p["fits"], true);
    assert!(p["explain"].as_array().unwrap().len() >= 4);
}

#[test]
fn usage_errors_exit_2_and_help_exits_0() {
    assert_exit(&hostpool(&["alloc", "--threads", "0"]), 2);
    assert_exit(&hostpool(&["alloc", "--prefault", "fast"]), 2);
    assert_exit(&hostpool(&["frobnicate"]), 2);
    assert_exit(&hostpool(&[]), 2);
    let h = hostpool(&["alloc", "--help"]);
    assert_exit(&h, 0);
    for flag in [
        "--config",
        "--size",
        "--backing",
        "--dir",
        "--page-size",
        "--threads",
        "--hold",
        "--json",
    ] {
        assert!(stdout(&h).contains(flag), "alloc --help must list {flag}");
    }
}

#[test]
fn unknown_pinner_or_registrar_is_a_usage_error() {
    let o = hostpool(&["alloc", "--size", "1MiB", "--pin", "warp-drive"]);
    assert_exit(&o, 2);
    assert!(
        stderr(&o).contains("unknown pinner `warp-drive`"),
        "{}",
        stderr(&o)
    );
    let o = hostpool(&["alloc", "--size", "1MiB", "--register", "carrier-pigeon"]);
    assert_exit(&o, 2);
    assert!(
        stderr(&o).contains("unknown registrar `carrier-pigeon`"),
        "{}",
        stderr(&o)
    );
}

fn hold_then_signal(signal: i32) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_hostpool"))
        .args(["alloc", "--size", "32MiB", "--hold", "--json"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // The report comes as soon as the pool is ready; read until the closing brace.
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let mut report = String::new();
    let deadline = Instant::now() + Duration::from_secs(60);
    while Instant::now() < deadline {
        let mut line = String::new();
        if out.read_line(&mut line).unwrap() == 0 {
            break;
        }
        report.push_str(&line);
        if line == "}\n" {
            break;
        }
    }
    let r: Value = serde_json::from_str(&report).unwrap_or_else(|e| panic!("{e}: {report}"));
    assert_eq!(r["logical_bytes"], 32 << 20);
    assert!(
        r["phases"].get("teardown").is_none(),
        "held pool not yet torn down"
    );
    // The pool is live while held: its address is mapped in the child.
    let maps = std::fs::read_to_string(format!("/proc/{}/maps", child.id())).unwrap();
    let addr = r["address"]
        .as_str()
        .unwrap()
        .trim_start_matches("0x")
        .to_string();
    assert!(
        maps.lines().any(|l| l.starts_with(&addr)),
        "held pool {addr} not mapped in the child"
    );
    let pid = i32::try_from(child.id()).ok().and_then(Pid::from_raw);
    let sig = Signal::from_named_raw(signal).expect("a named signal");
    kill_process(pid.expect("a child pid"), sig).expect("kill");
    let status = child.wait().unwrap();
    let mut err = String::new();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut err)
        .unwrap();
    assert_eq!(
        status.code(),
        Some(0),
        "clean teardown exits 0; stderr: {err}"
    );
    assert!(
        err.contains(&format!("signal {signal} received; pool released")),
        "{err}"
    );
}

#[test]
fn hold_keeps_the_pool_until_sigterm_then_tears_down_and_exits_0() {
    hold_then_signal(libc::SIGTERM);
}

#[test]
fn hold_keeps_the_pool_until_sigint_then_tears_down_and_exits_0() {
    hold_then_signal(libc::SIGINT);
}

#[test]
fn plan_shows_shards_chunks_and_predicted_costs() {
    let o = hostpool(&[
        "plan",
        "--size",
        "4GiB",
        "--threads",
        "2",
        "--pin",
        "cuda",
        "--json",
    ]);
    assert_exit(&o, 0);
    let p = json(&o);
    assert_eq!(
        p["shards"].as_array().unwrap().len(),
        2,
        "one shard per prefault thread"
    );
    assert_eq!(
        p["pin_plan"]["chunks"].as_array().unwrap().len(),
        1,
        "4 GiB fits one 64 GiB chunk"
    );
    assert!(p["predicted_seconds"]["prefault"].as_f64().unwrap() > 0.0);
    assert!(p["predicted_seconds"]["pin"].as_f64().unwrap() > 0.0);
    let cfg = temp_file(
        "chunks.toml",
        "size = \"10GiB\"\nblock_size = \"3MiB\"\n[cuda]\nchunk_size = \"4GiB\"\n",
    );
    let o = hostpool(&[
        "plan",
        "--config",
        cfg.to_str().unwrap(),
        "--pin",
        "cuda",
        "--json",
    ]);
    assert_exit(&o, 0);
    let chunks = json(&o)["pin_plan"]["chunks"].as_array().unwrap().clone();
    assert_eq!(chunks.len(), 3);
    for c in &chunks[..2] {
        assert_eq!(
            c["len"].as_u64().unwrap() % (3 << 20),
            0,
            "chunks never split a 3 MiB block"
        );
    }
    let human = hostpool(&["plan", "--size", "4GiB", "--pin", "cuda"]);
    assert_exit(&human, 0);
    let out = stdout(&human);
    assert!(
        out.contains("predicted") && out.contains("chunk(s)") && out.contains("shards"),
        "{out}"
    );
}

/// Engines' blocks need not be multiples of 4 KiB (vLLM's registration tests
/// use 61 × 512 B): the pool plans and builds, and its chunks are cut on
/// multiples of lcm(block, page).
#[test]
fn blocks_that_are_not_page_multiples_plan_and_build_with_chunks_on_their_lcm_with_the_page() {
    for (block, unit) in [(61 * 512u64, 61 * 4096u64), (1, 4096), (1000, 125 * 4096)] {
        let cfg = temp_file(
            &format!("block-{block}.toml"),
            &format!("size = \"16MiB\"\nblock_size = {block}\n[cuda]\nchunk_size = \"1MiB\"\n"),
        );
        let o = hostpool(&[
            "plan",
            "--config",
            cfg.to_str().unwrap(),
            "--pin",
            "cuda",
            "--json",
        ]);
        assert_exit(&o, 0);
        let plan = &json(&o)["pin_plan"];
        assert_eq!(plan["block"], block, "{plan}");
        let chunks: Vec<(u64, u64)> = plan["chunks"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| (c["offset"].as_u64().unwrap(), c["len"].as_u64().unwrap()))
            .collect();
        assert!(chunks.len() > 2, "{plan}");
        assert_tiles_on_unit(&chunks, 16 << 20, unit, block, &format!("block {block}"));
        let o = hostpool(&["alloc", "--config", cfg.to_str().unwrap(), "--json"]);
        assert_exit(&o, 0);
        assert_eq!(json(&o)["mapped_bytes"], 16 << 20);
    }
}

#[test]
fn vllm_hisparse_config_works_unchanged() {
    let cfg = temp_file(
        "hisparse.json",
        "{\"host_pool_gib\": 1, \"host_pool_dir\": \"/dev/shm\"}",
    );
    let o = hostpool(&["plan", "--config", cfg.to_str().unwrap(), "--json"]);
    assert_exit(&o, 0);
    let p = json(&o);
    assert_eq!(p["logical_bytes"], 1u64 << 30);
    assert_eq!(p["backing"], "shm-segmented", "auto: /dev/shm is tmpfs");
}

/// Run hostpool with extra environment variables.
fn hostpool_env(args: &[&str], env: &[(&str, &str)]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_hostpool"))
        .args(args)
        .env_remove("RUST_LOG")
        .envs(env.iter().copied())
        .output()
        .expect("run hostpool")
}

/// The exit-status contract of `docs/operators.md`, walked through representative
/// failures: bad input exits 2, a node that cannot hold the pool, a file in
/// the way and a failed system call exit 1, and every message names the
/// cause and the remedy.
#[test]
fn every_failure_exits_with_the_documented_status_naming_cause_and_remedy() {
    let zero_block = temp_file("zero-block.toml", "size = \"64MiB\"\nblock_size = \"0B\"\n");
    // 61 × 512 B (vLLM's unit) on 4 KiB pages: lcm = 244 KiB, more than 64 KiB.
    let unit_beyond_pool = temp_file(
        "unit-beyond-pool.toml",
        "size = \"64KiB\"\nblock_size = 31232\n",
    );
    let huge_gib = temp_file("huge-gib.json", "{\"host_pool_gib\": 1e30}");
    let not_a_dir = temp_file("not-a-dir", "");
    let not_a_dir_text = format!(
        "{} is not a directory (it is a file)",
        not_a_dir.to_str().unwrap()
    );
    let name = format!("exit-table-{}", std::process::id());
    // A control file of another user in the way of a shared pool.
    let foreign = TempFile(PathBuf::from(format!("/dev/shm/hostpool-{name}.ctl")));
    let root = rustix::process::geteuid().is_root();
    if root {
        std::fs::write(&foreign.0, vec![0u8; 1 << 16]).unwrap();
        std::os::unix::fs::chown(&foreign.0, Some(65534), Some(65534)).unwrap();
    }
    struct Case<'a> {
        what: &'a str,
        args: Vec<&'a str>,
        env: Vec<(&'a str, &'a str)>,
        code: i32,
        says: Vec<&'a str>,
    }
    let mut cases = vec![
        Case {
            what: "decimal size",
            args: vec!["alloc", "--size", "384G"],
            env: vec![],
            code: 2,
            says: vec!["384G", "GiB"],
        },
        Case {
            what: "unknown backing",
            args: vec!["alloc", "--backing", "nope"],
            env: vec![],
            code: 2,
            says: vec!["nope", "available:"],
        },
        Case {
            what: "zero block size",
            args: vec!["plan", "--config", zero_block.to_str().unwrap()],
            env: vec![],
            code: 2,
            says: vec![
                "block_size = 0 bytes",
                "not a positive number of bytes",
                "lcm(block_size, page size)",
                "4 KiB pages",
                "64 MiB (67108864 bytes) pool",
                "any positive size",
            ],
        },
        Case {
            what: "block whose lcm with the page is more than the pool",
            args: vec!["alloc", "--config", unit_beyond_pool.to_str().unwrap()],
            env: vec![],
            code: 2,
            says: vec![
                "block_size = 30.50 KiB (31232 bytes)",
                "4 KiB (4096 bytes) page size",
                "lcm(block_size, page size) = 244 KiB (249856 bytes)",
                "more than the 64 KiB (65536 bytes) pool",
                "or a larger pool",
            ],
        },
        Case {
            what: "absurd host_pool_gib",
            args: vec!["alloc", "--config", huge_gib.to_str().unwrap()],
            env: vec![],
            code: 2,
            says: vec!["host_pool_gib", "67108864 GiB (64 PiB)"],
        },
        Case {
            what: "gc of a dir that does not exist",
            args: vec!["gc", "--dir", "/nonexistent/hostpool-gc"],
            env: vec![],
            code: 2,
            says: vec![
                "gc --dir /nonexistent/hostpool-gc does not exist",
                "leave --dir out",
            ],
        },
        Case {
            what: "config that never ends",
            args: vec!["alloc", "--config", "/dev/zero"],
            env: vec![],
            code: 2,
            says: vec!["/dev/zero", "larger than 1 MiB", "--config"],
        },
        Case {
            what: "config that is not text",
            args: vec!["alloc", "--config", "/dev/urandom"],
            env: vec![],
            code: 2,
            says: vec!["/dev/urandom", "not UTF-8 text"],
        },
        Case {
            what: "config that is a directory",
            args: vec!["plan", "--config", "/"],
            env: vec![],
            code: 2,
            says: vec!["config file /", "is a directory"],
        },
        Case {
            what: "dir that is a device",
            args: vec!["alloc", "--size", "4MiB", "--dir", "/dev/null"],
            env: vec![],
            code: 2,
            says: vec!["/dev/null is not a directory (it is a character device)"],
        },
        Case {
            what: "dir that is a file, for a named backing",
            args: vec![
                "alloc",
                "--size",
                "4MiB",
                "--backing",
                "shm-segmented",
                "--dir",
                not_a_dir.to_str().unwrap(),
            ],
            env: vec![],
            code: 2,
            says: vec![&not_a_dir_text],
        },
        Case {
            what: "size beyond the address space",
            args: vec!["alloc", "--size", "100PiB"],
            env: vec![],
            code: 2,
            says: vec!["100 PiB", "64 PiB", "ask for at most"],
        },
        Case {
            what: "absurd attach timeout",
            args: vec![
                "alloc",
                "--size",
                "16MiB",
                "--dir",
                "/dev/shm",
                "--shared",
                "exit-table-t",
                "--world",
                "2",
                "--rank",
                "0",
                "--attach-timeout",
                "1e20",
            ],
            env: vec![],
            code: 2,
            says: vec!["more than one day", "86400"],
        },
        Case {
            what: "node shortage",
            args: vec!["alloc", "--size", "100TiB"],
            env: vec![],
            code: 1,
            says: vec!["cannot hold the pool", "100 TiB"],
        },
        Case {
            what: "failed mmap (failpoint)",
            args: vec!["alloc", "--size", "64MiB"],
            env: vec![("HOSTPOOL_TEST_FAILPOINTS", "anon-mmap=ENOMEM")],
            code: 1,
            says: vec!["mmap(MAP_ANONYMOUS)", "64 MiB", "vm.overcommit_memory"],
        },
        Case {
            what: "EIO at the populate probe (failpoint), auto",
            args: vec!["alloc", "--size", "64MiB"],
            env: vec![("HOSTPOOL_TEST_FAILPOINTS", "populate-write-probe=EIO")],
            code: 1,
            says: vec![
                "MADV_POPULATE_WRITE) probe",
                "other than EINVAL",
                "prefault = \"touch\"",
            ],
        },
        Case {
            what: "EIO at the populate probe (failpoint), populate-write",
            args: vec!["alloc", "--size", "64MiB", "--prefault", "populate-write"],
            env: vec![("HOSTPOOL_TEST_FAILPOINTS", "populate-write-probe=EIO")],
            code: 1,
            says: vec!["MADV_POPULATE_WRITE) probe", "other than EINVAL"],
        },
    ];
    if root {
        cases.push(Case {
            what: "control file owned by another user",
            args: vec![
                "alloc",
                "--size",
                "16MiB",
                "--dir",
                "/dev/shm",
                "--shared",
                &name,
                "--world",
                "2",
                "--rank",
                "1",
                "--attach-timeout",
                "2",
                "--rendezvous",
                "file",
            ],
            env: vec![],
            code: 1,
            says: vec!["refusing pool file", "uid 65534", "same user"],
        });
    } else {
        eprintln!("skip the foreign-owner case: needs root to chown a file");
    }
    for case in &cases {
        let o = hostpool_env(&case.args, &case.env);
        assert_exit(&o, case.code);
        let err = stderr(&o);
        for want in &case.says {
            assert!(
                err.contains(want),
                "{}: missing {want:?} in:\n{err}",
                case.what
            );
        }
        if case.code == 1 {
            assert!(
                !err.contains("invalid configuration"),
                "{}: {err}",
                case.what
            );
        }
    }
    // The probe's EIO is reported, not taken for a kernel without the call.
    let o = hostpool_env(
        &["alloc", "--size", "64MiB", "--prefault", "populate-write"],
        &[("HOSTPOOL_TEST_FAILPOINTS", "populate-write-probe=EIO")],
    );
    assert!(
        !stderr(&o).contains("lacks MADV_POPULATE_WRITE"),
        "{}",
        stderr(&o)
    );
    drop(foreign);
}

/// A RUST_LOG that is not a filter is said once, at the default level,
/// and logs written to a pipe or file carry no terminal colour codes.
#[test]
fn a_bad_rust_log_is_said_and_logs_to_a_pipe_are_plain() {
    let o = hostpool_env(&["alloc", "--size", "4MiB"], &[("RUST_LOG", "foo=bar=baz")]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let err = stderr(&o);
    assert!(
        err.contains("RUST_LOG `foo=bar=baz` is not a log filter")
            && err.contains("logging at `warn` instead"),
        "{err}"
    );
    assert!(
        !err.contains('\u{1b}'),
        "no ANSI escapes on a pipe: {err:?}"
    );
}

/// Output to a pipe nobody reads (`hostpool alloc 2>&1 | head -1` once
/// head has gone): the report cannot be written, which is exit 1, and the
/// error that says so cannot be either; that once panicked (exit 101).
#[test]
fn a_closed_stdout_and_stderr_is_exit_1_not_a_panic() {
    for args in [
        &["alloc", "--size", "4MiB"][..],
        &["alloc", "--size", "4MiB", "--json"],
        &["plan", "--size", "4MiB"],
    ] {
        let (reader, writer) = std::io::pipe().unwrap();
        drop(reader);
        let o = Command::new(env!("CARGO_BIN_EXE_hostpool"))
            .args(args)
            .env_remove("RUST_LOG")
            .stdout(writer.try_clone().unwrap())
            .stderr(writer)
            .status()
            .expect("run hostpool");
        assert_eq!(o.code(), Some(1), "{args:?}: {o:?}");
    }
}

/// The workspace's version, as `Cargo.toml` says it.
fn workspace_version() -> String {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let manifest = std::fs::read_to_string(root.join("Cargo.toml")).unwrap();
    let table = manifest
        .split("[workspace.package]")
        .nth(1)
        .expect("Cargo.toml has [workspace.package]");
    let line = table
        .lines()
        .find(|l| l.trim_start().starts_with("version"))
        .expect("[workspace.package] has a version");
    line.split('"').nth(1).unwrap().to_string()
}

#[test]
fn the_version_is_the_workspaces_in_the_flag_and_every_report() {
    let want = workspace_version();
    let o = hostpool(&["--version"]);
    assert_exit(&o, 0);
    assert_eq!(stdout(&o).trim(), format!("hostpool {want}"));
    let r = json(&hostpool(&["alloc", "--size", "4MiB", "--json"]));
    assert_eq!(r["version"], want.as_str(), "{r}");
    let p = json(&hostpool(&["plan", "--size", "4MiB", "--json"]));
    assert_eq!(p["version"], want.as_str(), "{p}");
}
