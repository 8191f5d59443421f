//! The `cuda` pinner through the real FFI path: cudarc opens a driver
//! library found through `LD_LIBRARY_PATH`, and the pinner calls it with
//! raw pointers, in a child process (this test binary run again with
//! `PINNER_CUDA_SCENARIO` set, see [`scenario_child`]).
//!
//! The driver is the `fake-cuda` test double: its cdylib `libfake_cuda.so`
//! is built by cargo before these tests because `fake-cuda` is a
//! dev-dependency, and lands in `<target>/<profile>/deps`, next to this test
//! binary. Each test links it as `libcuda.so.1` and `libcuda.so` in a
//! temporary directory of its own and points the child's `LD_LIBRARY_PATH`
//! there; the fake logs every call to a file the test then reads.
//!
//! When a real driver is on this host (`libcuda.so.1` found without any
//! help), [`real_driver_scenarios_when_present`] runs what makes sense
//! against it too; otherwise it prints why it skips.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Instant;

use pool_core::Format;
use pool_core::registration_chunks;
use pool_core::{PageSize, Pool, PoolConfig, PoolPlan, Quiet};
use serde_json::{Value, json};

// Link the anon backing (the pools under test) and the pinner itself.
use backing_anon as _;
use pinner_cuda as _;

const SCENARIO: &str = "PINNER_CUDA_SCENARIO";
const CONFIG: &str = "PINNER_CUDA_CONFIG";
const VERIFY_BYTES: &str = "PINNER_CUDA_VERIFY_BYTES";
const MEMLOCK_LIMIT: &str = "PINNER_CUDA_MEMLOCK_LIMIT";
const RESULT: &str = "SCENARIO-RESULT ";
const MIB: u64 = 1 << 20;

// ---------------------------------------------------------------------------
// The child side.

/// Runs a scenario when started as a child by the tests below (which run it
/// with `--ignored`). Ignored in an ordinary run, so it never counts as a
/// pass there; run by hand without its variable it fails.
#[test]
#[ignore = "a child process of the tests below; they run it with --ignored"]
fn scenario_child() {
    let Ok(name) = std::env::var(SCENARIO) else {
        panic!("scenario_child runs only as a child of this file's tests ({SCENARIO} is unset)");
    };
    let out = match name.as_str() {
        "probe" => json!({ "probe": outcome(pinner_cuda::probe_driver()) }),
        "devices" => match pinner_cuda::probe_devices() {
            Ok(info) => {
                json!({ "devices": { "ok": true, "info": info, "version": info.version_text() } })
            }
            Err(e) => json!({ "devices": outcome::<()>(Err(e)) }),
        },
        "pool" => pool_scenario(),
        "memlock" => {
            lower_memlock();
            pool_scenario()
        }
        "pin_twice" => pin_twice(),
        "unpin_elsewhere" => unpin_on_another_thread(),
        "locate" => locate_scenario(),
        "list" => json!({ "list": gpus(pinner_cuda::list_gpus()) }),
        "doctor" => doctor_scenario(),
        other => json!({ "unknown_scenario": other }),
    };
    // On a line of its own: libtest has written "test scenario_child ... ".
    println!("\n{RESULT}{out}");
}

fn outcome<T>(r: pool_core::Result<T>) -> Value {
    match r {
        Ok(_) => json!({ "ok": true }),
        Err(e) => json!({
            "ok": false,
            "error": e.to_string(),
            "not_available": e.is_not_available(),
        }),
    }
}

/// A located GPU, or the error.
fn gpus<T: serde::Serialize>(r: pool_core::Result<T>) -> Value {
    match r {
        Ok(gpu) => json!({ "ok": true, "gpu": gpu }),
        Err(e) => outcome::<()>(Err(e)),
    }
}

/// `locate_gpu` of the config's `[cuda]` table, directly and through the
/// GPU plugin record `numa_node = "gpu"` asks.
fn locate_scenario() -> Value {
    let config = child_config();
    let direct = gpus(pinner_cuda::locate_gpu(config.plugin_table("cuda")));
    let record = match pool_core::plugin::gpu_plugin(&config) {
        Ok(p) => json!({
            "name": p.name,
            "origin": p.origin,
            "located": gpus((p.locate)(config.plugin_table(p.name))),
        }),
        Err(e) => outcome::<()>(Err(e)),
    };
    json!({ "locate": direct, "record": record })
}

/// The `cuda` pinner's doctor findings, about the config's pool (a config
/// of `null`: about no pool).
fn doctor_scenario() -> Value {
    let text = std::env::var(CONFIG).expect("the parent passes a config");
    let config = (text != "null").then(child_config);
    let ctx = pool_core::plugin::DoctorContext {
        pool: config.as_ref().map(|config| pool_core::plugin::PoolFacts {
            config,
            page_size: 4096,
            mapped_bytes: 64 * MIB,
            prefault_bytes: 64 * MIB,
        }),
    };
    let record = pool_core::plugin::lookup::<pool_core::plugin::PinnerPlugin>("cuda").unwrap();
    let findings = (record.doctor.expect("the cuda pinner has a doctor hook"))(&ctx);
    json!({ "findings": findings })
}

fn child_config() -> PoolConfig {
    let text = std::env::var(CONFIG).expect("the parent passes a config");
    PoolConfig::parse(&text, Format::Json).expect("the parent passes a valid config")
}

/// Build the pool of the config (pinning with `cuda` when it says so),
/// optionally run the copy check, tear down; report each step.
fn pool_scenario() -> Value {
    let config = child_config();
    let plan = match PoolPlan::new(config) {
        Ok(p) => p,
        Err(e) => return json!({ "plan": outcome::<()>(Err(e)) }),
    };
    let mut pool = match Pool::build(&plan, &Quiet) {
        Ok(p) => p,
        Err(e) => return json!({ "build": outcome::<()>(Err(e)) }),
    };
    let region = pool.region().expect("a built pool has a region");
    let whole = pool_core::Extent {
        offset: 0,
        len: region.mapped_len(),
    };
    let mut out = json!({
        "build": { "ok": true },
        "base": region.addr().addr(),
        "page": region.page().get(),
        "mapped": region.mapped_len(),
        "pin": serde_json::to_value(&pool.report().pin).unwrap(),
    });
    if let Ok(bytes) = std::env::var(VERIFY_BYTES) {
        let bytes: u64 = bytes.parse().unwrap();
        let r = pinner_cuda::verify_copy(&mut pool, whole, 0, bytes);
        out["verify"] = match r {
            Ok(report) => json!({ "ok": true, "report": report }),
            Err(e) => outcome::<()>(Err(e)),
        };
    }
    let report = pool.teardown();
    out["teardown_issues"] = serde_json::to_value(&report.teardown_issues).unwrap();
    out
}

/// Lower `RLIMIT_MEMLOCK` (soft and hard) and drop `CAP_IPC_LOCK` from this
/// thread, the one that pins: the limit then binds, as for an unprivileged
/// engine in a container with Docker's default 8 MiB.
fn lower_memlock() {
    use rustix::process::{Resource, Rlimit, setrlimit};
    use rustix::thread::{CapabilitySet, capabilities, set_capabilities};
    let limit: u64 = std::env::var(MEMLOCK_LIMIT).unwrap().parse().unwrap();
    setrlimit(
        Resource::Memlock,
        Rlimit {
            current: Some(limit),
            maximum: Some(limit),
        },
    )
    .expect("lowering RLIMIT_MEMLOCK is always allowed");
    let mut caps = capabilities(None).expect("capget");
    caps.effective.remove(CapabilitySet::IPC_LOCK);
    caps.permitted.remove(CapabilitySet::IPC_LOCK);
    set_capabilities(None, caps).expect("dropping a capability is always allowed");
}

/// A pool pinned by the pool, then pinned again directly by the plugin.
fn pin_twice() -> Value {
    let config = child_config();
    let plan = PoolPlan::new(config.clone()).unwrap();
    let pool = match Pool::build(&plan, &Quiet) {
        Ok(p) => p,
        Err(e) => return json!({ "build": outcome::<()>(Err(e)) }),
    };
    let region = pool.region().unwrap();
    let base = region.addr().addr();
    let second = pinner("cuda", &config).pin(region, &pool_core::plugin::PinContext::of(&config));
    let second_out = outcome(second.as_ref().map(|_| ()).map_err(clone_err));
    let second_issues = second.map(|p| p.unpin()).unwrap_or_default();
    let report = pool.teardown();
    json!({
        "build": { "ok": true },
        "base": base,
        "first": serde_json::to_value(&report.pin).unwrap(),
        "second": second_out,
        "second_issues": serde_json::to_value(&second_issues).unwrap(),
        "teardown_issues": serde_json::to_value(&report.teardown_issues).unwrap(),
    })
}

fn clone_err(e: &pool_core::Error) -> pool_core::Error {
    if e.is_not_available() {
        pool_core::Error::NotAvailable {
            what: String::new(),
            reason: e.to_string(),
        }
    } else {
        pool_core::Error::config(e.to_string())
    }
}

fn pinner(name: &str, config: &PoolConfig) -> Box<dyn pool_core::plugin::Pinner> {
    let p = pool_core::plugin::lookup::<pool_core::plugin::PinnerPlugin>(name).unwrap();
    (p.build)(config.plugin_table(name)).unwrap()
}

/// Pin on this thread, unpin on another (the pool may be torn down by a
/// thread other than the one that built it).
fn unpin_on_another_thread() -> Value {
    let mut config = child_config();
    config.pin.kind = None;
    let plan = PoolPlan::new(config.clone()).unwrap();
    let pool = Pool::build(&plan, &Quiet).unwrap();
    let region = pool.region().unwrap();
    let base = region.addr().addr();
    let pin = match pinner("cuda", &config).pin(region, &pool_core::plugin::PinContext::of(&config))
    {
        Ok(p) => p,
        Err(e) => return json!({ "pin": outcome::<()>(Err(e)) }),
    };
    let issues = std::thread::spawn(move || pin.unpin()).join().unwrap();
    let report = pool.teardown();
    json!({
        "pin": { "ok": true },
        "base": base,
        "unpin_issues": serde_json::to_value(&issues).unwrap(),
        "teardown_issues": serde_json::to_value(&report.teardown_issues).unwrap(),
    })
}

// ---------------------------------------------------------------------------
// The parent side.

/// Which driver library the child finds.
enum Lib {
    /// The fake, as `libcuda.so.1` and `libcuda.so`.
    Fake,
    /// Nothing: an empty directory (the system's own paths still count).
    Empty,
    /// A library that opens but exports no driver symbol.
    Impostor(PathBuf),
    /// Whatever this host has, `LD_LIBRARY_PATH` left as it is.
    Host,
    /// No driver, on any host: a file that is no library under every name
    /// cudarc tries, which the dynamic loader finds first through
    /// `LD_LIBRARY_PATH` and then fails to load (it does not search on past
    /// a broken file), so a real driver elsewhere is not found either.
    Broken,
}

/// A temporary directory, removed on drop.
struct TempDir(PathBuf);

impl TempDir {
    fn new() -> TempDir {
        static N: AtomicU32 = AtomicU32::new(0);
        let dir = std::env::temp_dir().join(format!(
            "pinner-cuda-test-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        TempDir(dir)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The built fake driver: `<target>/<profile>/deps/libfake_cuda.so`, next
/// to this test binary (or one level up, where cargo also copies it when
/// fake-cuda itself is built).
fn fake_library() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let deps = exe.parent().unwrap();
    [deps.to_path_buf(), deps.parent().unwrap().to_path_buf()]
        .iter()
        .map(|d| d.join("libfake_cuda.so"))
        .find(|p| p.exists())
        .unwrap_or_else(|| {
            panic!(
                "libfake_cuda.so is not in {} or its parent: it is built because fake-cuda is a \
                 dev-dependency of pinner-cuda; run `cargo build -p fake-cuda`",
                deps.display()
            )
        })
}

/// A shared library of the C runtime that exports no `cu*` symbol.
fn impostor_library() -> Option<PathBuf> {
    [
        "/lib/x86_64-linux-gnu/libm.so.6",
        "/usr/lib/x86_64-linux-gnu/libm.so.6",
        "/lib/aarch64-linux-gnu/libm.so.6",
        "/usr/lib64/libm.so.6",
        "/lib64/libm.so.6",
        "/usr/lib/libm.so.6",
    ]
    .iter()
    .map(PathBuf::from)
    .find(|p| p.exists())
}

/// What a child reported, with its output and the fake's log.
#[derive(Debug)]
struct Run {
    result: Value,
    stderr: String,
    log: Vec<String>,
}

impl Run {
    /// Log lines of one driver call, with its result.
    fn calls(&self, name: &str) -> Vec<&str> {
        self.log
            .iter()
            .filter(|l| l.split(' ').next() == Some(name))
            .map(String::as_str)
            .collect()
    }

    /// Log lines of host registration calls, in order.
    fn registrations(&self) -> Vec<&str> {
        self.log
            .iter()
            .filter(|l| l.starts_with("cuMemHost"))
            .map(String::as_str)
            .collect()
    }

    fn error(&self, step: &str) -> String {
        self.result[step]["error"]
            .as_str()
            .unwrap_or_else(|| panic!("{step} did not fail: {:#}", self.result))
            .to_string()
    }

    fn base(&self) -> u64 {
        self.result["base"].as_u64().unwrap()
    }
}

/// Run `scenario` in a child with `config`, the driver `lib` and the extra
/// environment `env`. Fails the test on a panic message or a bad exit.
fn run(scenario: &str, config: Value, lib: Lib, env: &[(&str, String)]) -> Run {
    let dir = TempDir::new();
    let lib_dir = dir.0.join("lib");
    std::fs::create_dir(&lib_dir).unwrap();
    let log = dir.0.join("calls.log");
    let mut cmd = Command::new(std::env::current_exe().unwrap());
    cmd.args([
        "--exact",
        "scenario_child",
        "--ignored",
        "--nocapture",
        "--test-threads=1",
    ])
    .env(SCENARIO, scenario)
    .env(CONFIG, config.to_string())
    .env("FAKE_CUDA_LOG", &log)
    .env_remove("RUST_BACKTRACE");
    for var in [
        "FAKE_CUDA_DEVICES",
        "FAKE_CUDA_FAIL_REGISTER_AT",
        "FAKE_CUDA_MAX_REGISTER_BYTES",
        "FAKE_CUDA_CORRUPT_COPY",
        "FAKE_CUDA_PCI_BUS_IDS",
        "HOSTPOOL_TEST_SYSFS_ROOT",
    ] {
        cmd.env_remove(var);
    }
    match lib {
        Lib::Fake => {
            let fake = fake_library();
            for name in ["libcuda.so.1", "libcuda.so"] {
                std::os::unix::fs::symlink(&fake, lib_dir.join(name)).unwrap();
            }
            cmd.env("LD_LIBRARY_PATH", &lib_dir);
        }
        Lib::Empty => {
            cmd.env("LD_LIBRARY_PATH", &lib_dir);
        }
        Lib::Impostor(path) => {
            for name in ["libcuda.so.1", "libcuda.so"] {
                std::os::unix::fs::symlink(&path, lib_dir.join(name)).unwrap();
            }
            cmd.env("LD_LIBRARY_PATH", &lib_dir);
        }
        Lib::Host => {}
        Lib::Broken => {
            for name in ["cuda", "nvcuda"]
                .iter()
                .flat_map(|l| cudarc::get_lib_name_candidates(l))
            {
                std::fs::write(lib_dir.join(name), "not a shared library\n").unwrap();
            }
            cmd.env("LD_LIBRARY_PATH", &lib_dir);
        }
    }
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = cmd.output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(
        out.status.success(),
        "child {scenario} failed ({}):\nstdout:\n{stdout}\nstderr:\n{stderr}",
        out.status
    );
    assert!(
        !stderr.contains("panicked") && !stdout.contains("panicked"),
        "child {scenario} printed a panic:\nstdout:\n{stdout}\nstderr:\n{stderr}"
    );
    let result = stdout
        .lines()
        .find_map(|l| l.find(RESULT).map(|i| &l[i + RESULT.len()..]))
        .unwrap_or_else(|| panic!("child {scenario} printed no result:\n{stdout}\n{stderr}"));
    let log = std::fs::read_to_string(&log)
        .unwrap_or_default()
        .lines()
        .map(str::to_string)
        .collect();
    Run {
        result: serde_json::from_str(result).unwrap(),
        stderr,
        log,
    }
}

/// A 64 MiB anonymous pool pinned with `cuda`, plus `extra` keys.
fn config(required: bool, extra: Value) -> Value {
    let mut c = json!({
        "size": "64MiB",
        "backing": "anon",
        "pin": { "kind": "cuda", "required": required },
    });
    for (k, v) in extra.as_object().unwrap() {
        c[k] = v.clone();
    }
    c
}

/// The registration chunks the pinner must use, as `(offset, len)`.
fn expected_chunks(mapped: u64, page: u64, block: u64, cap: u64) -> Vec<(u64, u64)> {
    registration_chunks(mapped, PageSize::new(page).unwrap(), block, cap)
        .unwrap()
        .into_iter()
        .map(|e| (e.offset, e.len))
        .collect()
}

fn reported_chunks(pin: &Value) -> Vec<(u64, u64)> {
    pin["details"]["chunks"]
        .as_array()
        .unwrap_or_else(|| panic!("no chunks in {pin:#}"))
        .iter()
        .map(|c| (c["offset"].as_u64().unwrap(), c["len"].as_u64().unwrap()))
        .collect()
}

fn register_line(base: u64, (offset, len): (u64, u64), flags: u32, result: &str) -> String {
    format!(
        "cuMemHostRegister_v2 {:#x} {len} {flags} -> {result}",
        base + offset
    )
}

fn unregister_line(base: u64, (offset, _): (u64, u64), result: &str) -> String {
    format!("cuMemHostUnregister {:#x} -> {result}", base + offset)
}

fn assert_contains_all(text: &str, wants: &[&str]) {
    for want in wants {
        assert!(text.contains(want), "missing {want:?} in: {text}");
    }
}

// ---------------------------------------------------------------------------
// Tests against the fake driver.

#[test]
fn without_a_driver_library_the_pinner_is_not_available_and_prints_no_panic() {
    let run = run("pool", config(true, json!({})), Lib::Empty, &[]);
    if run.result["build"]["ok"] == true || !run.error("build").contains("no CUDA driver") {
        eprintln!(
            "skip: a CUDA driver library is on this host's default library path, so \"no \
             driver\" cannot be staged here: {:#}",
            run.result
        );
        return;
    }
    assert_eq!(
        run.result["build"]["not_available"], true,
        "{:#}",
        run.result
    );
    assert_contains_all(
        &run.error("build"),
        &[
            "cuda pinner is not available on this host",
            "no CUDA driver (libcuda.so.1) on this host",
            "LD_LIBRARY_PATH",
        ],
    );
    assert!(run.log.is_empty(), "{:?}", run.log);
    assert!(
        !run.stderr.contains("Unable to dynamically load"),
        "{}",
        run.stderr
    );
    let probe = probe_child(Lib::Empty);
    assert_eq!(probe["not_available"], true, "{probe:#}");
}

fn probe_child(lib: Lib) -> Value {
    run("probe", json!({}), lib, &[]).result["probe"].clone()
}

#[test]
fn a_best_effort_pool_without_a_driver_builds_with_pin_skipped() {
    let run = run("pool", config(false, json!({})), Lib::Empty, &[]);
    if run.result["pin"]["status"] == "pinned" {
        eprintln!("skip: a CUDA driver library is on this host's default library path");
        return;
    }
    assert_eq!(run.result["build"]["ok"], true, "{:#}", run.result);
    assert_eq!(run.result["pin"]["kind"], "cuda");
    assert_eq!(run.result["pin"]["status"], "skipped", "{:#}", run.result);
    let reason = run.result["pin"]["reason"].as_str().unwrap();
    assert!(reason.contains("no CUDA driver (libcuda.so.1)"), "{reason}");
    assert_eq!(run.result["teardown_issues"], json!([]));
}

#[test]
fn a_library_without_the_driver_symbols_is_not_available_and_names_them() {
    let Some(impostor) = impostor_library() else {
        eprintln!("skip: no libm.so.6 found to stand in for a driver without symbols");
        return;
    };
    let run = run(
        "pool",
        config(true, json!({})),
        Lib::Impostor(impostor),
        &[],
    );
    assert_eq!(
        run.result["build"]["not_available"], true,
        "{:#}",
        run.result
    );
    assert_contains_all(
        &run.error("build"),
        &[
            "the CUDA driver library lacks cuInit, ",
            "cuMemHostRegister_v2",
            "update the NVIDIA driver",
        ],
    );
}

#[test]
fn the_fake_exports_every_symbol_the_pinner_resolves() {
    let probe = probe_child(Lib::Fake);
    assert_eq!(probe["ok"], true, "{probe:#}");
    let run = run("probe", json!({}), Lib::Fake, &[]);
    assert!(run.log.is_empty(), "probing calls nothing: {:?}", run.log);
}

#[test]
fn probing_devices_lists_version_and_names_without_a_context() {
    let env = [("FAKE_CUDA_DEVICES", "2".to_string())];
    let run = run("devices", json!({}), Lib::Fake, &env);
    let d = &run.result["devices"];
    assert_eq!(d["ok"], true, "{:#}", run.result);
    assert_eq!(d["info"]["version"], 12080);
    assert_eq!(d["version"], "12.8");
    assert_eq!(
        d["info"]["devices"],
        json!(["fake-cuda device 0", "fake-cuda device 1"])
    );
    assert_eq!(d["info"]["no_device"], Value::Null);
    for call in &run.log {
        let name = call.split(' ').next().unwrap_or("");
        assert!(
            [
                "cuInit",
                "cuDriverGetVersion",
                "cuDeviceGetCount",
                "cuDeviceGet",
                "cuDeviceGetName",
            ]
            .contains(&name),
            "probing made a call beyond listing devices: {call}"
        );
    }
    assert!(run.registrations().is_empty(), "{:?}", run.log);
}

#[test]
fn probing_devices_with_none_is_ok_and_says_why() {
    let env = [("FAKE_CUDA_DEVICES", "0".to_string())];
    let run = run("devices", json!({}), Lib::Fake, &env);
    let d = &run.result["devices"];
    assert_eq!(d["ok"], true, "{:#}", run.result);
    assert_eq!(d["info"]["devices"], json!([]));
    assert!(
        d["info"]["no_device"]
            .as_str()
            .unwrap()
            .contains("CUDA_ERROR_NO_DEVICE"),
        "{d:#}"
    );
}

#[test]
fn probing_devices_without_a_driver_is_not_available() {
    let run = run("devices", json!({}), Lib::Empty, &[]);
    let d = &run.result["devices"];
    if d["ok"] == true {
        eprintln!("skip: a CUDA driver library is on this host's default library path");
        return;
    }
    assert_eq!(d["not_available"], true, "{d:#}");
    assert!(
        d["error"].as_str().unwrap().contains("no CUDA driver"),
        "{d:#}"
    );
}

#[test]
fn no_device_is_not_available() {
    let env = [("FAKE_CUDA_DEVICES", "0".to_string())];
    let run = run("pool", config(true, json!({})), Lib::Fake, &env);
    assert_eq!(
        run.result["build"]["not_available"], true,
        "{:#}",
        run.result
    );
    assert_contains_all(
        &run.error("build"),
        &["no CUDA device", "cuInit returned CUDA_ERROR_NO_DEVICE"],
    );
    assert_eq!(run.calls("cuInit"), ["cuInit 0 -> CUDA_ERROR_NO_DEVICE"]);
    assert!(run.registrations().is_empty(), "{:?}", run.log);
}

#[test]
fn a_device_index_past_the_count_is_not_available_and_names_the_count() {
    let env = [("FAKE_CUDA_DEVICES", "2".to_string())];
    let run = run(
        "pool",
        config(true, json!({ "cuda": { "device": 5 } })),
        Lib::Fake,
        &env,
    );
    assert_eq!(
        run.result["build"]["not_available"], true,
        "{:#}",
        run.result
    );
    assert_contains_all(
        &run.error("build"),
        &[
            "CUDA device 5 does not exist",
            "this host has 2 CUDA devices (0 to 1)",
            "[cuda] device",
        ],
    );
    assert!(run.registrations().is_empty(), "{:?}", run.log);
    assert!(run.calls("cuDevicePrimaryCtxRetain").is_empty());
}

#[test]
fn chunks_match_registration_chunks_and_unpin_unregisters_in_reverse() {
    // 64 MiB in 3 MiB blocks, at most 16 MiB a call: 15 MiB chunks and a
    // 4 MiB tail, every boundary on a block.
    let cfg = config(
        true,
        json!({ "block_size": "3MiB", "cuda": { "chunk_size": "16MiB" } }),
    );
    // The child's whole run (start, build, pin, teardown) bounds the time
    // the pin reports.
    let started = Instant::now();
    let run = run("pool", cfg, Lib::Fake, &[]);
    let wall = started.elapsed().as_secs_f64();
    assert_eq!(run.result["build"]["ok"], true, "{:#}", run.result);
    let pin = &run.result["pin"];
    assert_eq!(pin["status"], "pinned", "{pin:#}");
    let (base, page, mapped) = (
        run.base(),
        run.result["page"].as_u64().unwrap(),
        run.result["mapped"].as_u64().unwrap(),
    );
    let want = expected_chunks(mapped, page, 3 * MIB, 16 * MIB);
    assert_eq!(want.len(), 5);
    assert_eq!(reported_chunks(pin), want);

    let mut expected: Vec<String> = want
        .iter()
        .map(|&c| register_line(base, c, 1, "CUDA_SUCCESS"))
        .collect();
    expected.extend(
        want.iter()
            .rev()
            .map(|&c| unregister_line(base, c, "CUDA_SUCCESS")),
    );
    assert_eq!(run.registrations(), expected);
    // The thread gets its own (here: no) context back after pinning.
    let last_register = run
        .log
        .iter()
        .rposition(|l| l.starts_with("cuMemHostRegister_v2"))
        .unwrap();
    assert_eq!(
        run.log[last_register + 1],
        "cuCtxSetCurrent 0x0 -> CUDA_SUCCESS"
    );
    // The context is released last, with nothing left registered in it.
    assert_eq!(
        run.log.last().map(String::as_str),
        Some("cuDevicePrimaryCtxRelease_v2 0 live_registrations=0 -> CUDA_SUCCESS"),
        "{:#?}",
        run.log
    );
    assert_eq!(run.result["teardown_issues"], json!([]));

    let d = &pin["details"];
    assert_eq!(d["device"], 0);
    assert_eq!(d["device_name"], "fake-cuda device 0");
    assert_eq!(d["driver_version"], 12080);
    assert_eq!(d["flags"], json!(["portable"]));
    assert_eq!(d["bytes"], mapped);
    // The pin took some time, no more than the child ran, and at least what
    // its chunks took one after the other; per GiB is that over the 64 MiB.
    let seconds = d["seconds"].as_f64().unwrap();
    assert!(
        seconds.is_finite() && seconds > 0.0 && seconds <= wall,
        "pinned in {seconds} s, the child ran {wall} s: {d:#}"
    );
    let chunk_seconds: f64 = d["chunks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["seconds"].as_f64().unwrap())
        .sum();
    assert!(
        chunk_seconds <= seconds * (1.0 + 1e-9),
        "the chunks took {chunk_seconds} s of the pin's {seconds} s: {d:#}"
    );
    let gib = mapped as f64 / f64::from(1u32 << 30);
    let per_gib = d["seconds_per_gib"].as_f64().unwrap();
    assert!(
        (per_gib - seconds / gib).abs() <= 1e-9 * per_gib,
        "seconds_per_gib {per_gib} is not {seconds} s / {gib} GiB: {d:#}"
    );
    assert!(d["memlock"].as_str().unwrap().contains("64 MiB"), "{d:#}");
    assert!(d["chunks"][0]["seconds"].as_f64().is_some());
}

#[test]
fn the_default_chunk_is_64_gib_and_flags_reach_the_driver() {
    let cfg = config(
        true,
        json!({ "cuda": { "flags": ["portable", "devicemap"] } }),
    );
    let run = run("pool", cfg, Lib::Fake, &[]);
    assert_eq!(run.result["pin"]["status"], "pinned", "{:#}", run.result);
    let base = run.base();
    assert_eq!(
        run.calls("cuMemHostRegister_v2"),
        [register_line(base, (0, 64 * MIB), 3, "CUDA_SUCCESS")]
    );
    assert_eq!(run.result["pin"]["details"]["chunk_size"], 64u64 << 30);

    let run2 = self::run(
        "pool",
        config(true, json!({ "cuda": { "flags": [] } })),
        Lib::Fake,
        &[],
    );
    let base = run2.base();
    assert_eq!(
        run2.calls("cuMemHostRegister_v2"),
        [register_line(base, (0, 64 * MIB), 0, "CUDA_SUCCESS")]
    );
}

#[test]
fn a_failed_chunk_rolls_back_in_reverse_and_names_chunk_offset_size_and_error() {
    let cfg = config(true, json!({ "cuda": { "chunk_size": "16MiB" } }));
    let env = [("FAKE_CUDA_FAIL_REGISTER_AT", "4".to_string())];
    let run = run("pool", cfg, Lib::Fake, &env);
    let err = run.error("build");
    assert_eq!(run.result["build"]["not_available"], false, "{err}");
    assert_contains_all(
        &err,
        &[
            "cuda pinner: cuMemHostRegister of chunk 3 (offset 48 MiB, 16 MiB) failed: \
             CUDA_ERROR_OUT_OF_MEMORY",
            "the pool has 4 chunks (numbered from 0)",
            "the 3 chunks before it (0 to 2) were unregistered in reverse, nothing stays pinned",
            "ulimit -l",
        ],
    );
    // The base is not reported on failure: read it from the first call.
    let first = run.calls("cuMemHostRegister_v2")[0].to_string();
    let base = u64::from_str_radix(
        first.split(' ').nth(1).unwrap().trim_start_matches("0x"),
        16,
    )
    .unwrap();
    let chunk = |i: u64| (i * 16 * MIB, 16 * MIB);
    let expected = vec![
        register_line(base, chunk(0), 1, "CUDA_SUCCESS"),
        register_line(base, chunk(1), 1, "CUDA_SUCCESS"),
        register_line(base, chunk(2), 1, "CUDA_SUCCESS"),
        register_line(base, chunk(3), 1, "CUDA_ERROR_OUT_OF_MEMORY"),
        unregister_line(base, chunk(2), "CUDA_SUCCESS"),
        unregister_line(base, chunk(1), "CUDA_SUCCESS"),
        unregister_line(base, chunk(0), "CUDA_SUCCESS"),
    ];
    assert_eq!(run.registrations(), expected);
    assert_eq!(
        run.calls("cuDevicePrimaryCtxRelease_v2"),
        ["cuDevicePrimaryCtxRelease_v2 0 live_registrations=0 -> CUDA_SUCCESS"]
    );
}

#[test]
fn a_failure_at_the_first_chunk_has_nothing_to_roll_back() {
    let cfg = config(true, json!({ "cuda": { "chunk_size": "16MiB" } }));
    let env = [("FAKE_CUDA_FAIL_REGISTER_AT", "1".to_string())];
    let run = run("pool", cfg, Lib::Fake, &env);
    assert_contains_all(
        &run.error("build"),
        &[
            "cuMemHostRegister of chunk 0 (offset 0 B, 16 MiB) failed: CUDA_ERROR_OUT_OF_MEMORY",
            "no earlier chunk was registered",
        ],
    );
    assert_eq!(run.registrations().len(), 1, "{:?}", run.log);
}

#[test]
fn a_byte_cap_fails_clearly_until_chunk_size_is_lowered_below_it() {
    let env = [("FAKE_CUDA_MAX_REGISTER_BYTES", (20 * MIB).to_string())];
    let run1 = run("pool", config(true, json!({})), Lib::Fake, &env);
    assert_contains_all(
        &run1.error("build"),
        &[
            "cuMemHostRegister of chunk 0 (offset 0 B, 64 MiB) failed: CUDA_ERROR_INVALID_VALUE",
            "lower [cuda] chunk_size",
        ],
    );
    assert!(run1.calls("cuMemHostUnregister").is_empty());

    // Best effort: the same failure leaves the pool pageable, with the reason.
    let run2 = run("pool", config(false, json!({})), Lib::Fake, &env);
    assert_eq!(run2.result["pin"]["status"], "skipped", "{:#}", run2.result);
    assert!(
        run2.result["pin"]["reason"]
            .as_str()
            .unwrap()
            .contains("CUDA_ERROR_INVALID_VALUE")
    );

    let cfg = config(true, json!({ "cuda": { "chunk_size": "16MiB" } }));
    let run3 = run("pool", cfg, Lib::Fake, &env);
    assert_eq!(run3.result["pin"]["status"], "pinned", "{:#}", run3.result);
    let base = run3.base();
    let want = expected_chunks(64 * MIB, 4096, 4096, 16 * MIB);
    assert_eq!(want.len(), 4);
    let lines: Vec<String> = want
        .iter()
        .map(|&c| register_line(base, c, 1, "CUDA_SUCCESS"))
        .collect();
    assert_eq!(run3.calls("cuMemHostRegister_v2"), lines);
    assert_eq!(run3.calls("cuMemHostUnregister").len(), 4);
}

#[test]
fn exceeding_the_memlock_bound_is_not_available_with_the_remedy_and_registers_nothing() {
    let env = [(MEMLOCK_LIMIT, MIB.to_string())];
    let run1 = run("memlock", config(true, json!({})), Lib::Fake, &env);
    assert_eq!(
        run1.result["build"]["not_available"], true,
        "{:#}",
        run1.result
    );
    assert_contains_all(
        &run1.error("build"),
        &[
            "pinning 64 MiB with cuda is not available on this host",
            "the hard RLIMIT_MEMLOCK of 1 MiB",
            "ulimit -l",
            "--ulimit memlock=-1",
            "LimitMEMLOCK=infinity",
        ],
    );
    // The bound is checked before any driver call.
    assert!(run1.log.is_empty(), "{:?}", run1.log);

    let run2 = run("memlock", config(false, json!({})), Lib::Fake, &env);
    assert_eq!(run2.result["pin"]["status"], "skipped", "{:#}", run2.result);
    assert!(run2.log.is_empty(), "{:?}", run2.log);

    // `memlock_bound = "ignore"` lets the driver decide (the fake accepts).
    let cfg = json!({
        "size": "64MiB", "backing": "anon",
        "pin": { "kind": "cuda", "required": true, "memlock_bound": "ignore" },
    });
    let run3 = run("memlock", cfg, Lib::Fake, &env);
    assert_eq!(run3.result["pin"]["status"], "pinned", "{:#}", run3.result);
    assert!(
        run3.result["pin"]["details"]["memlock"]
            .as_str()
            .unwrap()
            .contains("not checked")
    );
}

#[test]
fn registering_pinned_memory_again_is_refused_and_the_first_pin_survives() {
    let cfg = config(true, json!({ "cuda": { "chunk_size": "32MiB" } }));
    let run = run("pin_twice", cfg, Lib::Fake, &[]);
    assert_eq!(run.result["first"]["status"], "pinned", "{:#}", run.result);
    assert_contains_all(
        &run.error("second"),
        &[
            "cuMemHostRegister of chunk 0 (offset 0 B, 32 MiB) failed: \
             CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED",
            "another pin",
        ],
    );
    assert_eq!(run.result["second_issues"], json!([]));
    assert_eq!(run.result["teardown_issues"], json!([]));
    let base = run.base();
    let c0 = (0, 32 * MIB);
    let c1 = (32 * MIB, 32 * MIB);
    assert_eq!(
        run.registrations(),
        [
            register_line(base, c0, 1, "CUDA_SUCCESS"),
            register_line(base, c1, 1, "CUDA_SUCCESS"),
            register_line(base, c0, 1, "CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED"),
            unregister_line(base, c1, "CUDA_SUCCESS"),
            unregister_line(base, c0, "CUDA_SUCCESS"),
        ]
    );
}

#[test]
fn unpin_on_another_thread_makes_the_context_current_there() {
    let cfg = config(true, json!({ "cuda": { "chunk_size": "32MiB" } }));
    let run = run("unpin_elsewhere", cfg, Lib::Fake, &[]);
    assert_eq!(run.result["pin"]["ok"], true, "{:#}", run.result);
    assert_eq!(run.result["unpin_issues"], json!([]), "{:#?}", run.log);
    let unregisters = run.calls("cuMemHostUnregister");
    assert_eq!(unregisters.len(), 2);
    assert!(unregisters.iter().all(|l| l.ends_with("CUDA_SUCCESS")));
}

#[test]
fn verify_copy_round_trips_through_the_pinned_pool_and_catches_corruption() {
    let cfg = config(true, json!({ "cuda": { "chunk_size": "16MiB" } }));
    let env = [(VERIFY_BYTES, (8 * MIB).to_string())];
    let run1 = run("pool", cfg.clone(), Lib::Fake, &env);
    let v = &run1.result["verify"];
    assert_eq!(v["ok"], true, "{v:#}");
    let r = &v["report"];
    assert_eq!(r["verified"], true, "{r:#}");
    assert_eq!(r["bytes"], 8 * MIB);
    assert_eq!(r["first_mismatch"], Value::Null);
    assert!(r["h2d_gib_s"].as_f64().unwrap() > 0.0);
    assert!(r["d2h_gib_s"].as_f64().unwrap() > 0.0);
    let base = run1.base();
    let htod = run1.calls("cuMemcpyHtoD_v2");
    let dtoh = run1.calls("cuMemcpyDtoH_v2");
    assert_eq!(htod.len(), 1);
    assert!(
        htod[0].contains(&format!(
            " {base:#x} {} registered=1 -> CUDA_SUCCESS",
            8 * MIB
        )),
        "{htod:?}"
    );
    assert!(
        dtoh[0].starts_with(&format!("cuMemcpyDtoH_v2 {base:#x} ")),
        "{dtoh:?}"
    );
    assert!(
        dtoh[0].ends_with("registered=1 -> CUDA_SUCCESS"),
        "{dtoh:?}"
    );
    assert_eq!(run1.calls("cuMemAlloc_v2").len(), 1);
    assert_eq!(run1.calls("cuMemFree_v2").len(), 1);
    assert!(run1.calls("cuMemFree_v2")[0].ends_with("CUDA_SUCCESS"));
    // The copy check retains and releases the context once more.
    assert_eq!(run1.calls("cuDevicePrimaryCtxRelease_v2").len(), 2);
    assert_eq!(run1.result["teardown_issues"], json!([]));

    let env = [
        (VERIFY_BYTES, (8 * MIB).to_string()),
        ("FAKE_CUDA_CORRUPT_COPY", "1".to_string()),
    ];
    let run2 = run("pool", cfg.clone(), Lib::Fake, &env);
    let r = &run2.result["verify"]["report"];
    assert_eq!(r["verified"], false, "{:#}", run2.result);
    assert_eq!(r["first_mismatch"], 4 * MIB);

    let env = [(VERIFY_BYTES, (65 * MIB).to_string())];
    let run3 = run("pool", cfg, Lib::Fake, &env);
    assert!(
        run3.error("verify").contains("not 65 MiB"),
        "{:#}",
        run3.result
    );
}

// ---------------------------------------------------------------------------
// numa_node = "gpu": the GPU plugin record (locate, list) and the doctor's
// GPU table, against the fake driver and a fake sysfs.

/// Driver calls that locating or listing GPUs may make: no context is
/// retained or made current, nothing is registered.
const LOCATE_CALLS: &[&str] = &[
    "cuInit",
    "cuDriverGetVersion",
    "cuDeviceGetCount",
    "cuDeviceGet",
    "cuDeviceGetName",
    "cuDeviceGetPCIBusId",
    "cuGetErrorName",
    "cuGetErrorString",
];

fn assert_only_locate_calls(run: &Run) {
    for call in &run.log {
        let name = call.split(' ').next().unwrap_or("");
        assert!(
            LOCATE_CALLS.contains(&name),
            "locating a GPU made a call beyond device queries: {call}\n{:#?}",
            run.log
        );
    }
}

/// Environment of the fake driver: `devices` devices, PCI bus ids `ids`.
fn fake_gpus(devices: u32, ids: &str) -> Vec<(&'static str, String)> {
    vec![
        ("FAKE_CUDA_DEVICES", devices.to_string()),
        ("FAKE_CUDA_PCI_BUS_IDS", ids.to_string()),
    ]
}

/// A sysfs tree (for `HOSTPOOL_TEST_SYSFS_ROOT`) of a host with two NUMA
/// nodes, CPUs 0-3 on node 0 and 4-7 on node 1, and three GPUs at the fake
/// driver's default addresses of devices 0 and 1 and at 0000:3b:00.0:
/// 0000:18:00.0 on node 0 (local_cpulist 0-3), 0000:28:00.0 on node 1
/// (no local_cpulist: the node's cpulist says), 0000:3b:00.0 with no node
/// (-1, local_cpulist 0-7). Device 3's default address, 0000:48:00.0, is
/// not in it.
fn two_node_sysfs() -> TempDir {
    let root = TempDir::new();
    let write = |rel: &str, text: &str| {
        let path = root.0.join(rel);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, text).unwrap();
    };
    write("devices/system/node/online", "0-1\n");
    write("devices/system/node/node0/cpulist", "0-3\n");
    write("devices/system/node/node1/cpulist", "4-7\n");
    write("bus/pci/devices/0000:18:00.0/numa_node", "0\n");
    write("bus/pci/devices/0000:18:00.0/local_cpulist", "0-3\n");
    write("bus/pci/devices/0000:28:00.0/numa_node", "1\n");
    write("bus/pci/devices/0000:3b:00.0/numa_node", "-1\n");
    write("bus/pci/devices/0000:3b:00.0/local_cpulist", "0-7\n");
    root
}

fn with_sysfs(root: &TempDir, mut env: Vec<(&'static str, String)>) -> Vec<(&'static str, String)> {
    env.push((
        "HOSTPOOL_TEST_SYSFS_ROOT",
        root.0.to_str().unwrap().to_string(),
    ));
    env
}

/// The findings of an area and item.
fn findings<'a>(run: &'a Run, area: &str, item: &str) -> Vec<&'a Value> {
    run.result["findings"]
        .as_array()
        .unwrap_or_else(|| panic!("no findings: {:#}", run.result))
        .iter()
        .filter(|f| f["area"] == area && f["item"] == item)
        .collect()
}

fn finding<'a>(run: &'a Run, area: &str, item: &str) -> &'a Value {
    match findings(run, area, item).as_slice() {
        [f] => f,
        other => panic!(
            "{} findings {area}/{item}, not one: {:#}",
            other.len(),
            run.result
        ),
    }
}

#[test]
fn locating_the_gpu_gives_the_fake_drivers_pci_address_of_the_cuda_device() {
    let env = fake_gpus(2, "0000:3B:00.0,00000000:86:00.0");
    let run1 = run(
        "locate",
        config(true, json!({ "cuda": { "device": 1 } })),
        Lib::Fake,
        &env,
    );
    let want = json!({
        "ok": true,
        "gpu": { "ordinal": 1, "pci_address": "00000000:86:00.0", "name": "fake-cuda device 1" },
    });
    assert_eq!(run1.result["locate"], want, "{:#}", run1.result);
    // The record numa_node = "gpu" asks is this crate's, and says the same.
    let record = &run1.result["record"];
    assert_eq!(record["name"], "cuda", "{record:#}");
    assert_eq!(record["origin"], "pinner-cuda");
    assert_eq!(record["located"], want);
    assert_eq!(
        run1.calls("cuDeviceGetPCIBusId"),
        ["cuDeviceGetPCIBusId 64 1 -> CUDA_SUCCESS"; 2]
    );
    assert_eq!(
        run1.calls("cuDeviceGet"),
        ["cuDeviceGet 1 -> CUDA_SUCCESS"; 2]
    );
    assert_only_locate_calls(&run1);

    // No [cuda] table: device 0, the driver's address as it wrote it.
    let run2 = run("locate", config(true, json!({})), Lib::Fake, &env);
    assert_eq!(
        run2.result["locate"]["gpu"],
        json!({ "ordinal": 0, "pci_address": "0000:3B:00.0", "name": "fake-cuda device 0" }),
        "{:#}",
        run2.result
    );
    assert_eq!(
        run2.calls("cuDeviceGetPCIBusId"),
        ["cuDeviceGetPCIBusId 64 0 -> CUDA_SUCCESS"; 2]
    );

    // An address that is not one is the driver's fault, said as such.
    let run3 = run(
        "locate",
        config(true, json!({})),
        Lib::Fake,
        &fake_gpus(1, "3B:00.0"),
    );
    assert_eq!(
        run3.result["locate"]["not_available"], false,
        "{:#}",
        run3.result
    );
    assert_contains_all(
        &run3.error("locate"),
        &[
            "cuDeviceGetPCIBusId gave CUDA device 0 an address that is not one",
            "\"3B:00.0\"",
        ],
    );
}

#[test]
fn locating_a_device_past_the_count_says_so_as_pinning_does() {
    let env = fake_gpus(2, "");
    let cfg = config(true, json!({ "cuda": { "device": 5 } }));
    let run1 = run("locate", cfg.clone(), Lib::Fake, &env);
    let l = &run1.result["locate"];
    assert_eq!(l["not_available"], true, "{l:#}");
    let sentence = "CUDA device 5 does not exist: this host has 2 CUDA devices (0 to 1); set \
                    [cuda] device";
    assert_contains_all(
        &run1.error("locate"),
        &[
            "numa_node = \"gpu\" (the NUMA node of CUDA device 5) is not available on this host",
            sentence,
            ", or give numa_node as a number instead (see `hostpool doctor`'s GPU table",
        ],
    );
    assert!(
        run1.calls("cuDeviceGetPCIBusId").is_empty(),
        "{:?}",
        run1.log
    );
    assert_only_locate_calls(&run1);
    // Pinning the same pool says the same of the device.
    let run2 = run("pool", cfg, Lib::Fake, &env);
    assert!(run2.error("build").contains(sentence), "{:#}", run2.result);

    // No device at all.
    let run3 = run(
        "locate",
        config(true, json!({})),
        Lib::Fake,
        &fake_gpus(0, ""),
    );
    assert_eq!(run3.result["locate"]["not_available"], true);
    assert_contains_all(
        &run3.error("locate"),
        &[
            "no CUDA device: cuInit returned CUDA_ERROR_NO_DEVICE",
            "; give numa_node as a number instead",
        ],
    );
}

#[test]
fn locating_without_a_driver_is_not_available_and_says_to_give_numa_node_as_a_number() {
    let run1 = run("locate", config(true, json!({})), Lib::Broken, &[]);
    let l = &run1.result["locate"];
    assert_eq!(l["not_available"], true, "{:#}", run1.result);
    assert_contains_all(
        &run1.error("locate"),
        &[
            "numa_node = \"gpu\" (the NUMA node of CUDA device 0) is not available on this host: \
             no CUDA driver (libcuda.so.1) on this host; install the NVIDIA driver",
            "LD_LIBRARY_PATH",
            "`--gpus`), or give numa_node as a number instead (see `hostpool doctor`'s GPU \
             table, item \"GPU NUMA placement\")",
        ],
    );
    assert_eq!(run1.result["record"]["located"], *l);
    assert!(run1.log.is_empty(), "{:?}", run1.log);
    assert!(
        !run1.stderr.contains("Unable to dynamically load"),
        "{}",
        run1.stderr
    );
    let run2 = run("list", json!({}), Lib::Broken, &[]);
    assert_eq!(
        run2.result["list"]["not_available"], true,
        "{:#}",
        run2.result
    );
    assert_contains_all(
        &run2.error("list"),
        &[
            "no CUDA driver (libcuda.so.1)",
            "give numa_node as a number instead",
        ],
    );
    // The staging holds for pinning too: the same "no driver" as on a host
    // without one.
    let run3 = run("probe", json!({}), Lib::Broken, &[]);
    assert_eq!(run3.result["probe"]["not_available"], true);
    assert!(
        run3.result["probe"]["error"]
            .as_str()
            .unwrap()
            .contains("no CUDA driver (libcuda.so.1) on this host"),
        "{:#}",
        run3.result
    );

    // A library without the driver's symbols: the driver's own remedy,
    // then the number.
    let libm = impostor_library().expect("a glibc host has libm.so.6");
    let run4 = run("locate", config(true, json!({})), Lib::Impostor(libm), &[]);
    assert_eq!(run4.result["locate"]["not_available"], true);
    assert_contains_all(
        &run4.error("locate"),
        &[
            "the CUDA driver library lacks cuInit, ",
            "cuDeviceGetPCIBusId",
            "update the NVIDIA driver, or give numa_node as a number instead",
        ],
    );
}

#[test]
fn listing_gpus_gives_every_device_in_order_without_a_context() {
    let run1 = run(
        "list",
        json!({}),
        Lib::Fake,
        &fake_gpus(3, ",,00000000:3B:00.0"),
    );
    assert_eq!(
        run1.result["list"],
        json!({ "ok": true, "gpu": [
            { "ordinal": 0, "pci_address": "0000:18:00.0", "name": "fake-cuda device 0" },
            { "ordinal": 1, "pci_address": "0000:28:00.0", "name": "fake-cuda device 1" },
            { "ordinal": 2, "pci_address": "00000000:3B:00.0", "name": "fake-cuda device 2" },
        ]}),
        "{:#}",
        run1.result
    );
    assert_eq!(
        run1.calls("cuDeviceGetPCIBusId"),
        [0, 1, 2].map(|d| format!("cuDeviceGetPCIBusId 64 {d} -> CUDA_SUCCESS"))
    );
    assert_only_locate_calls(&run1);

    // No device: an empty list, not an error.
    let run2 = run("list", json!({}), Lib::Fake, &fake_gpus(0, ""));
    assert_eq!(run2.result["list"], json!({ "ok": true, "gpu": [] }));
}

#[test]
fn the_doctor_maps_each_gpu_to_its_numa_node_and_cpus() {
    let sysfs = two_node_sysfs();
    let env = with_sysfs(&sysfs, fake_gpus(3, ",,0000:3B:00.0"));
    let run1 = run("doctor", Value::Null, Lib::Fake, &env);
    let f = finding(&run1, "cuda", "GPU NUMA placement");
    assert_eq!(
        f["value"],
        "GPU 0 0000:18:00.0: node 0, CPUs 0-3; GPU 1 0000:28:00.0: node 1, CPUs 4-7; \
         GPU 2 0000:3b:00.0: no node (-1), CPUs 0-7",
        "{f:#}"
    );
    assert_eq!(
        f["details"],
        json!([
            { "device": 0, "name": "fake-cuda device 0", "pci_address": "0000:18:00.0",
              "node": 0, "cpus": "0-3" },
            { "device": 1, "name": "fake-cuda device 1", "pci_address": "0000:28:00.0",
              "node": 1, "cpus": "4-7" },
            { "device": 2, "name": "fake-cuda device 2", "pci_address": "0000:3b:00.0",
              "node": null, "cpus": "0-7" },
        ])
    );
    // A GPU without a node on a host of two nodes is worth knowing.
    assert_eq!(f["verdict"], "info", "{f:#}");
    assert_contains_all(
        f["remedy"].as_str().unwrap(),
        &[
            "GPU 2 no NUMA node (-1) although this host has nodes 0-1",
            "give numa_node as a number",
        ],
    );
    // No pool was asked about: nothing in area pool.
    assert!(findings(&run1, "pool", "numa_node vs GPU").is_empty());
    assert_only_locate_calls(&run1);

    // Two GPUs, each on its node: ok.
    let run2 = run(
        "doctor",
        Value::Null,
        Lib::Fake,
        &with_sysfs(&sysfs, fake_gpus(2, "")),
    );
    let f = finding(&run2, "cuda", "GPU NUMA placement");
    assert_eq!(f["verdict"], "ok", "{f:#}");
    assert_eq!(f["remedy"], Value::Null);
    assert_eq!(f["details"].as_array().unwrap().len(), 2);

    // A GPU sysfs does not know (device 3, 0000:48:00.0).
    let run3 = run(
        "doctor",
        Value::Null,
        Lib::Fake,
        &with_sysfs(&sysfs, fake_gpus(4, ",,0000:3B:00.0")),
    );
    let f = finding(&run3, "cuda", "GPU NUMA placement");
    assert_eq!(f["verdict"], "info", "{f:#}");
    assert!(
        f["value"]
            .as_str()
            .unwrap()
            .ends_with("; GPU 3 0000:48:00.0: not in sysfs"),
        "{f:#}"
    );
    let row = &f["details"][3];
    assert_eq!((&row["node"], &row["cpus"]), (&Value::Null, &Value::Null));
    assert!(
        row["error"].as_str().unwrap().contains("0000:48:00.0"),
        "{row:#}"
    );
    assert!(
        f["remedy"]
            .as_str()
            .unwrap()
            .starts_with("numa_node = \"gpu\" fails for GPU 3: "),
        "{f:#}"
    );

    // Without a driver there is no table (the driver finding says why).
    let run4 = run(
        "doctor",
        Value::Null,
        Lib::Broken,
        &with_sysfs(&sysfs, vec![]),
    );
    assert!(findings(&run4, "cuda", "GPU NUMA placement").is_empty());
    assert_eq!(finding(&run4, "cuda", "driver")["verdict"], "info");
}

#[test]
fn the_doctor_checks_a_numeric_numa_node_against_the_pools_gpu() {
    let sysfs = two_node_sysfs();
    let env = with_sysfs(&sysfs, fake_gpus(3, ",,0000:3B:00.0"));
    let pool = |device: u32, numa_node: Value| {
        config(
            false,
            json!({ "cuda": { "device": device }, "numa_node": numa_node }),
        )
    };

    let run1 = run("doctor", pool(1, json!(0)), Lib::Fake, &env);
    let f = finding(&run1, "pool", "numa_node vs GPU");
    assert_eq!(f["verdict"], "warn", "{f:#}");
    assert_eq!(
        f["value"],
        "numa_node = 0, but CUDA device 1 (0000:28:00.0) is on node 1"
    );
    assert_contains_all(
        f["remedy"].as_str().unwrap(),
        &["numa_node = \"gpu\"", "numa_node = 1"],
    );
    assert_eq!(
        f["details"],
        json!({ "numa_node": 0, "device": 1, "pci_address": "0000:28:00.0", "gpu_node": 1 })
    );
    assert_only_locate_calls(&run1);

    let run2 = run("doctor", pool(1, json!(1)), Lib::Fake, &env);
    let f = finding(&run2, "pool", "numa_node vs GPU");
    assert_eq!(f["verdict"], "ok", "{f:#}");
    assert_eq!(
        f["value"],
        "numa_node = 1, the node of CUDA device 1 (0000:28:00.0)"
    );

    let run3 = run("doctor", pool(0, json!(0)), Lib::Fake, &env);
    assert_eq!(finding(&run3, "pool", "numa_node vs GPU")["verdict"], "ok");

    // The GPU has no node: nothing to check against.
    let run4 = run("doctor", pool(2, json!(1)), Lib::Fake, &env);
    let f = finding(&run4, "pool", "numa_node vs GPU");
    assert_eq!(f["verdict"], "info", "{f:#}");
    assert_eq!(
        f["value"],
        "numa_node = 1; CUDA device 2 (0000:3b:00.0) has no NUMA node (-1)"
    );
    assert_eq!(f["details"]["gpu_node"], Value::Null);

    // numa_node = "gpu", no numa_node, or a pool that does not pin with
    // cuda: no such finding.
    for cfg in [
        pool(1, json!("gpu")),
        config(false, json!({ "cuda": { "device": 1 } })),
        json!({ "size": "64MiB", "backing": "anon", "numa_node": 0, "cuda": { "device": 1 } }),
    ] {
        let run = run("doctor", cfg.clone(), Lib::Fake, &env);
        assert!(
            findings(&run, "pool", "numa_node vs GPU").is_empty(),
            "{cfg}: {:#}",
            run.result
        );
        // The table is there all the same.
        assert_eq!(
            finding(&run, "cuda", "GPU NUMA placement")["verdict"],
            "info"
        );
    }
}

// ---------------------------------------------------------------------------
// Against a real driver, when this host has one.

#[test]
fn real_driver_scenarios_when_present() {
    let probe = probe_child(Lib::Host);
    if probe["ok"] != true {
        eprintln!(
            "skip: no real CUDA driver on this host ({}); the scenarios ran against fake-cuda only",
            probe["error"].as_str().unwrap_or("?")
        );
        return;
    }
    // Pin, copy, unpin: 256 MiB in 64 MiB chunks on 2 MiB blocks.
    let cfg = json!({
        "size": "256MiB", "backing": "anon", "block_size": "2MiB",
        "pin": { "kind": "cuda", "required": true },
        "cuda": { "chunk_size": "64MiB" },
    });
    let env = [(VERIFY_BYTES, (64 * MIB).to_string())];
    let run1 = run("pool", cfg.clone(), Lib::Host, &env);
    if run1.result["build"]["not_available"] == true {
        eprintln!(
            "skip: the CUDA driver is present but not usable: {}",
            run1.error("build")
        );
        return;
    }
    assert_eq!(run1.result["pin"]["status"], "pinned", "{:#}", run1.result);
    let mapped = run1.result["mapped"].as_u64().unwrap();
    let page = run1.result["page"].as_u64().unwrap();
    assert_eq!(
        reported_chunks(&run1.result["pin"]),
        expected_chunks(mapped, page, 2 * MIB, 64 * MIB)
    );
    assert_eq!(
        run1.result["verify"]["report"]["verified"], true,
        "{:#}",
        run1.result
    );
    assert_eq!(run1.result["teardown_issues"], json!([]));
    eprintln!(
        "real driver: pin {:#}, copy {:#}",
        run1.result["pin"]["details"], run1.result["verify"]["report"]
    );

    // A device index past the count.
    let bad = json!({
        "size": "64MiB", "backing": "anon",
        "pin": { "kind": "cuda", "required": true },
        "cuda": { "device": 4096 },
    });
    let run2 = run("pool", bad, Lib::Host, &[]);
    assert_eq!(
        run2.result["build"]["not_available"], true,
        "{:#}",
        run2.result
    );
    assert!(
        run2.error("build")
            .contains("CUDA device 4096 does not exist")
    );

    // Registering pinned memory again fails, and the first pin survives.
    let run3 = run("pin_twice", cfg.clone(), Lib::Host, &[]);
    assert!(
        run3.error("second")
            .contains("cuMemHostRegister of chunk 0")
    );
    assert_eq!(run3.result["teardown_issues"], json!([]));

    // The memlock bound refuses before the driver is asked.
    let env = [(MEMLOCK_LIMIT, MIB.to_string())];
    let run4 = run("memlock", cfg, Lib::Host, &env);
    assert_eq!(
        run4.result["build"]["not_available"], true,
        "{:#}",
        run4.result
    );
    assert!(run4.error("build").contains("RLIMIT_MEMLOCK"));
}

#[test]
fn the_fake_library_is_where_the_tests_look() {
    let lib = fake_library();
    assert!(Path::new(&lib).is_file(), "{}", lib.display());
}
