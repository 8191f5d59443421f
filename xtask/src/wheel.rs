//! `cargo xtask wheel`: the release wheel of the Python package, for Linux
//! x86-64, and its sdist, into `target/wheels/`.
//!
//! One abi3 wheel (CPython 3.11 and later), `manylinux_2_28`: maturin
//! builds it with `--zig`, so the extension links against glibc 2.28's
//! symbols whatever glibc this machine has, and checks it as auditwheel does
//! (`--compatibility manylinux_2_28` refuses a symbol or a library outside
//! the policy). The CUDA driver, libibverbs and libnixl are loaded at run
//! time, so the wheel needs none of them. maturin and zig come from a cached
//! environment with pinned versions ([`PINS`]), outside the clone.
//!
//! The wheel carries the `hostpool` CLI: maturin builds the CLI crate as a
//! binary (`--bindings bin`, the same zig and policy check), and the binary
//! is added to the package's wheel as `hostpool-<version>.data/scripts/
//! hostpool`, with its line in `RECORD`, so `pip install` puts a `hostpool`
//! command on the PATH (and `python -m hostpool` runs it). The extension
//! links no CLI code; the binary links it once.
//!
//! It prints the wheel's size and what it holds.

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::cmd;
use crate::python::{cache_dir, cached_venv, hash, pip_install, run};

/// What the build environment holds.
const PINS: &str = "maturin==1.16.0\nziglang==0.17.1\n";

/// The manylinux policy the wheel meets.
pub const MANYLINUX: &str = "manylinux_2_28";

/// The build environment's python, created when missing.
fn build_env() -> Result<PathBuf, String> {
    let venv = cache_dir().join(format!("wheel-{}", hash(PINS)));
    cached_venv(&venv, PINS, "building the wheel (maturin, zig)", |python| {
        let mut c = pip_install(python);
        for pin in PINS.lines() {
            c.arg(pin);
        }
        run(&mut c, "pip install maturin ziglang")
    })
}

/// Build the wheel and the sdist; returns the wheel's path.
pub fn build() -> Result<PathBuf, String> {
    let root = cmd::workspace_root();
    let python = build_env()?;
    let bin = python.parent().unwrap_or(Path::new("."));
    let out = root.join("target/wheels");
    let manifest = root.join("crates/hostpool-py/Cargo.toml");
    // Only this build's wheel is reported.
    if let Ok(entries) = std::fs::read_dir(&out) {
        for e in entries.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            if name.starts_with("hostpool-") && name.ends_with(".whl") {
                let _ = std::fs::remove_file(e.path());
            }
        }
    }
    let path = format!(
        "{}:{}",
        bin.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let release = [
        "build",
        "--release",
        "--strip",
        "--zig",
        "--compatibility",
        MANYLINUX,
    ];
    maturin(
        bin,
        &path,
        &release,
        &manifest,
        &out,
        "maturin build --release --zig",
    )?;
    maturin(bin, &path, &["sdist"], &manifest, &out, "maturin sdist")?;
    let wheel = find_wheel(&out, "hostpool-")?;
    let name = wheel.file_name().unwrap_or_default().to_string_lossy();
    let versioned = format!("hostpool-{}-", env!("CARGO_PKG_VERSION"));
    for tag in [versioned.as_str(), "-abi3-", MANYLINUX] {
        if !name.contains(tag) {
            return Err(format!("the wheel {name} is not tagged {tag}"));
        }
    }
    add_cli(&python, bin, &path, &wheel)?;
    let size = std::fs::metadata(&wheel).map(|m| m.len()).unwrap_or(0);
    eprintln!(
        "xtask: wheel: {} ({:.1} MiB)",
        wheel.display(),
        size as f64 / f64::from(1u32 << 20)
    );
    run(
        Command::new(&python)
            .args(["-m", "zipfile", "-l"])
            .arg(&wheel),
        "list the wheel",
    )?;
    Ok(wheel)
}

/// Adds a script to a wheel: `argv[1]` the wheel, `argv[2]` the binary's
/// wheel, whose `*.data/scripts/hostpool` is copied into the first as its
/// own `*.data/scripts/hostpool`, `RECORD` rewritten with its hash.
const ADD_SCRIPT: &str = r#"
import base64, hashlib, os, sys, zipfile
wheel, bin_wheel = sys.argv[1], sys.argv[2]
with zipfile.ZipFile(bin_wheel) as b:
    name = next(n for n in b.namelist() if n.endswith(".data/scripts/hostpool"))
    data = b.read(name)
out = wheel + ".part"
with zipfile.ZipFile(wheel) as src, zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as dst:
    record_name = next(n for n in src.namelist() if n.endswith(".dist-info/RECORD"))
    dist = record_name.split("/")[0]
    target = dist[: -len(".dist-info")] + ".data/scripts/hostpool"
    for item in src.infolist():
        if item.filename != record_name:
            dst.writestr(item, src.read(item.filename))
    info = zipfile.ZipInfo(target, date_time=(1980, 1, 1, 0, 0, 0))
    info.external_attr = (0o100755) << 16
    info.compress_type = zipfile.ZIP_DEFLATED
    dst.writestr(info, data)
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    lines = [l for l in src.read(record_name).decode().splitlines() if l and not l.startswith(record_name + ",")]
    lines += [f"{target},sha256={digest},{len(data)}", f"{record_name},,"]
    dst.writestr(record_name, "\n".join(lines) + "\n")
os.replace(out, wheel)
print(f"added {target} ({len(data)} bytes)")
"#;

/// `maturin ARGS -m MANIFEST --out OUT` from the build environment `bin`,
/// with `path` (zig on it).
fn maturin(
    bin: &Path,
    path: &str,
    args: &[&str],
    manifest: &Path,
    out: &Path,
    what: &str,
) -> Result<(), String> {
    run(
        Command::new(bin.join("maturin"))
            .args(args)
            .arg("-m")
            .arg(manifest)
            .arg("--out")
            .arg(out)
            .env("PATH", path),
        what,
    )
}

/// The wheel in `dir` whose name starts with `prefix`.
fn find_wheel(dir: &Path, prefix: &str) -> Result<PathBuf, String> {
    std::fs::read_dir(dir)
        .map_err(|e| format!("cannot read {}: {e}", dir.display()))?
        .flatten()
        .map(|e| e.path())
        .find(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with(prefix) && n.ends_with(".whl"))
        })
        .ok_or_else(|| format!("maturin built no {prefix}* wheel into {}", dir.display()))
}

/// Build the CLI as maturin builds a binary wheel (zig, the same policy
/// check) and add the binary to `wheel`.
fn add_cli(python: &Path, bin: &Path, path: &str, wheel: &Path) -> Result<(), String> {
    let root = cmd::workspace_root();
    let tmp = root.join("target/wheels/cli");
    let _ = std::fs::remove_dir_all(&tmp);
    let release = [
        "build",
        "--release",
        "--strip",
        "--zig",
        "--bindings",
        "bin",
    ];
    maturin(
        bin,
        path,
        &[&release[..], &["--compatibility", MANYLINUX]].concat(),
        &root.join("crates/hostpool-cli/Cargo.toml"),
        &tmp,
        "maturin build --bindings bin (the CLI)",
    )?;
    let bin_wheel = find_wheel(&tmp, "hostpool_cli-")?;
    run(
        Command::new(python)
            .args(["-c", ADD_SCRIPT])
            .arg(wheel)
            .arg(&bin_wheel),
        "add the CLI to the wheel",
    )?;
    let _ = std::fs::remove_dir_all(&tmp);
    Ok(())
}

/// Install `wheel` into a fresh virtual environment, with neither cargo
/// nor rustc on the PATH and nothing from the network, and use it: import
/// the package, check its version against the workspace's, build a pool.
fn check(wheel: &Path) -> Result<(), String> {
    let dir = std::env::temp_dir().join(format!("hostpool-wheel-check-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let clean_path = "/usr/local/bin:/usr/bin:/bin";
    let system = std::env::var_os("PYTHON").unwrap_or_else(|| "python3".into());
    let result = (|| {
        run(
            Command::new(&system)
                .args(["-m", "venv"])
                .arg(&dir)
                .env("PATH", clean_path),
            "python3 -m venv (clean)",
        )?;
        let python = dir.join("bin/python");
        run(
            pip_install(&python)
                .args(["--no-index", "--no-deps"])
                .arg(wheel)
                .env("PATH", clean_path)
                .env_remove("CARGO_HOME")
                .env_remove("RUSTUP_HOME"),
            "pip install the wheel (no network, no Rust)",
        )?;
        let code = format!(
            "import hostpool\n\
             assert hostpool.__version__ == {version:?}, hostpool.__version__\n\
             with hostpool.Pool(size='8MiB') as pool:\n\
             \x20   assert pool.report['version'] == {version:?}\n\
             \x20   assert pool.report['prefault']['bytes'] == 8 << 20, pool.report['prefault']\n\
             print('hostpool', hostpool.__version__, 'from the wheel: a pool of', pool.nbytes, 'bytes')\n",
            version = env!("CARGO_PKG_VERSION")
        );
        run(
            Command::new(&python)
                .args(["-c", &code])
                .current_dir(&dir)
                .env("PATH", clean_path),
            "use the installed wheel",
        )?;
        // The CLI it put on the PATH, and `python -m hostpool`.
        let venv_path = format!("{}:{clean_path}", dir.join("bin").display());
        let cli = |args: &[&str]| -> Result<std::process::Output, String> {
            Command::new("hostpool")
                .args(args)
                .env("PATH", &venv_path)
                .current_dir(&dir)
                .output()
                .map_err(|e| format!("cannot run the wheel's hostpool {args:?}: {e}"))
        };
        let version = cli(&["--version"])?;
        let said = String::from_utf8_lossy(&version.stdout).trim().to_string();
        if said != format!("hostpool {}", env!("CARGO_PKG_VERSION")) {
            return Err(format!("the wheel's hostpool --version says {said:?}"));
        }
        let alloc = cli(&["alloc", "--size", "16MiB", "--json"])?;
        let report: serde_json::Value = serde_json::from_slice(&alloc.stdout)
            .map_err(|e| format!("the wheel's hostpool alloc --json: {e}"))?;
        if !alloc.status.success() || report["version"] != env!("CARGO_PKG_VERSION") {
            return Err(format!("the wheel's hostpool alloc --json: {report}"));
        }
        // doctor exits 1 when a finding fails (this node may lack what a
        // finding wants); its JSON must be whole either way.
        let doctor = cli(&["doctor", "--json"])?;
        let findings: serde_json::Value = serde_json::from_slice(&doctor.stdout)
            .map_err(|e| format!("the wheel's hostpool doctor --json: {e}"))?;
        if !matches!(doctor.status.code(), Some(0 | 1)) || !findings["findings"].is_array() {
            return Err(format!("the wheel's hostpool doctor --json: {findings}"));
        }
        let plugins = Command::new(&python)
            .args(["-m", "hostpool", "plugins", "--json"])
            .env("PATH", clean_path)
            .current_dir(&dir)
            .output()
            .map_err(|e| format!("python -m hostpool plugins: {e}"))?;
        let listed: serde_json::Value = serde_json::from_slice(&plugins.stdout)
            .map_err(|e| format!("python -m hostpool plugins --json: {e}"))?;
        if !plugins.status.success() || !listed.to_string().contains("shm-segmented") {
            return Err(format!("python -m hostpool plugins --json: {listed}"));
        }
        eprintln!(
            "xtask: wheel: `hostpool --version`, `alloc --json`, `doctor --json` and \
             `python -m hostpool plugins` ran from the installed wheel"
        );
        Ok(())
    })();
    let _ = std::fs::remove_dir_all(&dir);
    result
}

/// `cargo xtask wheel [--check]`.
pub fn run_command(args: &[String]) -> Result<i32, String> {
    let checked = match args {
        [] => false,
        [a] if a == "--check" => true,
        [a, ..] => return Err(format!("xtask wheel takes --check or nothing, not {a:?}")),
    };
    let wheel = build()?;
    if checked {
        check(&wheel)?;
        eprintln!("xtask: wheel: installed and used without Rust on the PATH");
    }
    Ok(0)
}
