//! `cargo xtask test`: the whole test suite with huge pages set up.
//!
//! Sets up a [`Session`] (or explains why it cannot), runs
//! `cargo test --workspace --all-targets ARGS...` with the session's
//! variables plus `RUST_BACKTRACE=1`, restores, and returns the test
//! command's exit status.

use std::path::Path;
use std::process::Command;

use crate::cmd;
use crate::session::{self, Session, Setup};
use crate::signals;

/// Self-test hook: a shell command that replaces `cargo test`.
const TEST_CMD_VAR: &str = "XTASK_TEST_CMD";

/// Runs the test suite; returns its exit status.
pub fn run(args: &[String]) -> Result<i32, String> {
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
    command.env("RUST_BACKTRACE", "1");
    eprintln!("xtask: running {what}");
    let code = cmd::run_step(&mut command, &what);
    if let Some(session) = session {
        session.finish();
    }
    let code = code?;
    eprintln!("xtask: {what} exited with status {code}");
    Ok(code)
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
