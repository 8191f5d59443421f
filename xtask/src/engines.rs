//! The engines' half of the test suite: hostpool against the serving
//! engines' own released code, each engine in virtual environments of its
//! own with the torch it pins.
//!
//! Each engine has a folder `tests/engines/<engine>/` with
//! - `requirements.txt`: installed normally (torch and numpy, with their
//!   dependencies), the base layer of every environment of the folder;
//! - its environments' `--no-deps` layer (the engine's wheel and only the
//!   modules its imported code needs: the engines' declared dependencies are
//!   many GB of GPU stacks that cannot run here), either
//!   - `envs/<name>.txt`, one file per environment, called `<engine>-<name>`
//!     (`tests/engines/vllm/envs/0.34.0.txt` is `vllm-0.34.0`): several
//!     releases of the engine, each pinned in full; or
//!   - `requirements-nodeps.txt`, the one environment `<engine>`, when the
//!     folder has no `envs/`;
//! - the pytest files, run in each of its environments.
//!
//! The newest environment of a folder is the one whose name is the highest
//! version ([`version_order`]: 0.34.0 above 0.33.0, 0.10 above 0.9). pytest
//! runs in every environment, newest first, with `HOSTPOOL_ENGINE_ENV` set to
//! the environment's name; every one but the newest adds
//! `-m "not newest_only"`, so the tests marked `newest_only` (slow fault
//! tests) run on the newest release alone.
//!
//! The environments are cached outside the clone,
//! `${XDG_CACHE_HOME:-~/.cache}/hostpool/engine-<env name>-<hash of the base
//! and nodeps files>`, so a new pin makes a new one. hostpool itself goes in
//! as a wheel built once per run with the test environment's maturin, and
//! installed into every environment.

use std::cmp::Ordering;
use std::path::{Path, PathBuf};
use std::process::Command;

use crate::cmd;
use crate::python;

/// The engines, by folder under `tests/engines`.
pub const ENGINES: &[&str] = &["vllm", "sglang"];

/// Where the hostpool wheel is built, under the workspace root.
const WHEEL_DIR: &str = "target/engine-wheel";

/// The folder of an engine's environments, one `<name>.txt` each.
const ENVS_DIR: &str = "envs";

/// The `--no-deps` layer of the one environment of a folder without
/// [`ENVS_DIR`].
const NODEPS: &str = "requirements-nodeps.txt";

/// The pytest marker of the tests that run in the newest environment alone.
const NEWEST_ONLY: &str = "newest_only";

/// The variable that names the environment to the tests.
const ENV_VAR: &str = "HOSTPOOL_ENGINE_ENV";

fn engine_dir(root: &Path, engine: &str) -> PathBuf {
    root.join("tests/engines").join(engine)
}

fn read(path: &Path) -> Result<String, String> {
    std::fs::read_to_string(path).map_err(|e| format!("cannot read {}: {e}", path.display()))
}

/// One environment of an engine's folder.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Env {
    /// `<engine>-<name>` for `envs/<name>.txt`, else `<engine>`.
    name: String,
    /// Its `--no-deps` layer.
    nodeps: PathBuf,
}

/// The environments of `engine`, newest first (see the module docs).
fn envs(root: &Path, engine: &str) -> Result<Vec<Env>, String> {
    let dir = engine_dir(root, engine);
    let envs_dir = dir.join(ENVS_DIR);
    if !envs_dir.is_dir() {
        return Ok(vec![Env {
            name: (*engine).to_string(),
            nodeps: dir.join(NODEPS),
        }]);
    }
    if dir.join(NODEPS).exists() {
        return Err(format!(
            "tests/engines/{engine} has both {ENVS_DIR}/ and {NODEPS}: \
             with {ENVS_DIR}/ each environment is a file there, so remove {NODEPS}"
        ));
    }
    let mut names: Vec<String> = std::fs::read_dir(&envs_dir)
        .map_err(|e| format!("cannot read {}: {e}", envs_dir.display()))?
        .flatten()
        .filter_map(|entry| {
            let file = entry.file_name().to_string_lossy().into_owned();
            file.strip_suffix(".txt").map(str::to_string)
        })
        .collect();
    if names.is_empty() {
        return Err(format!(
            "tests/engines/{engine}/{ENVS_DIR}/ has no environment (<name>.txt)"
        ));
    }
    newest_first(&mut names);
    Ok(names
        .into_iter()
        .map(|name| Env {
            name: format!("{engine}-{name}"),
            nodeps: envs_dir.join(format!("{name}.txt")),
        })
        .collect())
}

/// Compares two environment names as versions: dot-separated parts, each
/// compared as a number when both are numbers (so 0.10 > 0.9), else as
/// text; a name that runs out of parts first is the lower (0.34 < 0.34.1).
fn version_order(a: &str, b: &str) -> Ordering {
    let mut left = a.split('.');
    let mut right = b.split('.');
    loop {
        match (left.next(), right.next()) {
            (None, None) => return Ordering::Equal,
            (None, Some(_)) => return Ordering::Less,
            (Some(_), None) => return Ordering::Greater,
            (Some(x), Some(y)) => {
                let order = match (x.parse::<u64>(), y.parse::<u64>()) {
                    (Ok(x), Ok(y)) => x.cmp(&y),
                    _ => x.cmp(y),
                };
                if order != Ordering::Equal {
                    return order;
                }
            }
        }
    }
}

/// Sorts environment names newest (highest version) first.
fn newest_first(names: &mut [String]) {
    names.sort_by(|a, b| version_order(b, a));
}

/// The `-m` filter of the `index`th environment in newest-first order: none
/// for the newest, `not newest_only` for the others.
fn marker_filter(index: usize) -> Option<String> {
    (index > 0).then(|| format!("not {NEWEST_ONLY}"))
}

/// The environment `env` of `engine`, created and filled when missing.
fn ensure_venv(root: &Path, engine: &str, env: &Env) -> Result<PathBuf, String> {
    let base = engine_dir(root, engine).join("requirements.txt");
    let nodeps = &env.nodeps;
    let pins = format!("{}\n--no-deps\n{}", read(&base)?, read(nodeps)?);
    let venv = python::cache_dir().join(format!("engine-{}-{}", env.name, python::hash(&pins)));
    let shown = nodeps
        .strip_prefix(root)
        .unwrap_or(nodeps)
        .display()
        .to_string();
    python::cached_venv(
        &venv,
        &pins,
        &format!(
            "the {} engine tests (torch and the engine: several GB, minutes, once)",
            env.name
        ),
        |python| {
            python::run(
                python::pip_install(python).arg("-r").arg(&base),
                &format!("pip install -r tests/engines/{engine}/requirements.txt"),
            )?;
            python::run(
                python::pip_install(python)
                    .arg("--no-deps")
                    .arg("-r")
                    .arg(nodeps),
                &format!("pip install --no-deps -r {shown}"),
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

/// Runs every engine's tests with `env`, in each of its environments
/// (newest first, see the module docs); returns the first non-zero pytest
/// status, or 0.
pub fn test(env: &[(String, String)]) -> Result<i32, String> {
    let root = cmd::workspace_root();
    // Every folder's layout before the long steps, so a wrong one fails at once.
    let plan = ENGINES
        .iter()
        .map(|engine| envs(&root, engine).map(|envs| (*engine, envs)))
        .collect::<Result<Vec<_>, String>>()?;
    let shown: Vec<String> = plan
        .iter()
        .flat_map(|(_, envs)| {
            envs.iter()
                .enumerate()
                .map(|(index, env)| match marker_filter(index) {
                    Some(filter) => format!("{} (-m \"{filter}\")", env.name),
                    None => format!("{} (every test)", env.name),
                })
        })
        .collect();
    eprintln!(
        "xtask: engines: environments, each folder's newest first: {}",
        shown.join(", ")
    );
    let wheel = build_wheel(&root)?;
    let mut worst = 0;
    let mut results = Vec::new();
    for (engine, envs) in &plan {
        let count = envs.len();
        for (index, engine_env) in envs.iter().enumerate() {
            let name = &engine_env.name;
            let venv = ensure_venv(&root, engine, engine_env)?;
            let python = venv.join("bin/python");
            python::run(
                python::pip_install(&python)
                    .args(["--no-deps", "--force-reinstall"])
                    .arg(&wheel),
                &format!("pip install the hostpool wheel into the {name} environment"),
            )?;
            // The UCX loopback setting is in `env`, from the NIXL environment.
            let mut pytest = python::pytest(&venv, &engine_dir(&root, engine), env);
            pytest.env("VLLM_CONFIGURE_LOGGING", "0").env(ENV_VAR, name);
            let filter = marker_filter(index);
            let what = match &filter {
                Some(filter) => {
                    pytest.args(["-m", filter]);
                    format!("pytest tests/engines/{engine} -m \"{filter}\" in {name}")
                }
                None => format!("pytest tests/engines/{engine} in {name}"),
            };
            let role = match (count, &filter) {
                (1, _) => "its only environment: every test".to_string(),
                (_, None) => format!("the newest of {count} environments: every test"),
                (_, Some(_)) => format!(
                    "{} of {count} environments: the {NEWEST_ONLY} tests run in {} alone",
                    index + 1,
                    envs[0].name
                ),
            };
            eprintln!("xtask: engines: {what} ({ENV_VAR}={name}; {role})");
            let code = cmd::run_step(&mut pytest, &what)?;
            eprintln!("xtask: engines: {what} exited with status {code}");
            results.push(format!("{name}: {code}"));
            if code != 0 && worst == 0 {
                worst = code;
            }
        }
    }
    eprintln!("xtask: engines: pytest statuses: {}", results.join(", "));
    Ok(worst)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The `name==version` lines of a requirements file (comments and
    /// blank lines left out).
    fn pins(text: &str) -> Vec<&str> {
        text.lines()
            .map(|l| l.split('#').next().unwrap_or("").trim())
            .filter(|l| !l.is_empty())
            .collect()
    }

    /// `name` as pip compares it: lower case, `_` and `.` as `-`.
    fn normalized(name: &str) -> String {
        name.trim().to_lowercase().replace(['_', '.'], "-")
    }

    fn assert_pinned(path: &Path) -> String {
        let text = read(path).unwrap();
        for line in pins(&text) {
            assert!(
                line.contains("=="),
                "{} pins every package with ==: {line}",
                path.display()
            );
        }
        text
    }

    #[test]
    fn every_engine_has_its_two_requirement_files() {
        let root = cmd::workspace_root();
        for engine in ENGINES {
            assert_pinned(&engine_dir(&root, engine).join("requirements.txt"));
            let envs = envs(&root, engine).unwrap();
            assert!(!envs.is_empty(), "{engine} has an environment");
            let in_envs_dir = engine_dir(&root, engine).join(ENVS_DIR).is_dir();
            for env in &envs {
                let text = assert_pinned(&env.nodeps);
                if !in_envs_dir {
                    assert_eq!(env.name, *engine);
                    continue;
                }
                // envs/<version>.txt pins exactly one <engine>==<version>.
                let version = env.name.strip_prefix(&format!("{engine}-")).unwrap();
                let engine_pins: Vec<&str> = pins(&text)
                    .into_iter()
                    .filter(|l| normalized(l.split("==").next().unwrap()) == *engine)
                    .collect();
                assert_eq!(
                    engine_pins,
                    vec![format!("{engine}=={version}")],
                    "{} pins exactly one {engine}=={version}",
                    env.nodeps.display()
                );
            }
        }
        // vLLM runs in two releases, newest first.
        let vllm: Vec<String> = envs(&root, "vllm")
            .unwrap()
            .into_iter()
            .map(|e| e.name)
            .collect();
        assert_eq!(vllm, ["vllm-0.34.0", "vllm-0.33.0"]);
        assert!(!engine_dir(&root, "vllm").join(NODEPS).exists());
    }

    #[test]
    fn versions_compare_numerically() {
        assert_eq!(version_order("0.34.0", "0.33.0"), Ordering::Greater);
        assert_eq!(version_order("0.10.0", "0.9.1"), Ordering::Greater);
        assert_eq!(version_order("0.34", "0.34.1"), Ordering::Less);
        assert_eq!(version_order("1.0.0", "1.0.0"), Ordering::Equal);
        let mut names: Vec<String> = ["0.9.1", "0.33.0", "0.10.0", "0.34.0"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        newest_first(&mut names);
        assert_eq!(names, ["0.34.0", "0.33.0", "0.10.0", "0.9.1"]);
    }

    #[test]
    fn only_the_newest_environment_runs_the_newest_only_tests() {
        assert_eq!(marker_filter(0), None);
        assert_eq!(marker_filter(1).as_deref(), Some("not newest_only"));
        assert_eq!(marker_filter(2).as_deref(), Some("not newest_only"));
    }

    #[test]
    fn a_folder_without_envs_has_its_one_environment() {
        let root = cmd::workspace_root();
        let sglang = envs(&root, "sglang").unwrap();
        assert_eq!(sglang.len(), 1);
        assert_eq!(sglang[0].name, "sglang");
        assert!(sglang[0].nodeps.ends_with("sglang/requirements-nodeps.txt"));
    }
}
