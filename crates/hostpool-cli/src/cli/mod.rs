//! The `hostpool` command line, one module per command: `alloc`, `plan`,
//! `plugins`, `gc`, `doctor`, `bench`, `keep`; the pool flags they share in
//! `args`; and the hidden `serve-refusal`, the helper a failed shared-pool
//! creator leaves behind (`refuse`).
//!
//! Exit status: 0 success; 1 a runtime failure (including a plan whose
//! capacity checks fail); 2 a usage or configuration error. Errors are one
//! paragraph on stderr.

mod alloc;
mod args;
mod bench;
mod doctor;
mod gc;
mod keep;
mod output;
mod plan;
mod plugins;
mod progress;
mod refuse;

use std::io::Write;

use clap::{Parser, Subcommand};
use pool_core::Error;
use pool_core::interrupt::Cancel;

pub use alloc::AllocArgs;
pub use args::{PoolArgs, resolve_config};
pub use gc::GcArgs;
pub use plan::PlanArgs;
pub use plugins::PluginsArgs;

/// Build, prefault, pin and register large host-memory pools for GPU KV-cache offload.
#[derive(Debug, Parser)]
#[command(name = "hostpool", version, about, long_about = None)]
pub struct Cli {
    /// More logging on stderr (-v info, -vv debug); RUST_LOG overrides.
    #[arg(short, long, action = clap::ArgAction::Count, global = true)]
    pub verbose: u8,
    /// The command.
    #[command(subcommand)]
    pub command: Command,
}

/// The subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Build the pool, prefault it, print a report, tear it down (or hold it).
    Alloc(AllocArgs),
    /// Show everything `alloc` would do and why, with no side effects.
    Plan(PlanArgs),
    /// List the registered backings, pinners and registrars.
    Plugins(PluginsArgs),
    /// Remove pool files that no live process holds (left by crashed runs).
    Gc(GcArgs),
    /// Say whether this node can hold a pool, and why not, with remedies.
    Doctor(doctor::DoctorArgs),
    /// Measure memset, prefault per backing, page size, method and threads, and mlock.
    Bench(bench::BenchArgs),
    /// Build pools once and keep them for engines that restart: they lease
    /// the resident memory (`--keeper NAME`) instead of building it.
    Keep(keep::KeepArgs),
    /// A failed shared-pool creator's helper (see `refuse.rs`): started by
    /// the CLI itself, never by hand.
    #[command(hide = true)]
    ServeRefusal(refuse::ServeRefusalArgs),
}

/// Run the CLI on the process arguments; returns the exit status.
pub fn main() -> i32 {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => {
            // Help and version go to stdout with status 0; usage errors to
            // stderr with status 2.
            let _ = e.print();
            return e.exit_code();
        }
    };
    init_logging(cli.verbose);
    match run(cli) {
        Ok(code) => code,
        Err(e) => {
            report_error(&e);
            e.exit_code()
        }
    }
}

fn init_logging(verbose: u8) {
    let default = match verbose {
        0 => "warn",
        1 => "info",
        _ => "debug",
    };
    // A RUST_LOG that is not a filter is said, not silently replaced.
    let (filter, bad) = match std::env::var("RUST_LOG") {
        Ok(v) => match tracing_subscriber::EnvFilter::try_new(&v) {
            Ok(f) => (f, None),
            Err(e) => (tracing_subscriber::EnvFilter::new(default), Some((v, e))),
        },
        Err(_) => (tracing_subscriber::EnvFilter::new(default), None),
    };
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        // Colour only for a person at a terminal, not in a pod's log.
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .without_time()
        .with_target(false)
        .try_init();
    if let Some((v, e)) = bad {
        tracing::warn!(
            "RUST_LOG `{v}` is not a log filter ({e}); logging at `{default}` instead (give a \
             level such as `info`, or `hostpool=debug`)"
        );
    }
}

/// Print an error as one paragraph: the message, then its causes.
fn report_error(e: &Error) {
    say(format_args!("hostpool: error: {}", e.chain_message()));
}

fn run(cli: Cli) -> Result<i32, Error> {
    match cli.command {
        Command::Alloc(args) => alloc::run(args),
        Command::Plan(args) => plan::run(args),
        Command::Plugins(args) => plugins::run(args),
        Command::Gc(args) => gc::run(args),
        Command::Doctor(args) => doctor::run(args),
        Command::Bench(args) => bench::run(args),
        Command::Keep(args) => keep::run(args),
        Command::ServeRefusal(args) => refuse::run(args),
    }
}

/// Block SIGINT, SIGTERM, SIGHUP and SIGQUIT (call before any thread
/// exists, so that every thread inherits the mask) and, from a thread of its
/// own, cancel the returned token with each, after `also(signal)` (`keep`
/// counts them). The token is the command's: it goes to the build it runs
/// ([`pool_core::BuildOptions`]) and to its waits. `what` names
/// the command in the error.
///
/// Returns once that thread runs. A new thread maps its malloc arena and its
/// signal stack as it starts; each `mmap` takes the address space's lock for
/// writing, so one that lands during prefault waits for a worker's
/// `MADV_POPULATE_WRITE` step to end, and stalls the other workers behind it
/// for as long (issue 13: a quarter of the prefault phase on two threads).
pub(crate) fn forward_signals(what: &str, also: fn(i32)) -> Result<Cancel, Error> {
    let signals = crate::sys::TerminationSignals::block().map_err(|e| Error::Plugin {
        what: what.into(),
        message: "cannot block SIGINT/SIGTERM/SIGHUP/SIGQUIT".into(),
        source: Some(Box::new(e)),
    })?;
    let cancel = Cancel::new();
    let token = cancel.clone();
    let (started, running) = std::sync::mpsc::sync_channel(0);
    std::thread::spawn(move || {
        let _ = started.send(());
        while let Ok(sig) = signals.wait() {
            also(sig);
            token.cancel(sig);
        }
    });
    let _ = running.recv();
    Ok(cancel)
}

/// A report as pretty JSON. Serializing our own report cannot fail on bad
/// input, so a failure is a runtime error (exit 1), never a usage error.
pub(crate) fn to_json<T: serde::Serialize + ?Sized>(report: &T) -> Result<String, Error> {
    serde_json::to_string_pretty(report).map_err(json_error)
}

/// A report as a JSON value; see [`to_json`].
pub(crate) fn to_json_value<T: serde::Serialize + ?Sized>(
    report: &T,
) -> Result<serde_json::Value, Error> {
    serde_json::to_value(report).map_err(json_error)
}

fn json_error(e: serde_json::Error) -> Error {
    Error::Plugin {
        what: "the report".into(),
        message: "could not be written as JSON".into(),
        source: Some(Box::new(e)),
    }
}

/// One line on stderr. A stderr that is closed or full (`2>&1 | head`)
/// loses the line; `eprintln!` would panic there and exit 101.
pub(crate) fn say(text: std::fmt::Arguments<'_>) {
    let _ = writeln!(std::io::stderr().lock(), "{text}");
}

pub(crate) fn write_stdout(text: &str) -> Result<(), Error> {
    let mut out = std::io::stdout().lock();
    writeln!(out, "{text}")
        .and_then(|()| out.flush())
        .map_err(|e| Error::Plugin {
            what: "writing the report".into(),
            message: "stdout is closed or full".into(),
            source: Some(Box::new(e)),
        })
}
