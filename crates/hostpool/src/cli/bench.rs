//! `hostpool bench`: prefault and mlock measured against memset (being written).

use clap::Args;
use pool_core::Error;

/// `hostpool bench` arguments.
#[derive(Debug, Args)]
pub struct BenchArgs {
    /// Print as JSON on stdout.
    #[arg(long)]
    pub json: bool,
}

/// Run `hostpool bench`.
pub fn run(_args: BenchArgs) -> Result<i32, Error> {
    Err(Error::NotAvailable {
        what: "hostpool bench".into(),
        reason: "not built yet".into(),
    })
}
