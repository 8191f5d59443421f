//! The `rdma` registrar through its real FFI path: `libloading` opens a
//! libibverbs (the `fake-ibverbs` test double, by path through
//! `[rdma] library`, or the system's when it is installed) and every call goes
//! through the C ABI.
//!
//! The double is configured by environment variables and keeps per-process
//! state (counters, live objects), so each scenario runs in a child: this test
//! binary re-executes itself with the scenario in `RDMA_FFI_CHILD`, and the
//! `child` test runs it and prints one JSON result line. The parent reads that
//! line and the double's call log (`FAKE_IBV_LOG`) and checks both.
//!
//! Finding the double, from a fresh clone with a plain `cargo test`: a
//! `cargo build` of the workspace leaves it at `target/<profile>/libibverbs.so`
//! (`cargo test` alone builds only the double's own test harness, not its
//! cdylib), and that file is used when it is newer than the double's sources.
//! Otherwise the first scenario of the run builds it with
//! `cargo build -p fake-ibverbs --target-dir target/fake-ibverbs`: a target
//! directory of its own, so it never waits on the outer cargo's lock (about
//! 3 s the first time, a no-op after). `HOSTPOOL_FAKE_IBVERBS` names a built
//! double instead. The double is loaded by path through `[rdma] library`, not
//! through `LD_LIBRARY_PATH`, so the path under test is the one operators use.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::SystemTime;

use pool_core::plugin::RegistrarPlugin;
use pool_core::{ByteSize, Error, PageSize, Pool, PoolConfig, PoolPlan, Quiet};
use pool_core::{format_bytes, mr_regions};
use serde_json::{Value, json};

use backing_anon as _;
use registrar_rdma as _;

const CHILD_ENV: &str = "RDMA_FFI_CHILD";
const MARK: &str = "RDMA-FFI-RESULT ";
const MIB: u64 = 1 << 20;

// ---------------------------------------------------------------- the double

fn newest_mtime(dir: &Path) -> SystemTime {
    let mut newest = SystemTime::UNIX_EPOCH;
    if let Ok(entries) = std::fs::read_dir(dir) {
        for e in entries.flatten() {
            let p = e.path();
            let t = if p.is_dir() {
                newest_mtime(&p)
            } else {
                e.metadata()
                    .and_then(|m| m.modified())
                    .unwrap_or(SystemTime::UNIX_EPOCH)
            };
            newest = newest.max(t);
        }
    }
    newest
}

fn mtime(p: &Path) -> Option<SystemTime> {
    std::fs::metadata(p).and_then(|m| m.modified()).ok()
}

/// The built `libibverbs.so` of `fake-ibverbs` (see the module docs).
fn fake_library() -> &'static Path {
    static PATH: OnceLock<PathBuf> = OnceLock::new();
    PATH.get_or_init(|| {
        if let Some(p) = std::env::var_os("HOSTPOOL_FAKE_IBVERBS") {
            return PathBuf::from(p);
        }
        let crate_dir = Path::new(env!("CARGO_MANIFEST_DIR"));
        let fake_dir = crate_dir.join("../fake-ibverbs");
        let sources = newest_mtime(&fake_dir.join("src"))
            .max(mtime(&fake_dir.join("Cargo.toml")).unwrap_or(SystemTime::UNIX_EPOCH));
        // This binary is target/<profile>/deps/ffi-<hash>.
        let exe = std::env::current_exe().expect("current_exe");
        let profile_dir = exe
            .parent()
            .and_then(Path::parent)
            .expect("test binary in target/<profile>/deps");
        let member = profile_dir.join("libibverbs.so");
        if mtime(&member).is_some_and(|t| t >= sources) {
            return member;
        }
        let target = profile_dir
            .parent()
            .unwrap_or(profile_dir)
            .join("fake-ibverbs");
        let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
        let status = Command::new(cargo)
            .arg("build")
            .arg("-p")
            .arg("fake-ibverbs")
            .arg("--manifest-path")
            .arg(crate_dir.join("../../Cargo.toml"))
            .arg("--target-dir")
            .arg(&target)
            .env_remove("CARGO_TARGET_DIR")
            .env_remove("CARGO_BUILD_TARGET")
            .output()
            .expect("run cargo to build fake-ibverbs");
        assert!(
            status.status.success(),
            "cargo build -p fake-ibverbs failed:\n{}",
            String::from_utf8_lossy(&status.stderr)
        );
        let built = target.join("debug/libibverbs.so");
        assert!(built.exists(), "{} was not built", built.display());
        built
    })
}

// ---------------------------------------------------------------- scenarios

/// One call of the double's log: `CALL key=value ...`.
#[derive(Debug, Clone)]
struct Call {
    name: String,
    kv: BTreeMap<String, String>,
}

impl Call {
    fn get(&self, k: &str) -> &str {
        self.kv.get(k).map_or("", String::as_str)
    }
    fn ok(&self) -> bool {
        self.get("result") == "ok"
    }
    fn num(&self, k: &str) -> u64 {
        let v = self.get(k);
        match v.strip_prefix("0x") {
            Some(hex) => u64::from_str_radix(hex, 16).unwrap(),
            None => v
                .parse()
                .unwrap_or_else(|_| panic!("{k}={v:?} in {self:?}")),
        }
    }
}

#[derive(Debug)]
struct Run {
    out: Value,
    log: Vec<Call>,
}

impl Run {
    fn calls(&self, name: &str) -> Vec<&Call> {
        self.log.iter().filter(|c| c.name == name).collect()
    }
    fn error(&self) -> &Value {
        assert_eq!(
            self.out["ok"],
            json!(false),
            "expected an error: {:#}",
            self.out
        );
        &self.out["error"]
    }
    fn message(&self) -> String {
        self.error()["display"].as_str().unwrap().to_string()
    }
}

fn parse_log(text: &str) -> Vec<Call> {
    text.lines()
        .filter(|l| !l.is_empty())
        .map(|l| {
            let mut parts = l.split(' ');
            let name = parts.next().unwrap().to_string();
            let kv = parts
                .filter_map(|p| p.split_once('='))
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect();
            Call { name, kv }
        })
        .collect()
}

/// Run a scenario in a child with the double's variables, optionally with
/// a lowered `RLIMIT_MEMLOCK` and without `CAP_IPC_LOCK`.
fn run_child(spec: Value, env: &[(&str, &str)], memlock: Option<(u64, u64)>) -> Run {
    static N: AtomicUsize = AtomicUsize::new(0);
    let mut spec = spec;
    if spec["rdma"].get("library").is_none() && spec["real"] != json!(true) {
        spec["rdma"]["library"] = json!(fake_library().to_str().unwrap());
    }
    let log = std::env::temp_dir().join(format!(
        "rdma-ffi-{}-{}.log",
        std::process::id(),
        N.fetch_add(1, Ordering::SeqCst)
    ));
    let _ = std::fs::remove_file(&log);
    let mut cmd = Command::new(std::env::current_exe().unwrap());
    cmd.args([
        "child",
        "--exact",
        "--ignored",
        "--nocapture",
        "--test-threads=1",
    ])
    .env(CHILD_ENV, spec.to_string())
    .env("FAKE_IBV_LOG", &log);
    for (k, _) in std::env::vars() {
        if k.starts_with("FAKE_IBV_") && k != "FAKE_IBV_LOG" {
            cmd.env_remove(k);
        }
    }
    for (k, v) in env {
        cmd.env(k, v);
    }
    if let Some((soft, hard)) = memlock {
        sys::lower_memlock_at_exec(&mut cmd, soft, hard);
    }
    let output = cmd.output().expect("run the child");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    let line = stdout
        .lines()
        .find_map(|l| l.find(MARK).map(|at| &l[at + MARK.len()..]))
        .unwrap_or_else(|| {
            panic!("no result from the child\nstdout:\n{stdout}\nstderr:\n{stderr}")
        });
    assert!(
        !stdout.contains("panicked") && !stderr.contains("panicked"),
        "a panic escaped:\n{stdout}\n{stderr}"
    );
    let log_text = std::fs::read_to_string(&log).unwrap_or_default();
    let _ = std::fs::remove_file(&log);
    Run {
        out: serde_json::from_str(line).unwrap(),
        log: parse_log(&log_text),
    }
}

fn run(spec: Value, env: &[(&str, &str)]) -> Run {
    run_child(spec, env, None)
}

fn error_json(e: &Error) -> Value {
    let mut chain = Vec::new();
    let mut next = std::error::Error::source(e);
    while let Some(s) = next {
        chain.push(s.to_string());
        next = s.source();
    }
    json!({
        "display": e.to_string(),
        "debug": format!("{e:?}"),
        "not_available": e.is_not_available(),
        "usage": e.is_usage(),
        "errno": e.errno(),
        "sources": chain,
    })
}

fn pool_config(spec: &Value) -> PoolConfig {
    PoolConfig {
        size: ByteSize(spec["size"].as_u64().unwrap_or(8 * MIB)),
        backing: "anon".into(),
        block_size: spec["block"].as_u64().map(ByteSize),
        ..PoolConfig::default()
    }
}

/// Runs in the child: the scenario in `RDMA_FFI_CHILD`.
fn run_spec(spec: &Value) -> Value {
    let mut config = pool_config(spec);
    let table = spec["rdma"].clone();
    let memlock = serde_json::to_value(pool_core::host::memlock::state()).unwrap();
    if spec["mode"] == "probe" {
        let options: registrar_rdma::RdmaOptions = serde_json::from_value(table).unwrap();
        return match registrar_rdma::probe(&options) {
            Ok(devices) => json!({"ok": true, "devices": devices}),
            Err(e) => json!({"ok": false, "error": error_json(&e)}),
        };
    }
    if spec["mode"] == "plan" {
        config.register = vec!["rdma".into()];
        config.plugins.insert("rdma".into(), table);
        return match PoolPlan::new(config) {
            Ok(plan) => json!({"ok": true, "plan": serde_json::to_value(plan.report()).unwrap()}),
            Err(e) => json!({"ok": false, "error": error_json(&e)}),
        };
    }
    if spec["mode"] == "pool" {
        config.register = vec!["rdma".into()];
        config.plugins.insert("rdma".into(), table);
        let plan = match PoolPlan::new(config) {
            Ok(p) => p,
            Err(e) => return json!({"ok": false, "error": error_json(&e)}),
        };
        return match Pool::build(&plan, &Quiet) {
            Ok(pool) => {
                let span = pool.region().unwrap().span();
                let report = serde_json::to_value(pool.report()).unwrap();
                let done = pool.teardown();
                json!({
                    "ok": true,
                    "region": {"addr": span.addr as u64, "len": span.len, "page": span.page.get()},
                    "report": report,
                    "teardown_issues": done.teardown_issues,
                })
            }
            Err(e) => json!({"ok": false, "error": error_json(&e)}),
        };
    }
    let pool = Pool::build(&PoolPlan::new(config.clone()).unwrap(), &Quiet).unwrap();
    let region = pool.region().unwrap();
    let region_json = json!({"addr": region.addr() as u64, "len": region.mapped_len(), "page": region.page().get()});
    let plugin = pool_core::plugin::lookup::<RegistrarPlugin>("rdma").unwrap();
    let registrar = match (plugin.build)(Some(&table)) {
        Ok(r) => r,
        Err(e) => return json!({"ok": false, "error": error_json(&e), "memlock": memlock}),
    };
    let out = match registrar.register(region, &pool_core::plugin::PinContext::of(&config)) {
        Ok(reg) => {
            let details = reg.details();
            let issues = if spec["deregister"] == json!(false) {
                std::mem::forget(reg);
                json!(null)
            } else {
                json!(reg.deregister())
            };
            let after = serde_json::to_value(pool_core::host::memlock::state()).unwrap();
            json!({"ok": true, "details": details, "deregister": issues, "region": region_json, "memlock": memlock, "memlock_after": after})
        }
        Err(e) => {
            json!({"ok": false, "error": error_json(&e), "region": region_json, "memlock": memlock})
        }
    };
    drop(pool);
    out
}

#[test]
#[ignore = "a child process of the tests above; they run it with --ignored"]
fn child() {
    let Ok(spec) = std::env::var(CHILD_ENV) else {
        panic!("child runs only as a child of this file's tests ({CHILD_ENV} is unset)");
    };
    let spec: Value = serde_json::from_str(&spec).unwrap();
    let out = run_spec(&spec);
    println!("\n{MARK}{out}");
}

// ---------------------------------------------------------------- checks

/// Every region registered was deregistered, after it and exactly once;
/// every protection domain freed and every device closed.
fn assert_nothing_left(run: &Run) {
    let mut live: BTreeMap<(String, u64, u64), usize> = BTreeMap::new();
    for c in &run.log {
        let key = || (c.get("dev").to_string(), c.num("addr"), c.num("len"));
        match c.name.as_str() {
            "ibv_reg_mr" if c.ok() => *live.entry(key()).or_default() += 1,
            "ibv_dereg_mr" => {
                assert!(c.ok(), "a deregistration failed: {c:?}");
                let n = live
                    .get_mut(&key())
                    .unwrap_or_else(|| panic!("{c:?} of nothing"));
                *n -= 1;
            }
            _ => {}
        }
    }
    assert!(
        live.values().all(|n| *n == 0),
        "left registered: {live:?}\n{:#?}",
        run.log
    );
    let count = |name: &str| run.calls(name).iter().filter(|c| c.ok()).count();
    assert_eq!(
        count("ibv_alloc_pd"),
        count("ibv_dealloc_pd"),
        "{:#?}",
        run.log
    );
    assert_eq!(
        count("ibv_open_device"),
        count("ibv_close_device"),
        "{:#?}",
        run.log
    );
    assert_eq!(
        count("ibv_get_device_list"),
        count("ibv_free_device_list"),
        "{:#?}",
        run.log
    );
}

/// On each device: deregistrations are the registrations in reverse, then
/// the protection domain, then the device.
fn assert_reverse_per_device(run: &Run) {
    let devices: Vec<String> = run
        .calls("ibv_open_device")
        .iter()
        .map(|c| c.get("dev").to_string())
        .collect();
    for dev in devices {
        let on: Vec<&Call> = run.log.iter().filter(|c| c.get("dev") == dev).collect();
        let regs: Vec<u64> = on
            .iter()
            .filter(|c| c.name == "ibv_reg_mr" && c.ok())
            .map(|c| c.num("addr"))
            .collect();
        let deregs: Vec<u64> = on
            .iter()
            .filter(|c| c.name == "ibv_dereg_mr")
            .map(|c| c.num("addr"))
            .collect();
        let mut reversed = regs.clone();
        reversed.reverse();
        assert_eq!(deregs, reversed, "{dev}: deregistration is not the reverse");
        let tail: Vec<&str> = on
            .iter()
            .filter(|c| c.name != "ibv_reg_mr" && c.name != "rendezvous")
            .map(|c| c.name.as_str())
            .skip_while(|n| *n != "ibv_dereg_mr" && *n != "ibv_dealloc_pd")
            .filter(|n| *n != "ibv_dereg_mr")
            .collect();
        assert_eq!(
            tail,
            ["ibv_dealloc_pd", "ibv_close_device"],
            "{dev}: {on:#?}"
        );
    }
}

/// The reported regions of each device are exactly `mr_regions` at its
/// `max_mr_size`, at the pool's addresses, with the keys the device gave.
fn assert_regions_match_layout(details: &Value, region: &Value, block: u64, log: &[Call]) {
    let base = region["addr"].as_u64().unwrap();
    let mapped = region["len"].as_u64().unwrap();
    let page = PageSize::new(region["page"].as_u64().unwrap()).unwrap();
    for dev in details["devices"].as_array().unwrap() {
        let name = dev["name"].as_str().unwrap();
        let max = dev["max_mr_size"].as_u64().unwrap();
        let want = mr_regions(mapped, page, block, max).unwrap();
        let got = dev["regions"].as_array().unwrap();
        assert_eq!(got.len(), want.len(), "{name}: {got:#?}");
        for (r, w) in got.iter().zip(&want) {
            assert_eq!(r["offset"].as_u64(), Some(w.offset), "{name}");
            assert_eq!(r["len"].as_u64(), Some(w.len), "{name}");
            let addr = r["addr_u64"].as_u64().unwrap();
            assert_eq!(addr, base + w.offset, "{name}");
            assert_eq!(r["addr"], json!(format!("{addr:#x}")), "{name}");
            assert!(w.len <= max, "{name}: a region longer than max_mr_size");
            if log.is_empty() {
                continue; // the real library keeps no log
            }
            let call = log
                .iter()
                .find(|c| {
                    c.name == "ibv_reg_mr"
                        && c.ok()
                        && c.get("dev") == name
                        && c.num("addr") == addr
                })
                .unwrap_or_else(|| panic!("{name}: no ibv_reg_mr of {addr:#x}"));
            assert_eq!(call.num("len"), w.len);
            assert_eq!(
                call.num("access"),
                7,
                "local write | remote write | remote read"
            );
            assert_eq!(r["lkey"].as_u64(), Some(call.num("lkey")), "{name}");
            assert_eq!(r["rkey"].as_u64(), Some(call.num("rkey")), "{name}");
        }
    }
}

fn contains_all(msg: &str, wants: &[&str]) {
    for w in wants {
        assert!(msg.contains(w), "missing {w:?} in: {msg}");
    }
}

// ---------------------------------------------------------------- tests

#[test]
fn a_missing_library_is_not_available_naming_the_library_and_the_package() {
    let run = run(
        json!({"rdma": {"library": "/nonexistent/dir/libibverbs.so.1"}}),
        &[],
    );
    let e = run.error();
    assert_eq!(e["not_available"], json!(true), "{e:#}");
    contains_all(
        &run.message(),
        &[
            "/nonexistent/dir/libibverbs.so.1",
            "cannot open shared object file",
            "libibverbs1",
            "rdma-core",
            "[rdma] library",
        ],
    );
}

#[test]
fn a_library_that_is_not_libibverbs_is_not_available_naming_the_symbol() {
    let run = run(json!({"rdma": {"library": "libc.so.6"}}), &[]);
    assert_eq!(run.error()["not_available"], json!(true));
    contains_all(
        &run.message(),
        &["libc.so.6", "ibv_get_device_list", "not libibverbs"],
    );
}

#[test]
fn enosys_from_the_device_list_is_not_available_kernel_without_rdma() {
    let run = run(json!({"rdma": {}}), &[("FAKE_IBV_DEVICES", "ENOSYS")]);
    assert_eq!(run.error()["not_available"], json!(true));
    contains_all(
        &run.message(),
        &["kernel without RDMA", "ENOSYS", "ib_uverbs"],
    );
    let names: Vec<&str> = run.log.iter().map(|c| c.name.as_str()).collect();
    assert_eq!(names, ["ibv_get_device_list"]);
}

#[test]
fn probe_lists_every_device_with_its_max_mr_size_and_registers_nothing() {
    let run = run(
        json!({"mode": "probe", "rdma": {"devices": ["mlx5_1"]}}),
        &[
            ("FAKE_IBV_DEVICES", "mlx5_0,mlx5_1"),
            ("FAKE_IBV_MAX_MR_SIZE", "68719476736"),
        ],
    );
    assert_eq!(run.out["ok"], json!(true), "{:#}", run.out);
    assert_eq!(
        run.out["devices"],
        json!([
            {"name": "mlx5_0", "max_mr_size": 68719476736u64, "error": null},
            {"name": "mlx5_1", "max_mr_size": 68719476736u64, "error": null},
        ])
    );
    assert!(run.calls("ibv_reg_mr").is_empty(), "{:?}", run.log);
    assert_eq!(run.calls("ibv_query_device").len(), 2);
    assert_eq!(run.calls("ibv_close_device").len(), 2);
    assert_nothing_left(&run);
}

#[test]
fn probe_says_enosys_no_devices_and_a_missing_library_as_registration_would() {
    let run = run(
        json!({"mode": "probe", "rdma": {}}),
        &[("FAKE_IBV_DEVICES", "ENOSYS")],
    );
    assert_eq!(run.error()["not_available"], json!(true));
    contains_all(&run.message(), &["kernel without RDMA", "ENOSYS"]);
    let run = run_child(
        json!({"mode": "probe", "rdma": {}}),
        &[("FAKE_IBV_DEVICES", "")],
        None,
    );
    assert_eq!(run.out, json!({"ok": true, "devices": []}));
    let missing = run_child(
        json!({"mode": "probe", "rdma": {"library": "/nonexistent/libibverbs.so.1"}}),
        &[],
        None,
    );
    assert_eq!(missing.error()["not_available"], json!(true));
    contains_all(
        &missing.message(),
        &["/nonexistent/libibverbs.so.1", "libibverbs1"],
    );
}

#[test]
fn zero_devices_is_not_available() {
    let run = run(json!({"rdma": {}}), &[("FAKE_IBV_DEVICES", "")]);
    assert_eq!(run.error()["not_available"], json!(true));
    contains_all(&run.message(), &["no RDMA devices", "ibv_devices"]);
    assert!(run.calls("ibv_open_device").is_empty());
    assert_nothing_left(&run);
}

#[test]
fn an_unknown_device_name_lists_the_available_ones() {
    let run = run(
        json!({"rdma": {"devices": ["mlx5_1", "mlx5_7"]}}),
        &[("FAKE_IBV_DEVICES", "mlx5_0,mlx5_1")],
    );
    assert_eq!(run.error()["not_available"], json!(true));
    contains_all(
        &run.message(),
        &["`mlx5_7`", "mlx5_0, mlx5_1", "[rdma] devices"],
    );
    assert!(run.calls("ibv_open_device").is_empty(), "{:#?}", run.log);
    assert_nothing_left(&run);
}

#[test]
fn two_devices_register_in_parallel_and_regions_match_mr_regions() {
    let block = MIB;
    let run = run(
        json!({"size": 16 * MIB, "block": block, "rdma": {}}),
        &[
            ("FAKE_IBV_DEVICES", "mlx5_0,mlx5_1"),
            ("FAKE_IBV_MAX_MR_SIZE", "3145728"),
            ("FAKE_IBV_REG_RENDEZVOUS", "2"),
        ],
    );
    assert_eq!(run.out["ok"], json!(true), "{:#}", run.out);
    let details = &run.out["details"];
    let names: Vec<&str> = details["devices"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["mlx5_0", "mlx5_1"]);
    assert_eq!(
        details["devices"][0]["regions"].as_array().unwrap().len(),
        6
    );
    assert_regions_match_layout(details, &run.out["region"], block, &run.log);
    assert_eq!(
        details["access"],
        json!(["local-write", "remote-write", "remote-read"])
    );

    // Parallel: both devices were inside ibv_reg_mr at once, on two threads.
    let meets = run.calls("rendezvous");
    assert_eq!(meets.len(), 2, "{:#?}", run.log);
    assert!(
        meets.iter().all(|c| c.ok()),
        "serial registration: {meets:#?}"
    );
    let tids: std::collections::BTreeSet<&str> = run
        .calls("ibv_reg_mr")
        .iter()
        .map(|c| c.get("tid"))
        .collect();
    assert_eq!(tids.len(), 2, "one thread per device");

    assert_eq!(run.out["deregister"], json!([]));
    assert_reverse_per_device(&run);
    assert_nothing_left(&run);
}

#[test]
fn a_small_max_mr_size_splits_on_block_boundaries() {
    // unit = lcm(4 KiB, 768 KiB) = 768 KiB; 2.5 MiB holds three: 2.25 MiB regions.
    let block = 768 << 10;
    let run = run(
        json!({"size": 8 * MIB, "block": block, "rdma": {}}),
        &[("FAKE_IBV_MAX_MR_SIZE", "2621440")],
    );
    assert_eq!(run.out["ok"], json!(true), "{:#}", run.out);
    let regions = run.out["details"]["devices"][0]["regions"]
        .as_array()
        .unwrap();
    let lens: Vec<u64> = regions.iter().map(|r| r["len"].as_u64().unwrap()).collect();
    assert_eq!(lens, [2304 << 10, 2304 << 10, 2304 << 10, 1280 << 10]);
    for r in regions {
        assert_eq!(
            r["offset"].as_u64().unwrap() % block,
            0,
            "a block was split"
        );
    }
    assert_regions_match_layout(&run.out["details"], &run.out["region"], block, &run.log);
    assert!(
        run.calls("ibv_reg_mr").iter().all(|c| c.ok()),
        "the device refused a region"
    );
    assert_nothing_left(&run);
}

#[test]
fn a_block_off_the_page_splits_on_its_lcm_with_the_page() {
    // vLLM's 61 × 512 B: unit = lcm(4 KiB, 31232) = 61 × 4 KiB = 244 KiB;
    // 1 MiB holds four: 976 KiB regions.
    let block = 61 * 512;
    let unit = 61 * 4096;
    let run = run(
        json!({"size": 8 * MIB, "block": block, "rdma": {}}),
        &[("FAKE_IBV_MAX_MR_SIZE", "1048576")],
    );
    assert_eq!(run.out["ok"], json!(true), "{:#}", run.out);
    let regions = run.out["details"]["devices"][0]["regions"]
        .as_array()
        .unwrap();
    assert_eq!(regions.len(), 9, "{regions:#?}");
    assert_eq!(regions[0]["len"].as_u64(), Some(4 * unit));
    for r in &regions[1..] {
        let offset = r["offset"].as_u64().unwrap();
        assert_eq!(
            offset % unit,
            0,
            "boundary {offset} is not on lcm(page, block)"
        );
        assert_eq!(offset % block, 0, "a block was split at {offset}");
    }
    assert_regions_match_layout(&run.out["details"], &run.out["region"], block, &run.log);
    assert!(
        run.calls("ibv_reg_mr").iter().all(|c| c.ok()),
        "the device refused a region"
    );
    assert_nothing_left(&run);
}

#[test]
fn a_block_larger_than_max_mr_size_is_refused_before_any_registration() {
    let run = run(
        json!({"size": 8 * MIB, "block": 4 * MIB, "rdma": {}}),
        &[("FAKE_IBV_MAX_MR_SIZE", "2097152")],
    );
    let msg = run.message();
    contains_all(
        &msg,
        &[
            "mlx5_0",
            "max_mr_size of 2 MiB",
            "4 MiB",
            "smaller block_size",
        ],
    );
    assert!(run.calls("ibv_reg_mr").is_empty());
    assert_nothing_left(&run);
}

#[test]
fn a_failed_registration_deregisters_the_earlier_ones_in_reverse_and_names_the_region() {
    let run = run(
        json!({"size": 8 * MIB, "rdma": {}}),
        &[
            ("FAKE_IBV_MAX_MR_SIZE", "1048576"),
            ("FAKE_IBV_FAIL_REG_AT", "4"),
        ],
    );
    let e = run.error();
    assert_eq!(
        e["not_available"],
        json!(false),
        "a failure, not a missing feature"
    );
    assert_eq!(e["errno"], json!(libc::ENOMEM));
    contains_all(
        &run.message(),
        &[
            "ibv_reg_mr",
            "region 4 of 8",
            "offset 0x300000 (3 MiB)",
            "for 1 MiB",
            "mlx5_0",
            "RLIMIT_MEMLOCK unless the process has CAP_IPC_LOCK",
            "nothing is left registered",
            "3 on mlx5_0",
        ],
    );
    if run.out["memlock"]["cap_ipc_lock"] == json!(true) {
        contains_all(&run.message(), &["the limit is not the cause", "dmesg"]);
    } else {
        contains_all(
            &run.message(),
            &["ulimit -l", "LimitMEMLOCK=infinity", "VmPin"],
        );
    }
    let regs = run.calls("ibv_reg_mr");
    assert_eq!(regs.len(), 4, "no registration after the failure");
    assert_eq!(regs[3].get("result"), "ENOMEM");
    let base = run.out["region"]["addr"].as_u64().unwrap();
    let deregs: Vec<u64> = run
        .calls("ibv_dereg_mr")
        .iter()
        .map(|c| c.num("addr") - base)
        .collect();
    assert_eq!(deregs, [2 * MIB, MIB, 0]);
    assert_reverse_per_device(&run);
    assert_nothing_left(&run);
}

#[test]
fn enomem_without_cap_ipc_lock_says_how_to_raise_the_limit() {
    let hard = memlock_limit(8 * MIB);
    let size = (hard / 2) & !4095;
    assert!(
        size >= 4096,
        "the memlock hard limit here is too low for this test"
    );
    let run = run_child(
        json!({"size": size, "rdma": {}}),
        &[("FAKE_IBV_FAIL_REG_AT", "1")],
        Some((hard, hard)),
    );
    assert_eq!(run.out["memlock"]["cap_ipc_lock"], json!(false));
    assert_eq!(run.error()["errno"], json!(libc::ENOMEM));
    contains_all(
        &run.message(),
        &[
            "no CAP_IPC_LOCK",
            &format!("a hard limit of {}", format_bytes(hard)),
            "ulimit -l",
            "--ulimit memlock=-1",
            "LimitMEMLOCK=infinity",
            "nothing was registered",
        ],
    );
    assert_nothing_left(&run);
}

#[test]
fn another_errno_names_the_region_offset_and_size() {
    let run = run(
        json!({"size": 8 * MIB, "rdma": {}}),
        &[
            ("FAKE_IBV_MAX_MR_SIZE", "2097152"),
            ("FAKE_IBV_FAIL_REG_AT", "2"),
            ("FAKE_IBV_FAIL_REG_ERRNO", "EIO"),
        ],
    );
    assert_eq!(run.error()["errno"], json!(libc::EIO));
    let msg = run.message();
    contains_all(
        &msg,
        &[
            "region 2 of 4",
            "offset 0x200000 (2 MiB)",
            "for 2 MiB",
            "dmesg",
        ],
    );
    assert!(!msg.contains("RLIMIT_MEMLOCK"), "{msg}");
    assert_nothing_left(&run);
}

#[test]
fn a_failure_on_one_device_rolls_back_every_device() {
    let run = run(
        json!({"size": 8 * MIB, "rdma": {}}),
        &[
            ("FAKE_IBV_DEVICES", "mlx5_0,mlx5_1"),
            ("FAKE_IBV_MAX_MR_SIZE", "1048576"),
            ("FAKE_IBV_FAIL_REG_AT", "mlx5_1:3"),
            ("FAKE_IBV_FAIL_REG_ERRNO", "EFAULT"),
        ],
    );
    assert_eq!(run.error()["errno"], json!(libc::EFAULT));
    contains_all(&run.message(), &["mlx5_1", "region 3 of 8", "not mapped"]);
    assert_reverse_per_device(&run);
    assert_nothing_left(&run);
}

#[test]
fn deregister_releases_everything_in_reverse() {
    let run = run(
        json!({"size": 8 * MIB, "rdma": {"devices": ["mlx5_0"]}}),
        &[("FAKE_IBV_MAX_MR_SIZE", "1048576")],
    );
    assert_eq!(run.out["ok"], json!(true), "{:#}", run.out);
    assert_eq!(run.out["deregister"], json!([]));
    assert_eq!(run.calls("ibv_dereg_mr").len(), 8);
    assert_reverse_per_device(&run);
    assert_nothing_left(&run);
}

#[test]
fn a_deregistration_the_device_refuses_is_a_teardown_issue_and_the_rest_goes_on() {
    let run = run(
        json!({"size": 4 * MIB, "rdma": {}}),
        &[
            ("FAKE_IBV_MAX_MR_SIZE", "1048576"),
            ("FAKE_IBV_FAIL_DEREG_AT", "2"),
        ],
    );
    assert_eq!(run.out["ok"], json!(true), "{:#}", run.out);
    let issues = run.out["deregister"].as_array().unwrap();
    let steps: Vec<&str> = issues.iter().map(|i| i["step"].as_str().unwrap()).collect();
    assert_eq!(
        steps,
        ["ibv_dereg_mr", "ibv_dealloc_pd", "ibv_close_device"]
    );
    contains_all(
        issues[0]["detail"].as_str().unwrap(),
        &["mlx5_0", "region 3", "offset 0x200000", "1 MiB", "busy"],
    );
    // The other three regions were still deregistered.
    let ok: Vec<&Call> = run
        .calls("ibv_dereg_mr")
        .into_iter()
        .filter(|c| c.ok())
        .collect();
    assert_eq!(ok.len(), 3);
}

/// A memlock limit for a child: `want`, or this process's hard limit when
/// that is lower (lowering needs no privilege, raising does).
fn memlock_limit(want: u64) -> u64 {
    let hard = rustix::process::getrlimit(rustix::process::Resource::Memlock).maximum;
    hard.map_or(want, |h| h.min(want)) & !4095
}

#[test]
fn the_memlock_bound_is_checked_before_any_call() {
    let limit = memlock_limit(64 << 10);
    let run = run_child(
        json!({"size": 8 * MIB, "rdma": {}}),
        &[],
        Some((limit, limit)),
    );
    let st = &run.out["memlock"];
    assert_eq!(st["cap_ipc_lock"], json!(false), "{st}");
    assert_eq!(st["hard"], json!(limit), "{st}");
    let e = run.error();
    assert_eq!(e["not_available"], json!(true));
    contains_all(
        &run.message(),
        &[
            "8 MiB",
            "ibv_reg_mr counts the pages it registers against RLIMIT_MEMLOCK unless the process has CAP_IPC_LOCK",
            &format!("hard RLIMIT_MEMLOCK of {}", format_bytes(limit)),
            "ulimit -l",
        ],
    );
    assert!(run.log.is_empty(), "the library was called: {:#?}", run.log);
}

#[test]
fn the_memlock_bound_counts_every_device() {
    // The pool fits the limit once, not twice.
    let limit = memlock_limit(6 * MIB);
    let size = (limit * 3 / 4) & !4095;
    assert!(
        size > 0,
        "the memlock hard limit here is too low for this test"
    );
    let run = run_child(
        json!({"size": size, "rdma": {}}),
        &[("FAKE_IBV_DEVICES", "mlx5_0,mlx5_1")],
        Some((limit, limit)),
    );
    assert_eq!(run.error()["not_available"], json!(true));
    contains_all(
        &run.message(),
        &[&format_bytes(2 * size), "2 devices", "CAP_IPC_LOCK"],
    );
    assert!(run.calls("ibv_open_device").is_empty(), "{:#?}", run.log);
    assert!(run.calls("ibv_reg_mr").is_empty());
    assert_nothing_left(&run);
}

#[test]
fn a_low_soft_memlock_limit_is_raised_to_the_hard_one_while_registered() {
    // ib_umem_get checks the soft limit; the bound is the hard one.
    let hard = memlock_limit(8 * MIB);
    let soft = 64 << 10;
    let size = (hard / 2) & !4095;
    assert!(
        size > soft,
        "the memlock hard limit here is too low for this test"
    );
    let run = run_child(json!({"size": size, "rdma": {}}), &[], Some((soft, hard)));
    assert_eq!(run.out["ok"], json!(true), "{:#}", run.out);
    assert_eq!(run.out["memlock"]["cap_ipc_lock"], json!(false));
    assert_eq!(
        run.out["details"]["memlock_soft_limit"],
        json!({"raised_from": soft, "to": hard, "restored_on_deregister": true})
    );
    assert_eq!(
        run.out["memlock_after"]["soft"],
        json!(soft),
        "not restored"
    );
    assert_eq!(run.out["deregister"], json!([]));
    assert_nothing_left(&run);
}

#[test]
fn a_pool_built_with_register_rdma_reports_the_regions() {
    let run = run(
        json!({"mode": "pool", "size": 8 * MIB, "block": 2 * MIB, "rdma": {}}),
        &[
            ("FAKE_IBV_DEVICES", "mlx5_0,mlx5_1"),
            ("FAKE_IBV_MAX_MR_SIZE", "5242880"),
        ],
    );
    assert_eq!(run.out["ok"], json!(true), "{:#}", run.out);
    let regs = &run.out["report"]["registrations"];
    assert_eq!(regs.as_array().unwrap().len(), 1);
    assert_eq!(regs[0]["kind"], json!("rdma"));
    let details = &regs[0]["details"];
    assert_eq!(details["devices"].as_array().unwrap().len(), 2);
    assert_regions_match_layout(details, &run.out["region"], 2 * MIB, &run.log);
    assert_eq!(run.out["teardown_issues"], json!([]));
    assert_reverse_per_device(&run);
    assert_nothing_left(&run);
}

#[test]
fn a_failing_registration_fails_the_pool_build_and_leaves_nothing_registered() {
    let run = run(
        json!({"mode": "pool", "size": 8 * MIB, "rdma": {}}),
        &[
            ("FAKE_IBV_DEVICES", "mlx5_0,mlx5_1"),
            ("FAKE_IBV_MAX_MR_SIZE", "1048576"),
            ("FAKE_IBV_FAIL_REG_AT", "mlx5_0:5"),
        ],
    );
    assert_eq!(run.error()["errno"], json!(libc::ENOMEM));
    contains_all(&run.message(), &["mlx5_0", "region 5 of 8"]);
    assert!(run.calls("ibv_reg_mr").iter().any(|c| c.ok()));
    assert_reverse_per_device(&run);
    assert_nothing_left(&run);
}

#[test]
fn a_bad_rdma_table_is_a_usage_error_at_plan_time() {
    let run = run(json!({"mode": "pool", "rdma": {"device": ["mlx5_0"]}}), &[]);
    assert_eq!(run.error()["usage"], json!(true));
    contains_all(&run.message(), &["[rdma]", "device"]);
    assert!(run.log.is_empty());
}

/// The system's libibverbs, when installed: on this kind of host (no RDMA in
/// the kernel) it must give the ENOSYS error; with RDMA devices it registers
/// for real and the regions must match the layout.
#[test]
fn the_real_libibverbs_when_installed() {
    let run = run(json!({"real": true, "size": 8 * MIB, "rdma": {}}), &[]);
    if run.out["ok"] == json!(true) {
        eprintln!(
            "registered with the real libibverbs: {:#}",
            run.out["details"]
        );
        let page = run.out["region"]["page"].as_u64().unwrap();
        assert_regions_match_layout(&run.out["details"], &run.out["region"], page, &[]);
        assert_eq!(run.out["deregister"], json!([]));
        return;
    }
    let msg = run.message();
    assert_eq!(run.error()["not_available"], json!(true), "{msg}");
    if msg.contains("cannot load") {
        eprintln!("skip: libibverbs.so.1 is not installed ({msg})");
        contains_all(&msg, &["libibverbs.so.1", "libibverbs1"]);
    } else if !Path::new("/sys/class/infiniband_verbs").exists() {
        contains_all(&msg, &["kernel without RDMA", "ENOSYS"]);
    } else {
        contains_all(&msg, &["no RDMA devices"]);
    }
}

#[test]
fn plan_shows_each_devices_regions_at_its_max_mr_size_and_registers_nothing() {
    let run = run(
        json!({"mode": "plan", "size": 40 * MIB, "block": 3 * MIB, "rdma": {"devices": ["mlx5_1"]}}),
        &[
            ("FAKE_IBV_DEVICES", "mlx5_0,mlx5_1"),
            ("FAKE_IBV_MAX_MR_SIZE", &(16 * MIB).to_string()),
        ],
    );
    assert_eq!(run.out["ok"], json!(true), "{:#}", run.out);
    let plans = &run.out["plan"]["registration_plans"];
    assert_eq!(plans[0]["kind"], "rdma");
    let devices = plans[0]["plan"]["devices"].as_array().unwrap();
    assert_eq!(devices.len(), 1, "only the selected device: {plans:#}");
    assert_eq!(devices[0]["name"], "mlx5_1");
    let regions = devices[0]["regions"].as_array().unwrap();
    let want =
        pool_core::mr_regions(40 * MIB, pool_core::PageSize::BASE_4K, 3 * MIB, 16 * MIB).unwrap();
    assert_eq!(regions.len(), want.len());
    for (r, w) in regions.iter().zip(&want) {
        assert_eq!(
            (r["offset"].as_u64().unwrap(), r["len"].as_u64().unwrap()),
            (w.offset, w.len)
        );
    }
    assert!(
        run.calls("ibv_reg_mr").is_empty(),
        "plan registers nothing: {:?}",
        run.log
    );
    assert_nothing_left(&run);
}

/// The one `unsafe` of these tests: a `pre_exec` hook.
mod sys {
    #![allow(unsafe_code)]

    use std::os::unix::process::CommandExt;
    use std::process::Command;

    /// Make the child start with `RLIMIT_MEMLOCK` at `soft`/`hard` and
    /// without `CAP_IPC_LOCK` (as `capsh --drop=cap_ipc_lock`).
    pub fn lower_memlock_at_exec(cmd: &mut Command, soft: u64, hard: u64) {
        // SAFETY: the closure runs in the child between fork and exec and
        // makes only system calls (setrlimit, prctl, capget, capset), which
        // are async-signal-safe; it allocates nothing.
        unsafe {
            cmd.pre_exec(move || {
                use rustix::thread::CapabilitySet;
                rustix::process::setrlimit(
                    rustix::process::Resource::Memlock,
                    rustix::process::Rlimit {
                        current: Some(soft),
                        maximum: Some(hard),
                    },
                )?;
                // As `capsh --drop=cap_ipc_lock`: out of the bounding set, so
                // root does not regain it at exec (fails harmlessly without
                // CAP_SETPCAP, when the process has no CAP_IPC_LOCK anyway).
                let _ =
                    rustix::thread::remove_capability_from_bounding_set(CapabilitySet::IPC_LOCK);
                if let Ok(mut caps) = rustix::thread::capabilities(None) {
                    caps.inheritable.remove(CapabilitySet::IPC_LOCK);
                    caps.effective.remove(CapabilitySet::IPC_LOCK);
                    caps.permitted.remove(CapabilitySet::IPC_LOCK);
                    let _ = rustix::thread::set_capabilities(None, caps);
                }
                Ok(())
            });
        }
    }
}
