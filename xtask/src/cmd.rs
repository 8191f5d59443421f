//! Running child processes.
//!
//! Long-running steps (`cargo test`, `cargo clippy`, ...) go through
//! [`run_step`]: the child gets its own process group, which receives any
//! SIGINT/SIGTERM/SIGHUP that xtask intercepts (see [`crate::signals`]), and
//! stdin is `/dev/null` (CI has no stdin; a background process group must not
//! read the terminal). Short helper tools (`mount`, `umount`) go through
//! [`run_tool`], which captures their output for error messages.

use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};

use crate::signals;

/// The workspace root (parent of the xtask crate).
pub fn workspace_root() -> PathBuf {
    let manifest_dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    manifest_dir.parent().unwrap_or(manifest_dir).to_path_buf()
}

/// A `cargo` command run from the workspace root, using the same cargo that
/// started xtask (`$CARGO`) when known.
pub fn cargo() -> Command {
    let program = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let mut command = Command::new(program);
    command.current_dir(workspace_root());
    command
}

/// Runs `command` (described as `what` in messages) to completion in its own
/// process group and returns its exit code (128 + signal if it was killed).
pub fn run_step(command: &mut Command, what: &str) -> Result<i32, String> {
    if let Some(sig) = signals::received() {
        return Err(format!(
            "not starting {what}: xtask was interrupted by {}",
            signals::name(sig)
        ));
    }
    command.stdin(Stdio::null()).process_group(0);
    let mut child = command
        .spawn()
        .map_err(|err| format!("could not start {what}: {err} (is it installed and on PATH?)"))?;
    let pgid = i32::try_from(child.id())
        .map_err(|_| format!("{what}: child pid {} out of range", child.id()))?;
    let registration = signals::ChildGroup::register(pgid);
    let status = child.wait();
    drop(registration);
    if signals::received().is_some() {
        // Interrupted: make sure nothing we started (e.g. a test binary whose
        // cargo already died) keeps running and holding huge pages.
        signals::signal_group(pgid, libc::SIGKILL);
    }
    let status = status.map_err(|err| format!("waiting for {what} failed: {err}"))?;
    Ok(exit_code(status))
}

/// Converts an exit status into a shell-style exit code.
pub fn exit_code(status: ExitStatus) -> i32 {
    match (status.code(), status.signal()) {
        (Some(code), _) => code,
        (None, Some(sig)) => signals::exit_code_for(sig),
        (None, None) => 1,
    }
}

/// Runs a short helper tool and fails with its stderr if it fails.
pub fn run_tool(program: &str, args: &[&str]) -> Result<(), String> {
    let shown = format!("{program} {}", args.join(" "));
    let output = Command::new(program)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .map_err(|err| format!("could not run `{shown}`: {err}"))?;
    if output.status.success() {
        return Ok(());
    }
    let stderr = String::from_utf8_lossy(&output.stderr);
    Err(format!(
        "`{shown}` failed ({}): {}",
        output.status,
        stderr.trim()
    ))
}
