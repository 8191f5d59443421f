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
    run(
        Command::new(bin.join("maturin"))
            .args([
                "build",
                "--release",
                "--strip",
                "--zig",
                "--compatibility",
                MANYLINUX,
            ])
            .arg("-m")
            .arg(&manifest)
            .arg("--out")
            .arg(&out)
            .env("PATH", &path),
        "maturin build --release --zig",
    )?;
    run(
        Command::new(bin.join("maturin"))
            .arg("sdist")
            .arg("-m")
            .arg(&manifest)
            .arg("--out")
            .arg(&out)
            .env("PATH", &path),
        "maturin sdist",
    )?;
    let wheel = std::fs::read_dir(&out)
        .map_err(|e| format!("cannot read {}: {e}", out.display()))?
        .flatten()
        .map(|e| e.path())
        .find(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with("hostpool-") && n.ends_with(".whl"))
        })
        .ok_or_else(|| format!("maturin built no wheel into {}", out.display()))?;
    let name = wheel.file_name().unwrap_or_default().to_string_lossy();
    for tag in ["-abi3-", MANYLINUX] {
        if !name.contains(tag) {
            return Err(format!("the wheel {name} is not tagged {tag}"));
        }
    }
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
        )
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
