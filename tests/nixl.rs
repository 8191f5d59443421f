//! The `nixl` registrar through the shipped binary: against the test double
//! of NIXL's C API (crates/fake-nixl as `[nixl] lib`), and against the real
//! NIXL of the `nixl-cu12` wheel, with a second process moving data to and
//! from the pool over loopback.
//!
//! The real-NIXL tests find the library through `HOSTPOOL_NIXL_LIB` (`cargo
//! xtask test` points it at its Python environment's wheel and sets
//! `HOSTPOOL_REQUIRE_NIXL=1` and `UCX_NET_DEVICES=lo`).

mod support;

use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use support::{TempDir, assert_tiles_on_unit, output_text as text, run_hostpool as hostpool};

fn deps_file(name: &str) -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let deps = exe.parent().unwrap();
    [deps.to_path_buf(), deps.parent().unwrap().to_path_buf()]
        .into_iter()
        .map(|d| d.join(name))
        .find(|p| p.exists())
        .unwrap_or_else(|| {
            panic!("{name} is built because its crate is a dev-dependency of hostpool")
        })
}

/// The `nixl_peer` example of registrar-nixl, built for this run with
/// `cargo build --example` into a target directory of its own (`cargo test
/// --all-targets` builds examples as test harnesses, and a directory of its
/// own never waits on the outer cargo's lock); `HOSTPOOL_NIXL_PEER` names a
/// built one instead.
fn nixl_peer() -> PathBuf {
    static PATH: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    PATH.get_or_init(|| {
        if let Some(p) = std::env::var_os("HOSTPOOL_NIXL_PEER") {
            return PathBuf::from(p);
        }
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
        let exe = std::env::current_exe().unwrap();
        let target = exe
            .parent()
            .unwrap()
            .parent()
            .unwrap()
            .parent()
            .unwrap()
            .join("nixl-peer");
        let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
        let out = Command::new(cargo)
            .args([
                "build",
                "--quiet",
                "-p",
                "registrar-nixl",
                "--example",
                "nixl_peer",
                "--manifest-path",
            ])
            .arg(root.join("Cargo.toml"))
            .arg("--target-dir")
            .arg(&target)
            .env_remove("CARGO_TARGET_DIR")
            .output()
            .expect("run cargo to build the nixl_peer example");
        assert!(
            out.status.success(),
            "cargo build --example nixl_peer: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        target.join("debug/examples/nixl_peer")
    })
    .clone()
}

/// A child process killed (and reaped) when the test ends, also by a panic:
/// a holder left behind would keep its pool, and its huge pages.
struct Holder(std::process::Child);

impl Drop for Holder {
    fn drop(&mut self) {
        if self.0.try_wait().ok().flatten().is_none() {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
}

/// A config file registering a `mib` MiB pool with the fake NIXL.
fn fake_config(dir: &Path, mib: u64, block_mib: u64, nixl: Value) -> PathBuf {
    let mut table =
        json!({ "lib": deps_file("libnixl_capi.so").to_str().unwrap(), "agent": "fake-a" });
    table
        .as_object_mut()
        .unwrap()
        .extend(nixl.as_object().unwrap().clone());
    let cfg = json!({
        "size": format!("{mib}MiB"), "block_size": format!("{block_mib}MiB"),
        "register": ["nixl"], "nixl": table,
    });
    let path = dir.join("pool.json");
    std::fs::write(&path, cfg.to_string()).unwrap();
    path
}

fn lines(log: &Path, call: &str) -> Vec<String> {
    std::fs::read_to_string(log)
        .unwrap_or_default()
        .lines()
        .filter(|l| l.starts_with(call))
        .map(str::to_string)
        .collect()
}

fn descs(line: &str) -> String {
    line.split("descs=")
        .nth(1)
        .unwrap()
        .split(' ')
        .next()
        .unwrap()
        .to_string()
}

#[test]
fn the_pool_is_registered_in_regions_split_at_max_region_on_block_boundaries() {
    let dir = TempDir::new("nixl-split");
    let log = dir.0.join("calls.log");
    let cfg = fake_config(
        &dir.0,
        10,
        1,
        json!({ "max_region": "3584KiB", "backend_params": {"num_workers": "2"} }),
    );
    let o = hostpool(
        &["alloc", "--config", cfg.to_str().unwrap(), "--json"],
        &[("FAKE_NIXL_LOG", log.to_str().unwrap())],
    );
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let r: Value = serde_json::from_slice(&o.stdout).unwrap();
    let d = &r["registrations"][0]["details"];
    assert_eq!(
        (
            d["status"].as_str(),
            d["agent"].as_str(),
            d["backend"].as_str()
        ),
        (Some("registered"), Some("fake-a"), Some("UCX"))
    );
    let lens: Vec<u64> = d["regions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x["len"].as_u64().unwrap())
        .collect();
    assert_eq!(
        lens,
        vec![3 << 20, 3 << 20, 3 << 20, 1 << 20],
        "3.5 MiB cut down to whole 1 MiB blocks: {d}"
    );
    assert!(
        d["regions"]
            .as_array()
            .unwrap()
            .iter()
            .all(|x| x["dev_id"] == 0)
    );
    assert_eq!(
        d["metadata"]["base64"],
        registrar_nixl::base64(b"fake-nixl-md:fake-a")
    );
    assert_eq!(d["metadata"]["bytes"], 19);
    assert!(lines(&log, "create_backend")[0].contains("plugin=UCX params=num_workers=2"));
    let reg = lines(&log, "register_mem");
    let dereg = lines(&log, "deregister_mem");
    assert_eq!((reg.len(), dereg.len()), (4, 4));
    let mut reversed: Vec<String> = reg.iter().map(|l| descs(l)).collect();
    reversed.reverse();
    assert_eq!(
        dereg.iter().map(|l| descs(l)).collect::<Vec<_>>(),
        reversed,
        "deregistered last-first"
    );
    assert!(
        lines(&log, "destroy_agent")[0].ends_with("result=0"),
        "nothing left registered"
    );
}

/// vLLM's 61 × 512 B unit on 4 KiB pages: the regions registered with NIXL
/// are cut on multiples of lcm(31232, 4096) = 61 × 4096 bytes.
#[test]
fn a_block_off_the_page_is_registered_in_regions_on_its_lcm_with_the_page() {
    const BLOCK: u64 = 61 * 512;
    const UNIT: u64 = 61 * 4096;
    let dir = TempDir::new("nixl-vllm-block");
    let cfg = dir.0.join("pool.json");
    let body = json!({
        "size": "16MiB", "block_size": BLOCK, "register": ["nixl"],
        "nixl": {
            "lib": deps_file("libnixl_capi.so").to_str().unwrap(),
            "agent": "fake-a", "max_region": "1MiB",
        },
    });
    std::fs::write(&cfg, body.to_string()).unwrap();
    let o = hostpool(&["alloc", "--config", cfg.to_str().unwrap(), "--json"], &[]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let r: Value = serde_json::from_slice(&o.stdout).unwrap();
    let d = &r["registrations"][0]["details"];
    assert_eq!(d["status"], "registered", "{d}");
    let base = d["regions"][0]["addr_u64"].as_u64().unwrap();
    let regions: Vec<(u64, u64)> = d["regions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| {
            (
                x["addr_u64"].as_u64().unwrap() - base,
                x["len"].as_u64().unwrap(),
            )
        })
        .collect();
    // floor(1 MiB / 244 KiB) = 4 units a region.
    assert_eq!(regions[0], (0, 4 * UNIT), "{d}");
    assert_tiles_on_unit(&regions, 16 << 20, UNIT, BLOCK, "NIXL regions");
}

#[test]
fn plan_shows_the_regions_and_the_library() {
    let dir = TempDir::new("nixl-plan");
    let cfg = fake_config(&dir.0, 10, 1, json!({ "max_region": "4MiB" }));
    let o = hostpool(&["plan", "--config", cfg.to_str().unwrap(), "--json"], &[]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let text = String::from_utf8_lossy(&o.stdout);
    let plan: Value = serde_json::from_str(&text).unwrap();
    let found =
        text.contains("\"library_from\": \"[nixl] lib\"") && text.contains("\"agent\": \"fake-a\"");
    assert!(found, "{plan}");
    let regions = find(&plan, "regions").expect("the plan has the nixl regions");
    let lens: Vec<u64> = regions
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x["len"].as_u64().unwrap())
        .collect();
    assert_eq!(lens, vec![4 << 20, 4 << 20, 2 << 20]);
}

fn find<'a>(v: &'a Value, key: &str) -> Option<&'a Value> {
    match v {
        Value::Object(m) => m.get(key).or_else(|| m.values().find_map(|x| find(x, key))),
        Value::Array(a) => a.iter().find_map(|x| find(x, key)),
        _ => None,
    }
}

#[test]
fn a_failed_region_rolls_back_in_reverse_and_names_the_region() {
    let dir = TempDir::new("nixl-fail");
    let log = dir.0.join("calls.log");
    let cfg = fake_config(&dir.0, 10, 1, json!({ "max_region": "3MiB" }));
    let o = hostpool(
        &["alloc", "--config", cfg.to_str().unwrap()],
        &[
            ("FAKE_NIXL_LOG", log.to_str().unwrap()),
            ("FAKE_NIXL_FAIL_REGISTER_AT", "3"),
        ],
    );
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("region 2 of 4 (offset 6 MiB, 3 MiB)"), "{err}");
    assert!(err.contains("NIXL_CAPI_ERROR_BACKEND"), "{err}");
    assert!(
        err.contains("the 2 region(s) before it were deregistered in reverse"),
        "{err}"
    );
    assert_eq!(lines(&log, "deregister_mem").len(), 2);
    assert!(
        lines(&log, "destroy_agent")[0].ends_with("result=0"),
        "nothing left registered"
    );
}

#[test]
fn a_region_the_library_refuses_is_named_and_max_region_makes_it_fit() {
    let dir = TempDir::new("nixl-cap");
    let cap = [("FAKE_NIXL_MAX_REGION", "2097152")];
    let whole = fake_config(&dir.0, 4, 1, json!({}));
    let o = hostpool(&["alloc", "--config", whole.to_str().unwrap()], &cap);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    assert!(
        text(&o).contains("region 0 of 1 (offset 0 B, 4 MiB)")
            && text(&o).contains("INVALID_PARAM"),
        "{}",
        text(&o)
    );
    let split = fake_config(&dir.0, 4, 1, json!({ "max_region": "2MiB" }));
    let o = hostpool(
        &["alloc", "--config", split.to_str().unwrap(), "--json"],
        &cap,
    );
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
}

#[test]
fn a_stub_library_is_not_available_with_the_remedy() {
    let dir = TempDir::new("nixl-stub");
    let cfg = fake_config(&dir.0, 4, 1, json!({}));
    let o = hostpool(
        &["alloc", "--config", cfg.to_str().unwrap()],
        &[("FAKE_NIXL_STUB", "1")],
    );
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    let err = text(&o);
    assert!(
        err.contains("not available")
            && err.contains("is a stub")
            && err.contains("pip install --no-deps nixl-cu12==1.5.1"),
        "{err}"
    );
}

#[test]
fn no_library_fails_when_required_and_is_skipped_with_the_reason_otherwise() {
    let dir = TempDir::new("nixl-none");
    let cfg = fake_config(
        &dir.0,
        4,
        1,
        json!({ "lib": "/nonexistent/libnixl_capi.so" }),
    );
    let o = hostpool(&["alloc", "--config", cfg.to_str().unwrap()], &[]);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    assert!(
        text(&o).contains("cannot load /nonexistent/libnixl_capi.so (from [nixl] lib)"),
        "{}",
        text(&o)
    );
    let cfg = fake_config(
        &dir.0,
        4,
        1,
        json!({ "lib": "/nonexistent/libnixl_capi.so", "required": false }),
    );
    let o = hostpool(&["alloc", "--config", cfg.to_str().unwrap(), "--json"], &[]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let r: Value = serde_json::from_slice(&o.stdout).unwrap();
    let d = &r["registrations"][0]["details"];
    assert_eq!(d["status"], "skipped");
    assert!(d["reason"].as_str().unwrap().contains("cannot load"), "{d}");
}

#[test]
fn a_backend_that_does_not_load_is_a_clear_error() {
    let dir = TempDir::new("nixl-backend");
    let cfg = fake_config(&dir.0, 4, 1, json!({ "backend": "NOPE" }));
    let o = hostpool(&["alloc", "--config", cfg.to_str().unwrap()], &[]);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    assert!(
        text(&o).contains("cannot create agent `fake-a` with backend NOPE")
            && text(&o).contains("NIXL_PLUGIN_DIR"),
        "{}",
        text(&o)
    );
}

#[test]
fn bad_nixl_input_is_a_usage_error() {
    let dir = TempDir::new("nixl-usage");
    for (nixl, want) in [
        (json!({ "max_regoin": "1MiB" }), "max_regoin"),
        (json!({ "max_region": "1MiB" }), "block"),
        (json!({ "listen_port": 0 }), "listen_port"),
    ] {
        let cfg = fake_config(&dir.0, 8, 2, nixl);
        let o = hostpool(&["alloc", "--config", cfg.to_str().unwrap()], &[]);
        assert_eq!(o.status.code(), Some(2), "{}", text(&o));
        assert!(text(&o).contains(want), "{want}: {}", text(&o));
    }
    let o = hostpool(
        &["alloc", "--size", "4MiB", "--nixl-metadata-out", "/tmp/x"],
        &[],
    );
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(
        text(&o).contains("--nixl-metadata-out needs --register nixl"),
        "{}",
        text(&o)
    );
    // A metadata file that can never be written is refused before the pool
    // is built: the fake's call log shows no registration.
    let log = dir.0.join("calls.log");
    let cfg = fake_config(&dir.0, 8, 2, json!({}));
    let missing = dir.0.join("no/such/dir/agent.md");
    for (out, want) in [
        (
            dir.0.clone(),
            "is a directory; give the path of a file".to_string(),
        ),
        (
            missing.clone(),
            format!("({}) does not exist", missing.parent().unwrap().display()),
        ),
    ] {
        let o = hostpool(
            &[
                "alloc",
                "--config",
                cfg.to_str().unwrap(),
                "--nixl-metadata-out",
                out.to_str().unwrap(),
            ],
            &[("FAKE_NIXL_LOG", log.to_str().unwrap())],
        );
        assert_eq!(o.status.code(), Some(2), "{}", text(&o));
        assert!(text(&o).contains(&want), "{want}: {}", text(&o));
        assert!(lines(&log, "register_mem").is_empty(), "nothing registered");
    }
}

#[test]
fn doctor_says_whether_the_library_and_its_backend_load() {
    let dir = TempDir::new("nixl-doctor");
    let cfg = fake_config(&dir.0, 4, 1, json!({}));
    let o = hostpool(
        &["doctor", "--config", cfg.to_str().unwrap(), "--json"],
        &[],
    );
    let r: Value =
        serde_json::from_slice(&o.stdout).unwrap_or_else(|e| panic!("{e}: {}", text(&o)));
    let nixl: Vec<&Value> = find_all(&r, "nixl");
    assert!(
        nixl.iter().any(|f| f["item"] == "library"
            && f["value"]
                .as_str()
                .unwrap()
                .contains("loads: NIXL 1.5 C API, version unknown (not a wheel)")),
        "{r}"
    );
    assert!(
        nixl.iter()
            .any(|f| f["item"] == "backends" && f["value"].as_str().unwrap().contains("UCX loads")),
        "{r}"
    );
    let cfg = fake_config(
        &dir.0,
        4,
        1,
        json!({ "lib": "/nonexistent/libnixl_capi.so" }),
    );
    let o = hostpool(
        &["doctor", "--config", cfg.to_str().unwrap(), "--json"],
        &[],
    );
    let r: Value = serde_json::from_slice(&o.stdout).unwrap();
    let nixl = find_all(&r, "nixl");
    assert!(
        nixl.iter()
            .any(|f| f["verdict"] == "fail"
                && f["remedy"].as_str().unwrap_or("").contains("nixl-cu12")),
        "{r}"
    );
}

fn find_all<'a>(v: &'a Value, area: &str) -> Vec<&'a Value> {
    let mut out = Vec::new();
    fn walk<'a>(v: &'a Value, area: &str, out: &mut Vec<&'a Value>) {
        match v {
            Value::Object(m) => {
                if m.get("area").and_then(Value::as_str) == Some(area) {
                    out.push(v);
                }
                m.values().for_each(|x| walk(x, area, out));
            }
            Value::Array(a) => a.iter().for_each(|x| walk(x, area, out)),
            _ => {}
        }
    }
    walk(v, area, &mut out);
    out
}

#[test]
fn a_pool_registered_with_rdma_and_nixl_is_torn_down_in_reverse() {
    let dir = TempDir::new("nixl-rdma");
    let log = dir.0.join("calls.log");
    let cfg = json!({
        "size": "4MiB", "register": ["rdma", "nixl"],
        "rdma": { "library": deps_file("libibverbs.so").to_str().unwrap() },
        "nixl": { "lib": deps_file("libnixl_capi.so").to_str().unwrap() },
    });
    let path = dir.0.join("pool.json");
    std::fs::write(&path, cfg.to_string()).unwrap();
    let log_s = log.to_str().unwrap();
    let o = hostpool(
        &[
            "alloc",
            "--config",
            path.to_str().unwrap(),
            "--memlock-bound",
            "ignore",
            "--json",
        ],
        &[("FAKE_NIXL_LOG", log_s), ("FAKE_IBV_LOG", log_s)],
    );
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let calls: Vec<String> = std::fs::read_to_string(&log)
        .unwrap()
        .lines()
        .filter_map(|l| l.split(' ').next())
        .filter(|c| {
            [
                "ibv_reg_mr",
                "ibv_dereg_mr",
                "register_mem",
                "deregister_mem",
            ]
            .contains(c)
        })
        .map(str::to_string)
        .collect();
    assert_eq!(
        calls,
        [
            "ibv_reg_mr",
            "register_mem",
            "deregister_mem",
            "ibv_dereg_mr"
        ],
        "rdma, nixl, then nixl, rdma"
    );
}

// ------------------------------------------------------------ real NIXL

fn real_nixl() -> Option<String> {
    match std::env::var("HOSTPOOL_NIXL_LIB") {
        Ok(lib) if Path::new(&lib).exists() => Some(lib),
        _ if std::env::var_os("HOSTPOOL_REQUIRE_NIXL").is_some() => {
            panic!(
                "HOSTPOOL_REQUIRE_NIXL is set but HOSTPOOL_NIXL_LIB does not name libnixl_capi.so"
            )
        }
        _ => {
            eprintln!(
                "skip: HOSTPOOL_NIXL_LIB unset: run under `cargo xtask test`, which installs the nixl-cu12 wheel"
            );
            None
        }
    }
}

// Loopback only. (No UCX_MODULES=^ib: both processes must end cleanly with the
// InfiniBand module loaded, as on an RDMA node.)
const LOOPBACK: [(&str, &str); 1] = [("UCX_NET_DEVICES", "lo")];

/// Process A holds a registered pool; process B (the `nixl_peer` example)
/// writes and reads it through NIXL and notifies A.
fn exchange(tag: &str, extra: &[&str]) {
    let Some(lib) = real_nixl() else { return };
    let dir = TempDir::new(tag);
    let md = dir.0.join("agent.md");
    let mut args = vec![
        "alloc",
        "--size",
        "256MiB",
        "--register",
        "nixl",
        "--hold",
        "--json",
        "--nixl-metadata-out",
        md.to_str().unwrap(),
    ];
    args.extend_from_slice(extra);
    let a = Command::new(env!("CARGO_BIN_EXE_hostpool"))
        .args(&args)
        .env("HOSTPOOL_NIXL_LIB", &lib)
        .envs(LOOPBACK)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut a = Holder(a);
    // The report comes first, a JSON object ending with a `}` line.
    let mut stdout = BufReader::new(a.0.stdout.take().unwrap());
    let mut report = String::new();
    loop {
        let mut line = String::new();
        if stdout.read_line(&mut line).unwrap() == 0 {
            let mut err = String::new();
            a.0.stderr.take().unwrap().read_to_string(&mut err).unwrap();
            panic!("A ended before its report: {err}");
        }
        report.push_str(&line);
        if line == "}\n" {
            break;
        }
    }
    let r: Value = serde_json::from_str(&report).unwrap();
    let d = &r["registrations"][0]["details"];
    assert!(
        md.exists(),
        "the metadata file is written once the pool is ready"
    );
    assert_eq!(
        d["progress_thread"], false,
        "a held pool progresses on its poll, not on a spinning thread"
    );
    let addr = d["regions"][0]["addr"].as_str().unwrap().to_string();
    let peer = Command::new(nixl_peer())
        .args([
            md.to_str().unwrap(),
            &addr,
            &(256u64 << 20).to_string(),
            "hello-from-the-peer",
        ])
        .env("HOSTPOOL_NIXL_LIB", &lib)
        .envs(LOOPBACK)
        .output()
        .unwrap();
    assert_eq!(peer.status.code(), Some(0), "{}", text(&peer));
    let result: Value = serde_json::from_slice(&peer.stdout).unwrap();
    assert_eq!(
        result["verified"], true,
        "B read back every byte it wrote into A: {result}"
    );
    assert_eq!(result["peer"], d["agent"]);
    // A prints the notification the READ carried.
    let stderr = a.0.stderr.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut seen = Vec::new();
    while Instant::now() < deadline {
        match rx.recv_timeout(Duration::from_millis(100)) {
            Ok(line) if line.contains("hello-from-the-peer") => {
                seen.push(line);
                break;
            }
            Ok(line) => seen.push(line),
            Err(_) => {}
        }
    }
    assert!(
        seen.last()
            .is_some_and(|l| l.contains("notification from `nixl-peer-")),
        "{seen:?}"
    );
    rustix::process::kill_process(
        rustix::process::Pid::from_child(&a.0),
        rustix::process::Signal::TERM,
    )
    .unwrap();
    let status = a.0.wait().unwrap();
    assert_eq!(
        status.code(),
        Some(0),
        "A released the pool cleanly on SIGTERM (no crash at exit)"
    );
    assert!(!md.exists(), "the metadata file goes with the pool");
}

#[test]
fn two_processes_exchange_data_through_nixl_on_loopback_with_anon_pages() {
    exchange("nixl-real-anon", &["--backing", "anon"]);
}

#[test]
fn two_processes_exchange_data_through_nixl_on_loopback_with_2m_huge_pages() {
    let Some(mount) = std::env::var_os("HOSTPOOL_TEST_HUGETLBFS_2M") else {
        if std::env::var_os("HOSTPOOL_REQUIRE_HUGEPAGES").is_some() {
            panic!("HOSTPOOL_REQUIRE_HUGEPAGES is set but HOSTPOOL_TEST_HUGETLBFS_2M is not");
        }
        eprintln!("skip: no hugetlbfs mount (run under `cargo xtask test` as root)");
        return;
    };
    let mount = mount.to_string_lossy().into_owned();
    exchange("nixl-real-2m", &["--backing", "hugetlbfs", "--dir", &mount]);
}

#[test]
fn doctor_names_the_real_wheels_version_and_its_ucx_backend() {
    let Some(lib) = real_nixl() else { return };
    let o = hostpool(
        &["doctor", "--register", "nixl", "--json"],
        &[("HOSTPOOL_NIXL_LIB", &lib), LOOPBACK[0]],
    );
    let r: Value =
        serde_json::from_slice(&o.stdout).unwrap_or_else(|e| panic!("{e}: {}", text(&o)));
    let nixl = find_all(&r, "nixl");
    assert!(
        nixl.iter()
            .any(|f| f["details"]["version"] == "nixl_cu12 1.5.1"),
        "{r}"
    );
    assert!(
        nixl.iter()
            .any(|f| f["item"] == "backends" && f["value"].as_str().unwrap().contains("UCX")),
        "{r}"
    );
}
