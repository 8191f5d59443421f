//! The Python half of the test suite: a virtual environment with the
//! pinned versions of `crates/hostpool-py/requirements-test.txt`, cached
//! outside the clone (`$HOSTPOOL_PY_VENV`, else
//! `${XDG_CACHE_HOME:-~/.cache}/hostpool/py-<hash of that file>`), the
//! `hostpool` package installed into it as the README says
//! (`pip install ./crates/hostpool-py`), and
//! `pytest tests/python` run with the huge page session's variables.

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::cmd;

/// The pinned requirements, relative to the workspace root.
const REQUIREMENTS: &str = "crates/hostpool-py/requirements-test.txt";
/// Written into the environment once every requirement is installed.
const READY: &str = ".hostpool-ready";

/// FNV-1a of the requirements: a new pin makes a new environment.
pub(crate) fn hash(text: &str) -> String {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in text.bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    format!("{:012x}", h >> 16)
}

fn venv_dir(requirements: &str) -> PathBuf {
    if let Some(dir) = std::env::var_os("HOSTPOOL_PY_VENV") {
        return PathBuf::from(dir);
    }
    cache_dir().join(format!("py-{}", hash(requirements)))
}

/// Where the environments live: `${XDG_CACHE_HOME:-~/.cache}/hostpool`,
/// outside any clone.
pub(crate) fn cache_dir() -> PathBuf {
    std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))
        .unwrap_or_else(|| PathBuf::from("/tmp"))
        .join("hostpool")
}

pub(crate) fn run(command: &mut Command, what: &str) -> Result<(), String> {
    match cmd::run_step(command, what)? {
        0 => Ok(()),
        code => Err(format!("{what} exited with status {code}")),
    }
}

/// `python -m pip install --quiet`, without pip's version nag.
pub(crate) fn pip_install(python: &Path) -> Command {
    let mut c = Command::new(python);
    c.args([
        "-m",
        "pip",
        "install",
        "--quiet",
        "--disable-pip-version-check",
    ]);
    c
}

/// The environment's root directory (its python is `bin/python`), created
/// and filled when missing.
pub(crate) fn ensure_venv(root: &Path) -> Result<PathBuf, String> {
    let requirements = std::fs::read_to_string(root.join(REQUIREMENTS))
        .map_err(|e| format!("cannot read {REQUIREMENTS}: {e}"))?;
    let venv = venv_dir(&requirements);
    cached_venv(
        &venv,
        &requirements,
        &format!("python: {REQUIREMENTS} (torch is large: this takes minutes, once)"),
        |python| {
            run(
                pip_install(python).arg("-r").arg(root.join(REQUIREMENTS)),
                "pip install -r requirements-test.txt",
            )
        },
    )?;
    Ok(venv)
}

/// `venv`, made with `python3 -m venv` and filled by `fill` (given its
/// python) unless a finished one is there: one whose ready mark holds
/// `pins`, written only once `fill` succeeded. `what` names it in messages.
pub(crate) fn cached_venv(
    venv: &Path,
    pins: &str,
    what: &str,
    fill: impl FnOnce(&Path) -> Result<(), String>,
) -> Result<PathBuf, String> {
    let python = venv.join("bin/python");
    if venv.join(READY).exists() && python.exists() {
        eprintln!("xtask: using {} for {what}", venv.display());
        return Ok(python);
    }
    eprintln!("xtask: creating {} for {what}", venv.display());
    let system = std::env::var_os("PYTHON").unwrap_or_else(|| "python3".into());
    run(
        Command::new(&system)
            .args(["-m", "venv", "--clear"])
            .arg(venv),
        "python3 -m venv",
    )?;
    fill(&python)?;
    std::fs::write(venv.join(READY), pins)
        .map_err(|e| format!("cannot write {}: {e}", venv.join(READY).display()))?;
    Ok(python)
}

/// What the tests need from the environment, for `cargo test` and pytest
/// alike: the NIXL C API of its `nixl-cu12` wheel (`HOSTPOOL_NIXL_LIB`, with
/// `HOSTPOOL_REQUIRE_NIXL=1` so the NIXL tests fail rather than skip),
/// loopback-only UCX, and its python (`HOSTPOOL_TEST_PYTHON`), whose
/// Mooncake wheel `hostpool doctor`'s test asks about. Creates the
/// environment when missing.
pub fn nixl_env() -> Result<Vec<(String, String)>, String> {
    let venv = ensure_venv(&cmd::workspace_root())?;
    let lib = std::fs::read_dir(venv.join("lib"))
        .map_err(|e| format!("cannot read {}: {e}", venv.join("lib").display()))?
        .flatten()
        .map(|d| {
            d.path()
                .join("site-packages/.nixl_cu12.mesonpy.libs/libnixl_capi.so")
        })
        .find(|p| p.exists())
        .ok_or_else(|| {
            format!(
                "{} has no nixl-cu12 wheel (libnixl_capi.so)",
                venv.display()
            )
        })?;
    Ok(vec![
        (
            "HOSTPOOL_NIXL_LIB".into(),
            lib.to_string_lossy().into_owned(),
        ),
        ("HOSTPOOL_REQUIRE_NIXL".into(), "1".into()),
        ("UCX_NET_DEVICES".into(), "lo".into()),
        (
            "HOSTPOOL_TEST_PYTHON".into(),
            venv.join("bin/python").to_string_lossy().into_owned(),
        ),
    ])
}

/// Build the package into the environment and run the Python tests with
/// `env`; returns pytest's exit status.
pub fn test(env: &[(String, String)]) -> Result<i32, String> {
    let root = cmd::workspace_root();
    let venv = ensure_venv(&root)?;
    // The README's install command, so the tests check it too.
    eprintln!("xtask: python: pip install ./crates/hostpool-py");
    run(
        pip_install(&venv.join("bin/python"))
            .current_dir(&root)
            .args(["--force-reinstall", "--no-deps", "./crates/hostpool-py"])
            // The test hooks the kill tests arm (HOSTPOOL_TEST_FAILPOINTS),
            // which a plain install leaves out.
            .env("MATURIN_PEP517_ARGS", "--features failpoints")
            .env("PATH", venv_path(&venv)),
        "pip install ./crates/hostpool-py",
    )?;
    // The CLI (with its test hooks, as `cargo test` builds it) and the CUDA
    // double the tests use.
    run(
        cmd::cargo().args([
            "build",
            "--quiet",
            "-p",
            "hostpool-cli",
            "-p",
            "fake-cuda",
            "--features",
            "hostpool-cli/failpoints",
        ]),
        "cargo build -p hostpool-cli -p fake-cuda --features hostpool-cli/failpoints",
    )?;
    eprintln!("xtask: python: pytest tests/python");
    cmd::run_step(
        &mut pytest(&venv, Path::new("tests/python"), env),
        "pytest tests/python",
    )
}

/// `PATH` with `venv`'s `bin` first.
fn venv_path(venv: &Path) -> std::ffi::OsString {
    let mut path = std::ffi::OsString::from(venv.join("bin"));
    if let Some(old) = std::env::var_os("PATH") {
        path.push(":");
        path.push(old);
    }
    path
}

/// `python -m pytest DIR -q -ra -p no:cacheprovider` with `venv`'s python,
/// from the workspace root, with `venv` first on `PATH`, the CLI and the
/// CUDA double the tests use (`HOSTPOOL_BIN`, `HOSTPOOL_FAKE_CUDA`), and
/// `env`.
pub(crate) fn pytest(venv: &Path, dir: &Path, env: &[(String, String)]) -> Command {
    let root = cmd::workspace_root();
    let target = root.join("target/debug");
    let mut pytest = Command::new(venv.join("bin/python"));
    pytest
        .current_dir(&root)
        .args(["-m", "pytest"])
        .arg(dir)
        .args(["-q", "-ra", "-p", "no:cacheprovider"])
        .env("PATH", venv_path(venv))
        .env("HOSTPOOL_BIN", target.join("hostpool"))
        .env("HOSTPOOL_FAKE_CUDA", target.join("libfake_cuda.so"))
        .envs(env.iter().map(|(k, v)| (k, v)));
    pytest
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_new_pin_names_a_new_environment() {
        assert_eq!(hash("torch==2.15.0\n"), hash("torch==2.15.0\n"));
        assert_ne!(hash("torch==2.15.0\n"), hash("torch==2.15.1\n"));
        assert!(venv_dir("x").to_string_lossy().contains("hostpool"));
    }
}
