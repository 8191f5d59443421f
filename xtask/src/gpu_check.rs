//! `cargo xtask gpu-check`: the prepared check of pinning on a real GPU node.
//!
//! The GPU machine has CUDA but no Rust toolchain, so the check is two steps:
//!
//! 1. Here: `cargo xtask gpu-check` builds `hostpool` and `xtask` in release
//!    and prints the one command to run on the GPU node, with the two
//!    binaries to copy along.
//! 2. There: `target/release/xtask gpu-check --run --hostpool
//!    target/release/hostpool --out docs/gpu.md` (as root, under 8 minutes).
//!    For 16 GiB each of anonymous 4 KiB, `/dev/shm` 4 KiB, hugetlbfs 2 MiB
//!    and hugetlbfs 1 GiB pages (the huge pages reserved here and released
//!    after, also on failure or a signal) it measures prefault time,
//!    `cuMemHostRegister` seconds per GiB, and H2D and D2H GiB/s with the data
//!    checked; D2H from a pool on the GPU's own NUMA node against one on
//!    another node, where the machine has two; then it finds out whether
//!    registration fails with
//!    `RLIMIT_MEMLOCK` lowered and `CAP_IPC_LOCK` dropped (the memlock check
//!    of hostpool turned off, so that the driver itself is asked). It writes
//!    the results with the date and the driver version as Markdown.
//!
//! Without a GPU the same run works against the test double of
//! `libcuda.so.1` (`LD_LIBRARY_PATH` pointing at it), which is how it is
//! tested here.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::cmd;
use crate::hugepages::{self, PageSize};

const GIB: u64 = 1 << 30;

/// One pool configuration of the check.
struct Case {
    label: &'static str,
    args: Vec<String>,
    huge: Option<PageSize>,
}

/// `alloc` of `size` bytes pinned with `cuda` (required), with `extra`
/// flags.
fn pinned(size: u64, extra: &[&str]) -> Vec<String> {
    let size = size.to_string();
    [
        "alloc",
        "--size",
        size.as_str(),
        "--pin",
        "cuda",
        "--pin-required",
    ]
    .iter()
    .chain(extra)
    .map(|s| s.to_string())
    .collect()
}

/// [`pinned`], the copy verified, as JSON.
fn pinned_alloc(size: u64, extra: &[&str]) -> Vec<String> {
    pinned(size, &[&["--verify-copy", "--json"], extra].concat())
}

fn cases(size: u64) -> Vec<Case> {
    let base = |extra: &[&str]| pinned_alloc(size, extra);
    vec![
        Case {
            label: "anon 4 KiB",
            args: base(&["--backing", "anon"]),
            huge: None,
        },
        Case {
            label: "/dev/shm 4 KiB",
            args: base(&["--backing", "shm-segmented", "--dir", "/dev/shm"]),
            huge: None,
        },
        Case {
            label: "hugetlbfs 2 MiB",
            args: base(&["--backing", "hugetlbfs", "--page-size", "2MiB"]),
            huge: Some(PageSize::Huge2M),
        },
        Case {
            label: "hugetlbfs 1 GiB",
            args: base(&["--backing", "hugetlbfs", "--page-size", "1GiB"]),
            huge: Some(PageSize::Huge1G),
        },
    ]
}

/// Restores the huge page counters it changed, also when dropped early.
struct Reserved {
    saved: Vec<(PageSize, u64)>,
}

impl Reserved {
    fn reserve(size: u64) -> Result<Reserved, String> {
        let mut r = Reserved { saved: Vec::new() };
        for page in PageSize::ALL {
            if !page.supported() {
                continue;
            }
            let before = hugepages::read_counter(page, "nr_hugepages")?;
            r.saved.push((page, before));
            let bytes = match page {
                PageSize::Huge2M => 2 << 20,
                PageSize::Huge1G => GIB,
            };
            let used = before - hugepages::read_counter(page, "free_hugepages")?;
            let got = hugepages::reserve_at_least(page, used + size / bytes)?;
            eprintln!(
                "xtask: gpu-check: {} pages: {got} reserved (wanted {})",
                page.human(),
                used + size / bytes
            );
        }
        Ok(r)
    }
}

impl Drop for Reserved {
    fn drop(&mut self) {
        for (page, before) in &self.saved {
            if let Err(e) = hugepages::write_counter(*page, "nr_hugepages", *before) {
                eprintln!(
                    "xtask: gpu-check: could not restore {} nr_hugepages to {before}: {e}",
                    page.human()
                );
            }
        }
    }
}

/// What one run of `hostpool` gave.
struct Outcome {
    report: Option<Value>,
    error: Option<String>,
    seconds: f64,
}

fn run_hostpool(hostpool: &Path, args: &[String], limit: Duration) -> Outcome {
    run_command(Command::new(hostpool).args(args), limit)
}

fn run_command(cmd: &mut Command, limit: Duration) -> Outcome {
    let t = Instant::now();
    let child = cmd.stdout(Stdio::piped()).stderr(Stdio::piped()).spawn();
    let mut child = match child {
        Ok(c) => c,
        Err(e) => {
            return Outcome {
                report: None,
                error: Some(format!("could not start: {e}")),
                seconds: 0.0,
            };
        }
    };
    let deadline = Instant::now() + limit;
    let status = loop {
        match child.try_wait() {
            Ok(Some(st)) => break Some(st),
            Ok(None) if Instant::now() >= deadline => {
                let _ = child.kill();
                let _ = child.wait();
                break None;
            }
            Ok(None) => std::thread::sleep(Duration::from_millis(50)),
            Err(_) => break None,
        }
    };
    let output = child.wait_with_output().ok();
    let (stdout, stderr) = output
        .map(|o| {
            (
                String::from_utf8_lossy(&o.stdout).into_owned(),
                String::from_utf8_lossy(&o.stderr).into_owned(),
            )
        })
        .unwrap_or_default();
    let seconds = t.elapsed().as_secs_f64();
    match status {
        Some(st) if st.success() => match serde_json::from_str(&stdout) {
            Ok(v) => Outcome {
                report: Some(v),
                error: None,
                seconds,
            },
            Err(e) => Outcome {
                report: None,
                error: Some(format!("report is not JSON ({e}): {stdout}")),
                seconds,
            },
        },
        Some(st) => Outcome {
            report: None,
            error: Some(format!("exit {:?}: {}", st.code(), stderr.trim())),
            seconds,
        },
        None => Outcome {
            report: None,
            error: Some(format!("timed out after {} s", limit.as_secs())),
            seconds,
        },
    }
}

/// Text as one cell of a Markdown table row: no `|`, no line breaks.
fn cell(text: &str) -> String {
    text.replace('|', "/").replace('\n', " ")
}

fn f(v: &Value) -> Option<f64> {
    v.as_f64()
}

fn gib_s(bytes: f64, secs: f64) -> String {
    if secs > 0.0 {
        format!("{:.2}", bytes / secs / GIB as f64)
    } else {
        "-".into()
    }
}

fn system_line(cmd: &str, args: &[&str]) -> String {
    Command::new(cmd)
        .args(args)
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_else(|| "unknown".into())
}

/// `xtask gpu-check …`.
pub fn run(args: &[String]) -> Result<i32, String> {
    if !args.iter().any(|a| a == "--run") {
        return prepare();
    }
    let value = |flag: &str| {
        args.iter()
            .position(|a| a == flag)
            .and_then(|i| args.get(i + 1))
            .cloned()
    };
    let hostpool =
        PathBuf::from(value("--hostpool").unwrap_or_else(|| "target/release/hostpool".into()));
    let out = PathBuf::from(value("--out").unwrap_or_else(|| "docs/gpu.md".into()));
    let size = match value("--size-gib") {
        Some(s) => {
            s.parse::<u64>()
                .map_err(|e| format!("--size-gib {s}: {e}"))?
                * GIB
        }
        None => 16 * GIB,
    };
    if !hostpool.is_file() {
        return Err(format!(
            "{} not found; build it with `cargo xtask gpu-check` and copy it along",
            hostpool.display()
        ));
    }
    let started = Instant::now();
    let reserved = Reserved::reserve(size)?;
    let mut md = String::new();
    let date = system_line("date", &["-u", "+%Y-%m-%d %H:%M UTC"]);
    let gpu = system_line(
        "nvidia-smi",
        &[
            "--query-gpu=name,driver_version,memory.total",
            "--format=csv,noheader",
        ],
    );
    let _ = writeln!(md, "# GPU check\n");
    let _ = writeln!(md, "- date: {date}");
    let _ = writeln!(md, "- GPU, driver, memory: {gpu}");
    let _ = writeln!(md, "- kernel: {}", system_line("uname", &["-r"]));
    let _ = writeln!(
        md,
        "- CPUs: {}",
        std::thread::available_parallelism().map_or(0, |n| n.get())
    );
    let _ = writeln!(
        md,
        "- pool size per case: {} GiB; command: `{} gpu-check --run`\n",
        size / GIB,
        std::env::args().next().unwrap_or_default()
    );
    let _ = writeln!(
        md,
        "| pages | prefault s | prefault GiB/s | register s | register s/GiB | H2D GiB/s | D2H GiB/s | data checked | teardown s |\n|---|---|---|---|---|---|---|---|---|"
    );
    let mut reg_per_gib: Vec<(&str, f64)> = Vec::new();
    let mut failures = 0;
    for case in cases(size) {
        if let Some(page) = case.huge
            && !page.supported()
        {
            let _ = writeln!(
                md,
                "| {} | kernel has no such pages | | | | | | | |",
                case.label
            );
            continue;
        }
        eprintln!("xtask: gpu-check: {} …", case.label);
        let o = run_hostpool(&hostpool, &case.args, Duration::from_secs(150));
        match &o.report {
            Some(r) => {
                let ph = &r["phases"];
                let pre = f(&ph["prefault"]).unwrap_or(0.0);
                let pin = f(&ph["pin"]).unwrap_or(0.0);
                let gib = r["mapped_bytes"].as_f64().unwrap_or(0.0) / GIB as f64;
                let vc = &r["verify_copy"];
                reg_per_gib.push((case.label, pin / gib.max(1e-9)));
                let _ = writeln!(
                    md,
                    "| {} | {:.3} | {} | {:.3} | {:.4} | {} | {} | {} | {:.3} |",
                    case.label,
                    pre,
                    gib_s(gib * GIB as f64, pre),
                    pin,
                    pin / gib.max(1e-9),
                    f(&vc["h2d_gib_s"]).map_or("-".into(), |v| format!("{v:.1}")),
                    f(&vc["d2h_gib_s"]).map_or("-".into(), |v| format!("{v:.1}")),
                    vc["verified"]
                        .as_bool()
                        .map_or("-", |b| if b { "yes" } else { "NO" }),
                    f(&ph["teardown"]).unwrap_or(0.0),
                );
            }
            None => {
                failures += 1;
                let _ = writeln!(
                    md,
                    "| {} | failed after {:.1} s: {} | | | | | | | |",
                    case.label,
                    o.seconds,
                    cell(o.error.as_deref().unwrap_or(""))
                );
            }
        }
    }
    let ratio = match (
        reg_per_gib.iter().find(|(l, _)| *l == "anon 4 KiB"),
        reg_per_gib.iter().find(|(l, _)| *l == "hugetlbfs 1 GiB"),
    ) {
        (Some((_, small)), Some((_, big))) if *big > 0.0 => format!(
            "{:.1}× faster per GiB with 1 GiB pages than with 4 KiB pages (target: at least 10×)",
            small / big
        ),
        _ => "not measured (a case failed or the kernel lacks 1 GiB pages)".into(),
    };
    let _ = writeln!(
        md,
        "\nRegistration: {ratio}. Seed 000 registered 8 GiB of 4 KiB pages in 3.6 s (0.45 s/GiB) and copied D2H at 54 GB/s (50.3 GiB/s).\n"
    );
    background_section(&mut md, &hostpool, size);
    numa_section(&mut md, &hostpool, (size / 4).max(GIB));
    let _ = writeln!(md, "## Does registration count against RLIMIT_MEMLOCK?\n");
    let _ = writeln!(
        md,
        "Each run drops CAP_IPC_LOCK and lowers RLIMIT_MEMLOCK to at most 64 MiB (`capsh --drop=cap_ipc_lock -- -c 'ulimit -l 65536; …'`), turns hostpool's own memlock check off (`--memlock-bound ignore`), and registers 1 GiB.\n"
    );
    let _ = writeln!(md, "| pages | outcome |\n|---|---|");
    for (label, extra) in [
        ("anon 4 KiB", "--backing anon"),
        ("hugetlbfs 2 MiB", "--backing hugetlbfs --page-size 2MiB"),
    ] {
        // Only ever lower the limit: raising it past the hard limit needs
        // CAP_SYS_RESOURCE, which a container may not have.
        let inner = format!(
            "h=$(ulimit -H -l); if [ \"$h\" = unlimited ] || [ \"$h\" -gt 65536 ]; then h=65536; fi; \
             ulimit -l \"$h\" && echo \"memlock limit: $(ulimit -l) KiB\" >&2 && \
             exec {} alloc --size 1GiB {extra} --pin cuda --pin-required --memlock-bound ignore --json",
            hostpool.display()
        );
        let o = run_command(
            Command::new("capsh").args(["--drop=cap_ipc_lock", "--", "-c", &inner]),
            Duration::from_secs(60),
        );
        let outcome = match (&o.report, &o.error) {
            (Some(r), _) => format!(
                "registered ({} chunk(s)): the driver did NOT refuse with RLIMIT_MEMLOCK at most 64 MiB",
                r["pin"]["details"]["chunks"].as_array().map_or(0, Vec::len)
            ),
            (None, Some(e)) => format!("refused: {}", cell(e)),
            _ => "unknown".into(),
        };
        let _ = writeln!(md, "| {label} | {outcome} |");
    }
    drop(reserved);
    let _ = writeln!(
        md,
        "\nTotal wall time of the check: {:.0} s.",
        started.elapsed().as_secs_f64()
    );
    if let Some(parent) = out.parent() {
        let _ = std::fs::create_dir_all(parent);
    }
    std::fs::write(&out, &md).map_err(|e| format!("write {}: {e}", out.display()))?;
    println!("{md}");
    eprintln!("xtask: gpu-check: wrote {}", out.display());
    Ok(i32::from(failures > 0))
}

/// Background pinning on the real driver: time to usable (the build's
/// phases) and time to pinned (plus the background pin's seconds), 4 KiB
/// against 1 GiB pages. `alloc` without `--hold` waits for the pin.
fn background_section(md: &mut String, hostpool: &Path, size: u64) {
    let _ = writeln!(md, "## Background pinning\n");
    let _ = writeln!(
        md,
        "`alloc --pin cuda --pin-required --pin-background` (chunks of 256 MiB): the pool is usable after its build phases, pinned after the background pin.\n"
    );
    let _ = writeln!(
        md,
        "| pages | time to usable s | time to pinned s | chunks |\n|---|---|---|---|"
    );
    for (label, extra, huge) in [
        ("anon 4 KiB", vec!["--backing", "anon"], None),
        (
            "hugetlbfs 1 GiB",
            vec!["--backing", "hugetlbfs", "--page-size", "1GiB"],
            Some(PageSize::Huge1G),
        ),
    ] {
        if huge.is_some_and(|p: PageSize| !p.supported()) {
            let _ = writeln!(md, "| {label} | kernel has no such pages | | |");
            continue;
        }
        let background = [
            "--pin-background",
            "--pin-background-chunk",
            "256MiB",
            "--json",
        ];
        let args = pinned(size, &[&background[..], &extra].concat());
        let o = run_hostpool(hostpool, &args, Duration::from_secs(150));
        match &o.report {
            Some(r) => {
                let ph = &r["phases"];
                let usable: f64 = ["map", "prefault", "register"]
                    .iter()
                    .filter_map(|k| f(&ph[*k]))
                    .sum();
                let pin = f(&r["pin"]["details"]["seconds"]).unwrap_or(0.0);
                let _ = writeln!(
                    md,
                    "| {label} | {usable:.3} | {:.3} | {} |",
                    usable + pin,
                    r["pin"]["details"]["chunks"]
                );
            }
            None => {
                let _ = writeln!(
                    md,
                    "| {label} | failed: {} | | |",
                    cell(o.error.as_deref().unwrap_or(""))
                );
            }
        }
    }
    let _ = writeln!(md);
}

/// The online NUMA nodes, from sysfs (`0-1` is `[0, 1]`).
fn online_nodes() -> Vec<u32> {
    let text = std::fs::read_to_string("/sys/devices/system/node/online").unwrap_or_default();
    let mut nodes = Vec::new();
    for item in text.trim().split(',').filter(|s| !s.is_empty()) {
        let (lo, hi) = item.split_once('-').unwrap_or((item, item));
        if let (Ok(lo), Ok(hi)) = (lo.trim().parse::<u32>(), hi.trim().parse::<u32>()) {
            nodes.extend(lo..=hi);
        }
    }
    nodes
}

/// D2H (and H2D) bandwidth of a pinned anonymous pool on the GPU's own
/// NUMA node (`--numa-node gpu`, device 0) against one on another node,
/// where the machine has two.
fn numa_section(md: &mut String, hostpool: &Path, size: u64) {
    let _ = writeln!(
        md,
        "## Copies from the GPU's own NUMA node and from another
"
    );
    let _ = writeln!(
        md,
        "`alloc --size {} GiB --backing anon --numa-node gpu|N --pin cuda --pin-required --verify-copy` (device 0).\n",
        size / GIB
    );
    let _ = writeln!(
        md,
        "| pool's node | D2H GiB/s | H2D GiB/s | data checked |\n|---|---|---|---|"
    );
    let run_on = |node: &str| {
        let args = pinned_alloc(size, &["--backing", "anon", "--numa-node", node]);
        run_hostpool(hostpool, &args, Duration::from_secs(150))
    };
    let row = |md: &mut String, label: &str, o: &Outcome| -> Option<f64> {
        match &o.report {
            Some(r) => {
                let vc = &r["verify_copy"];
                let d2h = f(&vc["d2h_gib_s"]);
                let _ = writeln!(
                    md,
                    "| {label} | {} | {} | {} |",
                    d2h.map_or("-".into(), |v| format!("{v:.1}")),
                    f(&vc["h2d_gib_s"]).map_or("-".into(), |v| format!("{v:.1}")),
                    vc["verified"]
                        .as_bool()
                        .map_or("-", |b| if b { "yes" } else { "NO" }),
                );
                d2h
            }
            None => {
                let _ = writeln!(
                    md,
                    "| {label} | failed: {} | | |",
                    cell(o.error.as_deref().unwrap_or(""))
                );
                None
            }
        }
    };
    let own = run_on("gpu");
    let gpu_node = own
        .report
        .as_ref()
        .and_then(|r| r["numa"]["node"].as_u64())
        .map(|n| n as u32);
    let label = match gpu_node {
        Some(n) => format!("{n} (the GPU's)"),
        None => "not bound (the GPU has no NUMA node)".to_string(),
    };
    let own_d2h = row(md, &label, &own);
    let nodes = online_nodes();
    let other = gpu_node.and_then(|g| nodes.iter().copied().find(|n| *n != g));
    match other {
        Some(other) => {
            let o = run_on(&other.to_string());
            let other_d2h = row(md, &format!("{other} (another)"), &o);
            if let (Some(a), Some(b)) = (own_d2h, other_d2h)
                && b > 0.0
            {
                let _ = writeln!(
                    md,
                    "\nD2H from the GPU's own node is {:.2}× that from node {other} (GB200 reports: about 3×, torchtitan #3519).",
                    a / b
                );
            }
        }
        None => {
            let _ = writeln!(
                md,
                "\nThis machine has {} online NUMA node(s) ({nodes:?}): no other node to compare with.",
                nodes.len()
            );
        }
    }
    let _ = writeln!(md);
}

/// Here: build the release binaries and say what to run there.
fn prepare() -> Result<i32, String> {
    let code = cmd::run_step(
        cmd::cargo().args(["build", "--release", "-p", "hostpool-cli", "-p", "xtask"]),
        "cargo build --release",
    )?;
    if code != 0 {
        return Ok(code);
    }
    eprintln!(
        "xtask: gpu-check: built target/release/hostpool and target/release/xtask.\n\
         On the GPU node (root, no toolchain needed), from the repository root, with both binaries copied along:\n\
         \n    target/release/xtask gpu-check --run --hostpool target/release/hostpool --out docs/gpu.md\n\
         \n(for the device tool: carry [\"target/release/hostpool\", \"target/release/xtask\"]; add --out $OUT/gpu.md to get the file back)"
    );
    Ok(0)
}
