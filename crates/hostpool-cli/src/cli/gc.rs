//! `hostpool gc`: remove the pool files no live process holds.

use std::path::PathBuf;

use clap::Args;
use pool_core::Error;

use super::{output, write_stdout};

/// `hostpool gc`.
#[derive(Debug, Args)]
pub struct GcArgs {
    /// Directory to scan (repeatable; default /dev/shm and every hugetlbfs mount).
    #[arg(long, value_name = "DIR")]
    pub dir: Vec<PathBuf>,
    /// Print as JSON on stdout.
    #[arg(long)]
    pub json: bool,
}

/// Run `hostpool gc`.
pub(super) fn run(args: GcArgs) -> Result<i32, Error> {
    let dirs = if args.dir.is_empty() {
        pool_core::gc::default_dirs()
    } else {
        // A --dir given by hand that is no directory is a typo, not a scan
        // that found nothing.
        for d in &args.dir {
            if !d.is_dir() {
                let what = if d.exists() {
                    "is not a directory"
                } else {
                    "does not exist"
                };
                return Err(Error::config(format!(
                    "gc --dir {} {what}; give a directory pools keep files in, such as /dev/shm \
                     or a hugetlbfs mount, or leave --dir out to scan those",
                    d.display()
                )));
            }
        }
        args.dir
    };
    let report = pool_core::gc::collect(&dirs);
    let text = if args.json {
        super::to_json(&report)?
    } else {
        output::human_gc(&report)
    };
    write_stdout(&text)?;
    Ok(0)
}
