//! `cargo xtask test` (and its alias `cargo xtask ci`): every check CI runs,
//! cheap static checks first, stopping at the first failure. Before any of
//! them, the system packages the tests need ([`packages::ensure`]): present,
//! or installed as root with `apt-get`, or an error at once that says what
//! to install.
//!
//! 1. `cargo fmt --all --check`
//! 2. `cargo clippy --workspace --all-targets -- -D warnings`
//! 3. `cargo doc --workspace --no-deps` with `-D warnings` added to
//!    `RUSTDOCFLAGS`
//! 4. `cargo test --workspace --doc`: the doctests, which `--all-targets`
//!    leaves out (the `compile_fail` proof that a `Region` cannot outlive
//!    its pool among them)
//! 5. the test suite: sets up a [`Session`] (or explains why it cannot), runs
//!    `cargo test --workspace --all-targets ARGS...` with the session's
//!    variables plus `RUST_BACKTRACE=1`, and restores
//! 6. `cargo bench --workspace --no-run`
//! 7. the release binary: the README's first command
//!    (`cargo run --release -p hostpool-cli -- alloc`), with a failpoint
//!    armed that would fail it in a test build, must succeed: test hooks are
//!    not in what operators run ([`release`])
//! 8. the release wheel (`cargo xtask wheel --check`): abi3,
//!    `manylinux_2_28`, installed into a fresh environment without cargo or
//!    rustc on the PATH, imported and used to build a pool, and its CLI run
//!
//! `--no-lint` (before any `--`) runs step 5 alone (after the packages),
//! and so does the `XTASK_TEST_CMD` self-test hook (without them). Returns 0 or the failing step's
//! (non-zero) exit status.

use std::path::Path;
use std::process::Command;
use std::time::Instant;

use crate::cmd;
use crate::engines;
use crate::packages;
use crate::python;
use crate::session::{self, Session, Setup};
use crate::signals;

/// Self-test hook: a shell command that replaces `cargo test`.
const TEST_CMD_VAR: &str = "XTASK_TEST_CMD";

/// Skips the static checks and the bench build: only the test suite runs.
const NO_LINT: &str = "--no-lint";

/// One step of `cargo xtask test`.
enum Step {
    /// A cargo invocation with extra environment variables.
    Cargo {
        args: &'static [&'static str],
        env: Vec<(&'static str, String)>,
    },
    /// The test suite with huge pages ([`suite`]).
    Suite,
    /// The release binary ignores the test hooks ([`release`]).
    Release,
    /// The release wheel builds, installs without Rust and works
    /// ([`crate::wheel`]).
    Wheel,
}

/// The failpoint the release check arms: in a test build it makes the
/// anonymous pool's `mmap` fail.
const RELEASE_FAILPOINT: &str = "anon-mmap=ENOMEM";

/// The steps, in order, with their display names; only the suite when
/// `lint` is false.
fn steps(lint: bool) -> Vec<(&'static str, Step)> {
    const SUITE: &str = "the test suite with huge pages";
    if !lint {
        return vec![(SUITE, Step::Suite)];
    }
    let rustdocflags = match std::env::var("RUSTDOCFLAGS") {
        Ok(flags) if !flags.trim().is_empty() => format!("{flags} -D warnings"),
        _ => "-D warnings".to_string(),
    };
    let cargo = |args, env| Step::Cargo { args, env };
    vec![
        (
            "cargo fmt --all --check",
            cargo(&["fmt", "--all", "--check"], vec![]),
        ),
        (
            "cargo clippy --workspace --all-targets -- -D warnings",
            cargo(
                &[
                    "clippy",
                    "--workspace",
                    "--all-targets",
                    "--",
                    "-D",
                    "warnings",
                ],
                vec![],
            ),
        ),
        (
            "RUSTDOCFLAGS=\"-D warnings\" cargo doc --workspace --no-deps",
            cargo(
                &["doc", "--workspace", "--no-deps"],
                vec![("RUSTDOCFLAGS", rustdocflags)],
            ),
        ),
        (
            "cargo test --workspace --doc",
            cargo(&["test", "--workspace", "--doc"], vec![]),
        ),
        (SUITE, Step::Suite),
        (
            "cargo bench --workspace --no-run",
            cargo(&["bench", "--workspace", "--no-run"], vec![]),
        ),
        (
            "cargo run --release -p hostpool-cli -- alloc, with a failpoint armed",
            Step::Release,
        ),
        (
            "cargo xtask wheel --check: the release wheel, installed without Rust",
            Step::Wheel,
        ),
    ]
}

/// Splits off [`NO_LINT`] (wherever it is before the first `--`): whether
/// to lint, and the arguments for `cargo test`.
fn parse(args: &[String]) -> (bool, Vec<String>) {
    let split = args.iter().position(|a| a == "--").unwrap_or(args.len());
    let (ours, test_binary) = args.split_at(split);
    let lint = !ours.iter().any(|a| a == NO_LINT);
    let cargo_test = ours
        .iter()
        .filter(|a| *a != NO_LINT)
        .chain(test_binary)
        .cloned()
        .collect();
    (lint, cargo_test)
}

/// Runs `cargo xtask test ARGS...`; returns 0 or the failing step's
/// (non-zero) status.
pub fn run(args: &[String]) -> Result<i32, String> {
    let (lint, cargo_test_args) = parse(args);
    // The machine first, so a missing package stops it before any build.
    if std::env::var_os(TEST_CMD_VAR).is_none() {
        packages::ensure()?;
    }
    let steps = steps(lint && std::env::var_os(TEST_CMD_VAR).is_none());
    let total = steps.len();
    for (index, (name, step)) in steps.into_iter().enumerate() {
        eprintln!("xtask test: [{}/{total}] {name}", index + 1);
        let started = Instant::now();
        let code = run_one(name, step, &cargo_test_args)?;
        let seconds = started.elapsed().as_secs();
        if let Some(sig) = signals::received() {
            eprintln!(
                "xtask test: interrupted by {} during `{name}`",
                signals::name(sig)
            );
            return Ok(if code == 0 {
                signals::exit_code_for(sig)
            } else {
                code
            });
        }
        if code != 0 {
            eprintln!(
                "xtask test: FAILED: `{name}` exited with status {code} after {seconds}s; stopping"
            );
            return Ok(code);
        }
        eprintln!("xtask test: ok: `{name}` ({seconds}s)");
    }
    eprintln!("xtask test: all {total} steps passed");
    Ok(0)
}

/// Runs one step and returns its exit status.
fn run_one(name: &str, step: Step, cargo_test_args: &[String]) -> Result<i32, String> {
    match step {
        Step::Suite => suite(cargo_test_args),
        Step::Release => release(),
        Step::Wheel => crate::wheel::run_command(&["--check".to_string()]),
        Step::Cargo { args, env } => {
            let mut command: Command = cmd::cargo();
            command.args(args).envs(env);
            cmd::run_step(&mut command, &format!("`{name}`"))
        }
    }
}

/// Runs the test suite with huge pages set up (see the module docs);
/// returns the test command's exit status.
fn suite(args: &[String]) -> Result<i32, String> {
    if Path::new(session::STATE_FILE).exists() {
        eprintln!(
            "xtask: note: `cargo xtask hugepages up` is active ({}); this run restores to that state",
            session::STATE_FILE
        );
    }
    let session = match Session::start(None)? {
        Setup::Ready(session) => {
            session.print_header();
            Some(session)
        }
        Setup::Unavailable(reason) => {
            print_unavailable(&reason);
            None
        }
    };
    if let Some(sig) = signals::received() {
        return Ok(signals::exit_code_for(sig));
    }
    let (mut command, what) = test_command(args);
    for name in session::ENV_VARS {
        command.env_remove(name);
    }
    if let Some(session) = &session {
        command.envs(session.env());
    }
    // The Python environment (with NIXL's wheel) before the Rust tests,
    // whose NIXL tests load its library.
    let mut env = session.as_ref().map(Session::env).unwrap_or_default();
    if std::env::var_os(TEST_CMD_VAR).is_none() {
        match python::nixl_env() {
            Ok(vars) => {
                command.envs(vars.iter().map(|(k, v)| (k, v)));
                env.extend(vars);
            }
            Err(e) => {
                eprintln!("xtask: the Python environment could not be made: {e}");
                if let Some(session) = session {
                    session.finish();
                }
                return Ok(1);
            }
        }
    }
    command.env("RUST_BACKTRACE", "1");
    eprintln!("xtask: running {what}");
    let code = cmd::run_step(&mut command, &what);
    // The Python tests, in the same huge page session (not for the
    // self-test hook, which replaces the whole test command).
    let code = match code {
        Ok(0) if std::env::var_os(TEST_CMD_VAR).is_none() && signals::received().is_none() => {
            eprintln!("xtask: {what} exited with status 0");
            match python::test(&env) {
                Ok(0) if signals::received().is_none() => {
                    eprintln!("xtask: pytest tests/python exited with status 0");
                    // The engines' own code, each in its environment: a run
                    // of its own, so the default pytest run stays quick.
                    match engines::test(&env) {
                        Ok(code) => Ok(code),
                        Err(e) => {
                            eprintln!("xtask: engine tests could not run: {e}");
                            Ok(1)
                        }
                    }
                }
                Ok(code) => {
                    eprintln!("xtask: pytest tests/python exited with status {code}");
                    Ok(code)
                }
                Err(e) => {
                    eprintln!("xtask: python tests could not run: {e}");
                    Ok(1)
                }
            }
        }
        other => other,
    };
    if let Some(session) = session {
        session.finish();
    }
    let code = code?;
    eprintln!("xtask: the test suite exited with status {code}");
    Ok(code)
}

/// Runs the README's first command with [`RELEASE_FAILPOINT`] armed: the
/// release build must ignore it (exit 0), and the variable's name must not
/// be in the binary at all. Returns 0 or 1.
fn release() -> Result<i32, String> {
    let mut run = cmd::cargo();
    run.args(["run", "--release", "--quiet", "-p", "hostpool-cli", "--"])
        .args(["alloc", "--size", "64MiB", "--json"])
        .env("HOSTPOOL_TEST_FAILPOINTS", RELEASE_FAILPOINT)
        .stdout(std::process::Stdio::null());
    let code = cmd::run_step(&mut run, "cargo run --release -p hostpool-cli -- alloc")?;
    if code != 0 {
        eprintln!(
            "xtask: the release binary exited with {code} with HOSTPOOL_TEST_FAILPOINTS={RELEASE_FAILPOINT}: \
             a test hook is compiled into it (pool-core's `failpoints` feature must stay off)"
        );
        return Ok(1);
    }
    let binary = cmd::workspace_root().join("target/release/hostpool");
    let bytes =
        std::fs::read(&binary).map_err(|e| format!("cannot read {}: {e}", binary.display()))?;
    for needle in [
        "HOSTPOOL_TEST_FAILPOINTS",
        "HOSTPOOL_FAILPOINT_STALL_PREFAULT_MS",
        "HOSTPOOL_FAILPOINT_ZERO_STEP_MS",
        "HOSTPOOL_TEST_SYSFS_ROOT",
    ] {
        if bytes.windows(needle.len()).any(|w| w == needle.as_bytes()) {
            eprintln!(
                "xtask: {} names {needle}: a test hook is compiled in",
                binary.display()
            );
            return Ok(1);
        }
    }
    eprintln!(
        "xtask: the release binary ignored the failpoints and names none of the test hooks' \
         variables"
    );
    Ok(0)
}

/// The command that runs the tests, and how to describe it.
fn test_command(args: &[String]) -> (Command, String) {
    if let Some(script) = std::env::var_os(TEST_CMD_VAR) {
        let mut command = Command::new("sh");
        command
            .current_dir(cmd::workspace_root())
            .arg("-c")
            .arg(&script)
            .arg("xtask-test")
            .args(args);
        let what = format!(
            "`{}` ({TEST_CMD_VAR} self-test override)",
            script.to_string_lossy()
        );
        return (command, what);
    }
    let mut command = cmd::cargo();
    command
        .args(["test", "--workspace", "--all-targets"])
        .args(args);
    let mut shown = vec!["cargo test --workspace --all-targets"];
    shown.extend(args.iter().map(String::as_str));
    (command, format!("`{}`", shown.join(" ")))
}

/// Explains that the tests run without huge pages.
fn print_unavailable(reason: &str) {
    eprintln!(
        "xtask: ---- huge page setup ----\n\
         xtask:   !! huge pages could NOT be reserved: {reason}\n\
         xtask:   !! running the tests WITHOUT HOSTPOOL_TEST_* and {}: \
         tests that need huge pages will be skipped",
        session::REQUIRE_VAR
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    fn strings(args: &[&str]) -> Vec<String> {
        args.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn no_lint_is_taken_before_the_separator_only() {
        assert_eq!(parse(&[]), (true, vec![]));
        assert_eq!(
            parse(&strings(&[
                "-p",
                "pool-core",
                "--no-lint",
                "--",
                "--no-lint"
            ])),
            (false, strings(&["-p", "pool-core", "--", "--no-lint"]))
        );
        assert_eq!(
            parse(&strings(&["--", "--no-lint"])),
            (true, strings(&["--", "--no-lint"]))
        );
    }

    #[test]
    fn the_static_checks_come_first_and_no_lint_runs_the_suite_alone() {
        let names: Vec<&str> = steps(true).iter().map(|(name, _)| *name).collect();
        assert_eq!(names.len(), 8);
        assert!(names[0].starts_with("cargo fmt"));
        assert!(names[1].starts_with("cargo clippy"));
        assert!(names[2].contains("cargo doc"));
        assert_eq!(names[3], "cargo test --workspace --doc");
        assert!(matches!(steps(true)[4].1, Step::Suite));
        assert!(names[5].starts_with("cargo bench"));
        assert!(matches!(steps(true)[6].1, Step::Release));
        assert!(matches!(steps(true)[7].1, Step::Wheel));
        let only = steps(false);
        assert_eq!(only.len(), 1);
        assert!(matches!(only[0].1, Step::Suite));
    }
}
