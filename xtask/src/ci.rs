//! `cargo xtask ci`: every check CI runs, in order, stopping at the first
//! failure.

use std::process::Command;
use std::time::Instant;

use crate::{cmd, signals, test_suite};

/// One CI step.
enum Step {
    /// A cargo invocation with extra environment variables.
    Cargo {
        args: &'static [&'static str],
        env: Vec<(&'static str, String)>,
    },
    /// `cargo xtask test`, run in-process.
    Test,
}

/// The CI steps, in order, with their display names.
fn steps() -> Vec<(&'static str, Step)> {
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
        ("cargo xtask test", Step::Test),
        (
            "cargo bench --workspace --no-run",
            cargo(&["bench", "--workspace", "--no-run"], vec![]),
        ),
    ]
}

/// Runs all steps; returns 0 or the failing step's (non-zero) status.
pub fn run() -> Result<i32, String> {
    let steps = steps();
    let total = steps.len();
    for (index, (name, step)) in steps.into_iter().enumerate() {
        eprintln!("xtask ci: [{}/{total}] {name}", index + 1);
        let started = Instant::now();
        let code = run_one(name, step)?;
        let seconds = started.elapsed().as_secs();
        if let Some(sig) = signals::received() {
            eprintln!(
                "xtask ci: interrupted by {} during `{name}`",
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
                "xtask ci: FAILED: `{name}` exited with status {code} after {seconds}s; stopping"
            );
            return Ok(code);
        }
        eprintln!("xtask ci: ok: `{name}` ({seconds}s)");
    }
    eprintln!("xtask ci: all {total} steps passed");
    Ok(0)
}

/// Runs one step and returns its exit status.
fn run_one(name: &str, step: Step) -> Result<i32, String> {
    match step {
        Step::Test => test_suite::run(&[]),
        Step::Cargo { args, env } => {
            let mut command: Command = cmd::cargo();
            command.args(args).envs(env);
            cmd::run_step(&mut command, &format!("`{name}`"))
        }
    }
}
