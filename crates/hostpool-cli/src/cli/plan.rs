//! `hostpool plan`: everything `alloc` would do and why, with no side
//! effects.

use clap::Args;
use pool_core::{Error, PoolPlan};

use super::args::{PoolArgs, resolve_config};
use super::{output, report_error, write_stdout};

/// `hostpool plan`.
#[derive(Debug, Args)]
pub struct PlanArgs {
    /// The pool.
    #[command(flatten)]
    pub pool: PoolArgs,
    /// Print the plan as JSON on stdout.
    #[arg(long)]
    pub json: bool,
}

/// Run `hostpool plan`.
pub(super) fn run(args: PlanArgs) -> Result<i32, Error> {
    let plan = PoolPlan::new(resolve_config(&args.pool)?)?;
    let report = plan.report();
    let text = if args.json {
        super::to_json(&report)?
    } else {
        output::human_plan(&report)
    };
    write_stdout(&text)?;
    if report.fits {
        Ok(0)
    } else {
        if let Some(e) = report.capacity.iter().find_map(|c| c.to_error()) {
            report_error(&e);
        }
        Ok(1)
    }
}
