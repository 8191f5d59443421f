//! `hostpool doctor`: whether this node can hold the pool asked for (being written).

use clap::Args;
use pool_core::Error;

/// `hostpool doctor` arguments.
#[derive(Debug, Args)]
pub struct DoctorArgs {
    /// Print as JSON on stdout.
    #[arg(long)]
    pub json: bool,
}

/// Run `hostpool doctor`.
pub fn run(_args: DoctorArgs) -> Result<i32, Error> {
    Err(Error::NotAvailable {
        what: "hostpool doctor".into(),
        reason: "not built yet".into(),
    })
}
