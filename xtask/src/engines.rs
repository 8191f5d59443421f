//! The engines' half of the test suite: hostpool against the serving
//! engines' own released code, each engine in a virtual environment of its
//! own with the torch it pins.
//!
//! Each engine has a folder `tests/engines/<engine>/` with
//! - `requirements.txt`: installed normally (torch and numpy, with their
//!   dependencies);
//! - `requirements-nodeps.txt`: installed with `--no-deps` (the engine's
//!   wheel and only the modules its imported code needs: the engines'
//!   declared dependencies are many GB of GPU stacks that cannot run here);
//! - the pytest files, run in that environment.
//!
//! The environments are cached outside the clone,
//! `${XDG_CACHE_HOME:-~/.cache}/hostpool/engine-<engine>-<hash of both
//! files>`, so a new pin makes a new one. hostpool itself goes in as a wheel
//! built once per run with the test environment's maturin.

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::cmd;
use crate::python;

/// The engines, by folder under `tests/engines`.
pub const ENGINES: &[&str] = &["vllm", "sglang"];

/// Where the hostpool wheel is built, under the workspace root.
const WHEEL_DIR: &str = "target/engine-wheel";

fn engine_dir(root: &Path, engine: &str) -> PathBuf {
    root.join("tests/engines").join(engine)
}

fn read(path: &Path) -> Result<String, String> {
    std::fs::read_to_string(path).map_err(|e| format!("cannot read {}: {e}", path.display()))
}

/// The environment of `engine`, created and filled when missing.
fn ensure_venv(root: &Path, engine: &str) -> Result<PathBuf, String> {
    let dir = engine_dir(root, engine);
    let base = dir.join("requirements.txt");
    let nodeps = dir.join("requirements-nodeps.txt");
    let pins = format!("{}\n--no-deps\n{}", read(&base)?, read(&nodeps)?);
    let venv = python::cache_dir().join(format!("engine-{engine}-{}", python::hash(&pins)));
    python::cached_venv(
        &venv,
        &pins,
        &format!("the {engine} engine tests (torch and the engine: several GB, minutes, once)"),
        |python| {
            python::run(
                python::pip_install(python).arg("-r").arg(&base),
                &format!("pip install -r tests/engines/{engine}/requirements.txt"),
            )?;
            python::run(
                python::pip_install(python)
                    .arg("--no-deps")
                    .arg("-r")
                    .arg(&nodeps),
                &format!("pip install --no-deps -r tests/engines/{engine}/requirements-nodeps.txt"),
            )
        },
    )?;
    Ok(venv)
}

/// Builds the hostpool wheel with the test environment's maturin; returns its path.
fn build_wheel(root: &Path) -> Result<PathBuf, String> {
    let venv = python::ensure_venv(root)?;
    let out = root.join(WHEEL_DIR);
    if out.exists() {
        std::fs::remove_dir_all(&out)
            .map_err(|e| format!("cannot clear {}: {e}", out.display()))?;
    }
    eprintln!("xtask: engines: building the hostpool wheel into {WHEEL_DIR}");
    python::run(
        Command::new(venv.join("bin/python"))
            .current_dir(root)
            .args([
                "-m",
                "maturin",
                "build",
                "--release",
                "--quiet",
                "-m",
                "crates/hostpool-py/Cargo.toml",
                // The vLLM kill test arms a failpoint.
                "--features",
                "failpoints",
                "-o",
            ])
            .arg(&out),
        "maturin build",
    )?;
    std::fs::read_dir(&out)
        .map_err(|e| format!("cannot read {}: {e}", out.display()))?
        .flatten()
        .map(|e| e.path())
        .find(|p| p.extension().is_some_and(|x| x == "whl"))
        .ok_or_else(|| format!("maturin left no wheel in {}", out.display()))
}

/// Runs every engine's tests with `env`; returns the first non-zero pytest
/// status, or 0.
pub fn test(env: &[(String, String)]) -> Result<i32, String> {
    let root = cmd::workspace_root();
    let wheel = build_wheel(&root)?;
    let mut worst = 0;
    for engine in ENGINES {
        let venv = ensure_venv(&root, engine)?;
        let python = venv.join("bin/python");
        python::run(
            python::pip_install(&python)
                .args(["--no-deps", "--force-reinstall"])
                .arg(&wheel),
            &format!("pip install the hostpool wheel into the {engine} environment"),
        )?;
        // The UCX loopback setting is in `env`, from the NIXL environment.
        let mut pytest = python::pytest(&venv, &engine_dir(&root, engine), env);
        pytest.env("VLLM_CONFIGURE_LOGGING", "0");
        eprintln!("xtask: engines: pytest tests/engines/{engine}");
        let code = cmd::run_step(&mut pytest, &format!("pytest tests/engines/{engine}"))?;
        eprintln!("xtask: engines: pytest tests/engines/{engine} exited with status {code}");
        if code != 0 && worst == 0 {
            worst = code;
        }
    }
    Ok(worst)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_engine_has_its_two_requirement_files() {
        let root = cmd::workspace_root();
        for engine in ENGINES {
            for file in ["requirements.txt", "requirements-nodeps.txt"] {
                let path = engine_dir(&root, engine).join(file);
                let text = read(&path).unwrap();
                assert!(
                    text.lines()
                        .filter(|l| !l.trim_start().starts_with('#') && !l.trim().is_empty())
                        .all(|l| l.contains("==")),
                    "{} pins every package with ==",
                    path.display()
                );
            }
        }
    }
}
