//! `file-pool`: builds the pool a config file describes, with the backings
//! this binary links: pool-core's registry plus the `file` backing of this
//! crate, and nothing else from hostpool.
//!
//! ```text
//! file-pool CONFIG   build, prefault and tear down the pool CONFIG describes
//!                    (TOML, or JSON: `.json` or text starting with `{`), then
//!                    print the JSON report (after teardown, so it includes
//!                    phases.teardown and teardown_issues)
//! file-pool --list   the backings this binary registers, sorted, one per line:
//!                    name, crate and summary, separated by tabs
//! file-pool --help   this text
//! ```
//!
//! The config selects the backing by name (`backing = "file"`); the binary
//! has no backing of its own choosing. Exit status: 0 success; 1 a runtime
//! failure (the node cannot hold the pool, a system call failed, teardown
//! could not undo a step); 2 a usage or configuration error.

// THE LINKING PITFALL. Cargo hands this binary the crate's library, but rustc
// links a dependency only when the code names it. The `file` backing's record
// is a static that `inventory` collects at start-up, and nothing here calls
// into the library, so without the next line the library is never linked:
// the record silently vanishes, `--list` prints nothing and `backing =
// "file"` is an unknown backing. Naming the crate keeps it. Every binary (and
// every test target) that wants the plugin needs this line, directly or
// through a crate that has it; tests/binary.rs checks the exact set.
use hostpool_example_backing_file as _;

use std::error::Error as _;
use std::path::Path;
use std::process::ExitCode;

use pool_core::plugin::BackingPlugin;
use pool_core::plugin::registry;
use pool_core::{Error, Pool, PoolConfig, PoolPlan, Quiet};

const USAGE: &str = "usage: file-pool CONFIG | file-pool --list | file-pool --help";

const HELP: &str = "\
file-pool: build, prefault and tear down the pool a config file describes, and print its JSON report

usage:
  file-pool CONFIG   CONFIG is TOML or JSON; it selects the backing by name, e.g. backing = \"file\"
  file-pool --list   the registered backings: name, crate, summary (tab-separated)

exit status: 0 success, 1 runtime failure, 2 usage or configuration error";

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.iter().map(String::as_str).collect::<Vec<_>>()[..] {
        ["--help" | "-h"] => {
            println!("{HELP}");
            ExitCode::SUCCESS
        }
        ["--list"] => list(),
        [path] if !path.starts_with('-') => alloc(Path::new(path)),
        _ => {
            eprintln!("file-pool: {USAGE}");
            ExitCode::from(2)
        }
    }
}

/// Print the registered backings.
fn list() -> ExitCode {
    match registry::<BackingPlugin>() {
        Ok(backings) => {
            for (name, record) in backings {
                println!("{name}\t{}\t{}", record.origin, record.summary);
            }
            ExitCode::SUCCESS
        }
        Err(e) => fail(&e),
    }
}

/// Read the config, build the pool, tear it down, print the report.
fn alloc(path: &Path) -> ExitCode {
    let built = PoolConfig::from_path(path)
        .and_then(PoolPlan::new)
        .and_then(|plan| Pool::build(&plan, &Quiet));
    let pool = match built {
        Ok(pool) => pool,
        Err(e) => return fail(&e),
    };
    let report = pool.teardown();
    match serde_json::to_string_pretty(&report) {
        Ok(json) => println!("{json}"),
        Err(e) => {
            eprintln!("file-pool: cannot write the report as JSON: {e}");
            return ExitCode::from(1);
        }
    }
    if report.teardown_issues.is_empty() {
        ExitCode::SUCCESS
    } else {
        eprintln!(
            "file-pool: teardown could not undo {} step(s); see teardown_issues in the report",
            report.teardown_issues.len()
        );
        ExitCode::from(1)
    }
}

/// One paragraph on stderr with the whole cause chain; exit 2 for usage.
fn fail(e: &Error) -> ExitCode {
    let mut msg = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        msg.push_str(": ");
        msg.push_str(&s.to_string());
        source = s.source();
    }
    eprintln!("file-pool: {msg}");
    ExitCode::from(if e.is_usage() { 2 } else { 1 })
}
