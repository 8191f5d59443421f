//! The failed creator's helper: `hostpool serve-refusal`, hidden.
//!
//! A creator of a shared pool that fails before every rank was told keeps
//! answering on the pool's socket with the cause ([`Refusal`]). A library
//! embedder does that from a thread; the CLI exits on the error at once
//! (exit status 1, as before), so its build's refusal policy
//! ([`hand_over`]) hands the socket to a helper process instead: the
//! `hostpool` binary itself (`/proc/self/exe`)
//! run as `hostpool serve-refusal`, with the socket inherited and what it
//! says as arguments. So a rank started after the creator exited still
//! fails within a second naming the creator's cause (its errno) and pid,
//! for as long as the attach timeout lasts, instead of becoming a creator
//! itself and waiting out its attach timeout with the wrong cause.
//!
//! The helper:
//! - has its standard input, output and error on `/dev/null`: nobody that
//!   reads the CLI's output (a pipe, a test, a pod's log) waits for it, and
//!   it writes nothing;
//! - exits once the ranks that were not told have heard the cause, or at
//!   the attach deadline, whichever comes first: it never outlives the
//!   deadline;
//! - stays in the CLI's process group and session, as any child the
//!   operator started: a Ctrl-C at the terminal, or a job runner's signal
//!   to the group, ends it with the ranks. It handles no signal, and
//!   unblocks those `alloc` blocked (a child inherits the mask), so SIGTERM
//!   ends it at once, with nothing to clean up: the socket goes with it,
//!   and a rank that comes later becomes a creator as if the helper never
//!   was.
//!
//! A creator stopped by a signal (SIGINT, SIGTERM, SIGHUP, SIGQUIT) starts
//! no helper: whoever stopped it stops the run, and the ranks of a restart
//! must not hear this run's cause. It answers the ranks already waiting and
//! exits, as does a creator that every rank has heard.
//!
//! When the helper cannot start (no `/proc/self/exe`, a binary replaced
//! meanwhile, no process left), the CLI warns and answers the ranks that
//! are already waiting at once, as it did before there was a helper.

use std::os::fd::{AsRawFd, OwnedFd};
use std::process::{Command, Stdio};
use std::time::Duration;

use clap::Args;
use hostpool::hostpool_handoff::{Refusal, RefusalTerms};
use pool_core::Error;

/// The helper's subcommand, as [`spawn_helper`] runs it.
const SUBCOMMAND: &str = "serve-refusal";

/// `hostpool serve-refusal`: serve a failed creator's refusal; only the
/// CLI starts it.
#[derive(Debug, Args)]
pub struct ServeRefusalArgs {
    /// The inherited descriptor of the pool's listening socket.
    #[arg(long, value_name = "N")]
    pub fd: i32,
    /// The pool's name.
    #[arg(long, value_name = "NAME")]
    pub pool: String,
    /// How many more ranks are to be told.
    #[arg(long, value_name = "N")]
    pub untold: u32,
    /// Seconds left until the attach deadline.
    #[arg(long, value_name = "SECS")]
    pub seconds: f64,
    /// The refusal, as the creator encoded it.
    #[arg(long, value_name = "JSON")]
    pub message: String,
}

/// The refusal policy of `alloc`'s build ([`pool_core::shared::Refusals::Hand`]):
/// start the helper with the failed creator's socket and terms instead of a
/// thread, which would die when the CLI exits; if it cannot start, answer
/// the ranks waiting now and say why the later ones will not hear the cause.
pub(super) fn hand_over(listener: OwnedFd, terms: RefusalTerms) {
    match spawn_helper(&listener, &terms) {
        Ok(pid) => tracing::debug!(
            "pid {pid} answers the ranks of the failed pool `{}` that come later",
            terms.pool
        ),
        Err(e) => {
            tracing::warn!(
                "cannot start `hostpool {SUBCOMMAND}` to keep answering on the failed shared pool \
                 `{}`'s socket ({e}); ranks started from now on will not hear this cause and each \
                 waits out its attach timeout: stop them, or start them after the attach timeout",
                terms.pool
            );
            if let Ok(refusal) = Refusal::resume(listener, terms) {
                refusal.refuse_pending();
            }
        }
    }
    // Dropping `listener` closes this process's descriptor of the socket:
    // from now on the helper holds it alone.
}

/// Run `hostpool serve-refusal` with a descriptor of the failed creator's
/// `listener` it inherits (a `dup`, which lacks close-on-exec, closed here
/// once the helper started) and its `terms` as arguments. The helper's pid.
fn spawn_helper(listener: &OwnedFd, terms: &RefusalTerms) -> std::io::Result<u32> {
    let exe = std::env::current_exe()?;
    // Inherited by every process started meanwhile: the CLI starts none
    // while a pool fails.
    let inherited = rustix::io::dup(listener)?;
    let child = Command::new(exe)
        .arg(SUBCOMMAND)
        .args(["--pool", &terms.pool])
        .args(["--fd", &inherited.as_raw_fd().to_string()])
        .args(["--untold", &terms.untold.to_string()])
        .args([
            "--seconds",
            &format!("{:.3}", terms.remaining.as_secs_f64()),
        ])
        .args(["--message", &terms.message])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn();
    drop(inherited);
    // Not waited for: the CLI exits at once, and the helper's parent is
    // then the reaper of orphans (init, or a subreaper).
    Ok(child?.id())
}

/// Run `hostpool serve-refusal`: take the inherited socket and answer on
/// it until done or the deadline; status 0.
///
/// # Errors
/// [`Error::Config`] (status 2) for a descriptor that was not inherited or
/// is no listening socket, a bad `--seconds` or `--message`.
pub(super) fn run(args: ServeRefusalArgs) -> Result<i32, Error> {
    // Blocked by the `alloc` that started it: SIGTERM must end it.
    crate::sys::unblock_all_signals().map_err(|e| Error::Plugin {
        what: SUBCOMMAND.into(),
        message: "cannot unblock SIGINT/SIGTERM/SIGHUP/SIGQUIT".into(),
        source: Some(Box::new(e)),
    })?;
    let listener = crate::sys::inherited_fd(args.fd).map_err(|e| {
        Error::config(format!(
            "serve-refusal --fd {}: not a descriptor this process inherited ({e}); only a failed \
             `hostpool alloc --shared` creator starts this command",
            args.fd
        ))
    })?;
    let remaining = Duration::try_from_secs_f64(args.seconds).map_err(|_| {
        Error::config(format!(
            "serve-refusal --seconds {}: give the seconds left until the attach deadline, 0 or more",
            args.seconds
        ))
    })?;
    let refusal = Refusal::resume(
        listener,
        RefusalTerms {
            pool: args.pool,
            message: args.message,
            untold: args.untold,
            remaining,
        },
    )?;
    refusal.serve();
    Ok(0)
}
