//! `cargo xtask`: automation for the hostpool workspace.
//!
//! Subcommands (see [`USAGE`]):
//!
//! * `test [--no-lint] [ARGS...]`: everything CI checks, stopping at the
//!   first failure: first the system packages the tests need (see
//!   [`packages`]: installed as root with `apt-get`, else an error at once
//!   naming them), then fmt, clippy and doc (all `-D warnings`), then the test
//!   suite (reserve huge pages, mount hugetlbfs, run
//!   `cargo test --workspace --all-targets ARGS...` with the `HOSTPOOL_TEST_*`
//!   variables exported, and always restore the machine afterwards), then the
//!   bench build. `--no-lint` runs the packages and the test suite alone.
//!   `.ci/run` runs this, and installs nothing itself.
//! * `packages`: the system packages step alone.
//! * `hugepages up` / `hugepages down`: the same huge page setup as a
//!   standalone step for manual work; `down` restores what `up` recorded.
//! * `ci`: an alias of `test`, kept for compatibility.
//! * `help`: usage text.
//!
//! Restoring the machine is guaranteed by [`session::Session`], an RAII guard
//! whose `Drop` unmounts, removes the temporary dir and restores the sysfs
//! counters, together with [`signals`], which keeps SIGINT/SIGTERM/SIGHUP from
//! killing xtask (they are forwarded to the running child instead) so that the
//! guard always gets to run.
//!
//! Self-test hook (not part of the public interface): when `XTASK_TEST_CMD`
//! is set, `cargo xtask test` runs only the test suite step, with
//! `sh -c "$XTASK_TEST_CMD" xtask-test ARGS...` instead of `cargo test`, so
//! the setup/restore logic can be exercised with commands such as `false` or
//! `sleep 60`.
//!
//! Only [`sys`] may use `unsafe` (it allows what this crate denies).

#![deny(unsafe_code)]

mod cmd;
mod engines;
mod gpu_check;
mod hugepages;
mod mounts;
mod packages;
mod python;
mod session;
mod signals;
mod sys;
mod test_suite;
mod wheel;

use std::process::ExitCode;

/// Usage text printed by `cargo xtask help` and for unknown commands.
const USAGE: &str = "\
usage: cargo xtask <command>

commands:
  test [--no-lint] [CARGO-TEST-ARGS...] [-- TEST-BINARY-ARGS...]
        Everything CI checks (`.ci/run` runs this), in order, stopping at
        the first failure:
          0. the system packages the tests need (the list is in
             xtask/src/packages.rs): one line when all are present; missing
             ones are installed as root with apt-get (apt-get update,
             apt-get install -y), else it stops at once, before any build,
             naming them and the `sudo apt-get install -y ...` to run
          1. cargo fmt --all --check
          2. cargo clippy --workspace --all-targets -- -D warnings
          3. RUSTDOCFLAGS=\"-D warnings\" cargo doc --workspace --no-deps
          4. cargo test --workspace --doc (the doctests)
          5. the test suite: reserve huge pages (2 MiB: >= 1024, 1 GiB: >= 2
             where the kernel allows), mount hugetlbfs under
             /tmp/hostpool-xtask-<pid>, run
             `cargo test --workspace --all-targets ARGS...` with
             HOSTPOOL_TEST_* exported, then restore everything (also on
             failure or Ctrl-C). Needs root for the huge page part; without
             it the tests run with huge page tests skipped. Then the
             Python tests and the engine tests (tests/engines: each engine
             in its cached environments, one per envs/<name>.txt if the
             folder has envs/, newest first; the older ones with
             -m \"not newest_only\"), in the same huge page session.
          6. cargo bench --workspace --no-run
          7. the release binary with a failpoint armed, which it must ignore
          8. cargo xtask wheel --check
        --no-lint  run steps 0 and 5 alone (no fmt, clippy, doc, doctests or
                   bench build).
  packages
        Step 0 of `test` alone: check the system packages the tests need
        and, as root with apt-get, install the missing ones.
  hugepages up
        Do the same huge page setup for manual work and keep it; prints the
        environment to use (eval \"$(cargo xtask hugepages up)\").
        What to restore is recorded in /tmp/hostpool-xtask-state.
  hugepages down
        Undo `hugepages up` from /tmp/hostpool-xtask-state.
  ci [ARGS...]
        The same as `test` (an alias, kept for compatibility).
  gpu-check
        Build hostpool and xtask in release and print the command to run on
        a GPU node; there, `xtask gpu-check --run --hostpool PATH --out FILE`
        measures prefault, cuMemHostRegister and copies for 16 GiB of 4 KiB,
        2 MiB and 1 GiB pages and writes the results as Markdown.
  wheel [--check]
        Build the release wheel of the Python package (one abi3 wheel,
        CPython 3.11+, manylinux_2_28 through maturin --zig, checked as
        auditwheel checks) and its sdist into target/wheels; print the
        wheel's size and contents. The wheel carries the hostpool CLI (a
        script on the PATH; python -m hostpool runs it). maturin and zig
        come from a cached environment with pinned versions. --check then
        installs it into a fresh environment without cargo or rustc on the
        PATH, builds a pool from Python and runs the CLI from it.
  help  Show this text.
";

/// Exit status for usage errors (and `help`).
const USAGE_EXIT: i32 = 2;

fn main() -> ExitCode {
    // Must happen before any other thread exists, so that every thread
    // inherits the blocked signal mask.
    if let Err(err) = signals::install() {
        eprintln!("xtask: error: {err}");
        return ExitCode::FAILURE;
    }
    let args: Vec<String> = std::env::args().skip(1).collect();
    let code = match dispatch(&args) {
        Ok(code) => code,
        Err(err) => {
            eprintln!("xtask: error: {err}");
            signals::received().map_or(1, signals::exit_code_for)
        }
    };
    ExitCode::from(u8::try_from(code).unwrap_or(1))
}

/// Runs the subcommand named by `args[0]` and returns the exit status.
fn dispatch(args: &[String]) -> Result<i32, String> {
    let (command, rest) = match args.split_first() {
        Some((command, rest)) => (command.as_str(), rest),
        None => return Ok(usage(None)),
    };
    match command {
        "test" | "ci" => test_suite::run(rest),
        "gpu-check" => gpu_check::run(rest),
        "wheel" => wheel::run_command(rest),
        "hugepages" => hugepages_command(rest),
        "packages" if rest.is_empty() => packages::ensure().map(|()| 0),
        "help" | "-h" | "--help" => Ok(usage(None)),
        _ => Ok(usage(Some(&args.join(" ")))),
    }
}

/// `cargo xtask hugepages up|down`.
fn hugepages_command(args: &[String]) -> Result<i32, String> {
    match args {
        [action] if action == "up" => session::hugepages_up(),
        [action] if action == "down" => session::hugepages_down(),
        _ => Ok(usage(Some(&format!("hugepages {}", args.join(" "))))),
    }
}

/// Prints the usage text (after a complaint about `bad`, if any).
fn usage(bad: Option<&str>) -> i32 {
    if let Some(bad) = bad {
        eprintln!("xtask: unknown command `{}`\n", bad.trim());
    }
    eprint!("{USAGE}");
    USAGE_EXIT
}
