//! `hostpool doctor`: whether this node can hold the pool asked for, and why
//! not.
//!
//! One finding per line, each with a verdict (`ok`, `info`, `warn`, `fail`)
//! and, when it is not ok, the remedy: a command or a setting. The areas, in
//! order: `memory` (`MemAvailable`), `cgroup` (`memory.max`), `memlock`
//! (`RLIMIT_MEMLOCK`, `CAP_IPC_LOCK`, the pin bound), `kernel` (release,
//! `MADV_POPULATE_WRITE`, NUMA nodes); then each registered plugin's own
//! areas, from the doctor hook in its record (the built-in ones: `thp`;
//! `hugepages`, `hugetlbfs` and the hugetlb `cgroup` limits; `shm`; `cuda`;
//! `rdma`; `nixl`; the adapter's `mooncake`); then `engines` (the serving
//! engines installed in the engine's Python, their versions, and whether
//! hostpool was tested with them), `plugins`, `keepers` (each kept pool, and
//! the cgroup its keeper's memory is charged to), `leftovers`
//! (what `hostpool gc` would remove) and, when a pool is given (`--config`
//! or any pool flag), `pool`: the plan's capacity checks and verdict, and
//! whether its pinning and registration can work here (the plugins say for
//! their own).
//!
//! Read-only: it maps no pool and writes nothing. Leftover files are judged
//! by `gc`'s own probe (a momentary non-blocking exclusive `flock`, which
//! sees holders in other PID namespaces too), and nothing is removed. The
//! other probes that touch anything are one page of anonymous memory for the
//! `MADV_POPULATE_WRITE` probe, `cuInit` and device queries of the CUDA
//! driver, opening each RDMA device to read its `max_mr_size`, and a Python
//! interpreter (`$HOSTPOOL_PYTHON`, else `python3`) asked twice, under a
//! deadline and writing no bytecode (`pool_core::host::python`): whether it
//! imports Mooncake's engine, and which engines it has installed (from their
//! metadata, importing no engine) with the versions its hostpool was tested with.
//!
//! Exit status: 0 when no finding fails, 1 when one does (for a pool: it
//! does not fit, or a required pin or a registration would fail), 2 for a
//! usage or configuration error.

mod cgroup;
mod engines;
mod keepers;
mod kernel;
mod leftovers;
mod memlock;
mod memory;
mod output;
mod plugins;
mod pool;

use clap::Args;
use pool_core::PlanReport;
use pool_core::plugin::{AdapterPlugin, BackingPlugin, PinnerPlugin, RegistrarPlugin};
use pool_core::plugin::{DoctorContext, DoctorFn, PoolFacts};
use pool_core::plugin::{PluginRecord, registry};
use pool_core::{Error, PoolPlan};

use super::PoolArgs;

/// `hostpool doctor` arguments.
#[derive(Debug, Args)]
pub struct DoctorArgs {
    /// The pool to check against this node (optional).
    #[command(flatten)]
    pub pool: PoolArgs,
    /// Print as JSON on stdout.
    #[arg(long)]
    pub json: bool,
}

pub use pool_core::plugin::{Finding, Level};

/// Run `hostpool doctor`.
///
/// # Errors
/// A usage or configuration error in the pool given (exit status 2), or
/// stdout that cannot be written.
pub fn run(args: DoctorArgs) -> Result<i32, Error> {
    let mut plan = None;
    let mut plan_error = None;
    if PoolArgs::given(&args.pool) {
        let config = super::resolve_config(&args.pool)?;
        match PoolPlan::new(config) {
            Ok(p) => plan = Some(p),
            Err(e) if e.is_usage() => return Err(e),
            Err(e) => plan_error = Some(e),
        }
    }
    let report = plan.as_ref().map(PoolPlan::report);
    let findings = collect(plan.as_ref(), report.as_ref(), plan_error.as_ref());
    let verdict = overall(&findings);
    let text = if args.json {
        super::to_json(&output::Report {
            findings: &findings,
            pool: report.as_ref(),
            verdict,
        })?
    } else {
        output::human(&findings, verdict)
    };
    super::write_stdout(&text)?;
    Ok(i32::from(verdict == Level::Fail))
}

/// `fail` when a finding fails, else `warn` when one warns, else `ok`.
fn overall(findings: &[Finding]) -> Level {
    if findings.iter().any(|f| f.verdict == Level::Fail) {
        Level::Fail
    } else if findings.iter().any(|f| f.verdict == Level::Warn) {
        Level::Warn
    } else {
        Level::Ok
    }
}

/// Every finding, in the order they are shown: the areas every pool has,
/// then each plugin's own (from the doctor hook in its record, so this
/// names no plugin), then the pool asked for.
fn collect(
    plan: Option<&PoolPlan>,
    report: Option<&PlanReport>,
    plan_error: Option<&Error>,
) -> Vec<Finding> {
    let ctx = DoctorContext {
        pool: plan.zip(report).map(|(p, r)| PoolFacts {
            config: p.config(),
            page_size: r.page_size,
            mapped_bytes: r.mapped_bytes,
            prefault_bytes: r.prefault.bytes,
        }),
    };
    let pool_dir = plan.and_then(|p| p.config().dir.clone());

    let mut out = Vec::new();
    out.extend(guarded("memory", memory::findings));
    out.extend(guarded("cgroup", cgroup::findings));
    out.extend(guarded("memlock", memlock::findings));
    out.extend(guarded("kernel", kernel::findings));
    let mut pool_lines = Vec::new();
    for (name, hook) in hooks() {
        for f in guarded(name, || hook(&ctx)) {
            if f.area == "pool" {
                pool_lines.push(f);
            } else {
                out.push(f);
            }
        }
    }
    out.extend(guarded("engines", engines::findings));
    out.extend(guarded("plugins", plugins::findings));
    out.extend(guarded("keepers", keepers::findings));
    out.extend(guarded("leftovers", || {
        leftovers::findings(pool_dir.as_deref())
    }));
    if let Some(e) = plan_error {
        out.push(
            Finding::new("pool", "plan", "this pool cannot be planned on this node")
                .fail(e.to_string()),
        );
    }
    if let (Some(plan), Some(report)) = (plan, report) {
        out.extend(guarded("pool", || {
            pool::findings(&ctx, plan, report, pool_lines)
        }));
    }
    out
}

/// Every registered plugin's doctor hook: backings, pinners, registrars,
/// adapters, each kind sorted by name.
fn hooks() -> Vec<(&'static str, DoctorFn)> {
    fn of<T: PluginRecord>() -> Vec<(&'static str, DoctorFn)> {
        registry::<T>()
            .map(|r| {
                r.values()
                    .filter_map(|p| Some((p.name(), p.doctor()?)))
                    .collect()
            })
            .unwrap_or_default()
    }
    let mut all = of::<BackingPlugin>();
    all.extend(of::<PinnerPlugin>());
    all.extend(of::<RegistrarPlugin>());
    all.extend(of::<AdapterPlugin>());
    all
}

/// The message of a caught panic.
fn panic_text(payload: &(dyn std::any::Any + Send)) -> String {
    payload
        .downcast_ref::<&str>()
        .map(|s| (*s).to_string())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a panic with no message".to_string())
}

/// Run one area's probe; a panic (a bug: none is known) becomes a finding.
fn guarded(area: &'static str, f: impl FnOnce() -> Vec<Finding>) -> Vec<Finding> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)).unwrap_or_else(|p| {
        vec![
            Finding::new(
                area,
                "probe",
                format!("could not be examined: {}", panic_text(p.as_ref())),
            )
            .warn("this is a bug in hostpool doctor; please report it with this output"),
        ]
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_overall_verdict_ignores_info() {
        let f = |l| Finding::new("memory", "x", "y").level(l);
        assert_eq!(overall(&[f(Level::Ok), f(Level::Info)]), Level::Ok);
        assert_eq!(overall(&[f(Level::Warn), f(Level::Info)]), Level::Warn);
        assert_eq!(overall(&[f(Level::Warn), f(Level::Fail)]), Level::Fail);
    }
}
