//! `hostpool doctor`: whether this node can hold the pool asked for, and why
//! not.
//!
//! One finding per line, each with a verdict (`ok`, `info`, `warn`, `fail`)
//! and, when it is not ok, the remedy: a command or a setting. The areas, in
//! order: `memory` (`MemAvailable`), `hugepages` (each page size's pool, per
//! NUMA node), `hugetlbfs` (mounts, page size, `size=` limit), `shm`
//! (`/dev/shm`), `cgroup` (`memory.max`, hugetlb limits), `memlock`
//! (`RLIMIT_MEMLOCK`, `CAP_IPC_LOCK`, the pin bound), `thp`, `kernel`
//! (release, `MADV_POPULATE_WRITE`, NUMA nodes), `cuda`, `rdma`, `plugins`,
//! `leftovers` (what `hostpool gc` would remove) and, when a pool is given
//! (`--config` or any pool flag), `pool`: the plan's capacity checks and
//! verdict, and whether its pinning and registration can work here.
//!
//! Read-only: it maps no pool and writes nothing. Leftover files are judged
//! from `/proc/locks` instead of by taking locks as `gc` does. The probes
//! that touch anything are one page of anonymous memory for the
//! `MADV_POPULATE_WRITE` probe, `cuInit` and device queries of the CUDA
//! driver, and opening each RDMA device to read its `max_mr_size`.
//!
//! Exit status: 0 when no finding fails, 1 when one does (for a pool: it
//! does not fit, or a required pin or a registration would fail), 2 for a
//! usage or configuration error.

mod cgroup;
mod cuda;
mod hugepages;
mod hugetlbfs;
mod kernel;
mod leftovers;
mod memlock;
mod memory;
mod output;
mod plugins;
mod pool;
mod rdma;
mod shm;
mod thp;

use clap::Args;
use pool_core::fs::{FsKind, filesystem_kind};
use pool_core::pool::PlanReport;
use pool_core::{Error, PoolPlan};
use serde::Serialize;
use serde_json::Value;

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

/// How a finding stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Level {
    /// Nothing to do.
    Ok,
    /// Worth knowing; nothing is wrong for the pools this node is used for.
    Info,
    /// Something will be slower, skipped, or may fail.
    Warn,
    /// The pool asked for cannot be built, or the node is broken for it.
    Fail,
}

impl Level {
    fn name(self) -> &'static str {
        match self {
            Level::Ok => "ok",
            Level::Info => "info",
            Level::Warn => "warn",
            Level::Fail => "fail",
        }
    }
}

/// One line of the report.
#[derive(Debug, Clone, Serialize)]
pub struct Finding {
    /// The area: `memory`, `hugepages`, `hugetlbfs`, `shm`, `cgroup`,
    /// `memlock`, `thp`, `kernel`, `cuda`, `rdma`, `plugins`, `leftovers`,
    /// `pool`.
    pub area: &'static str,
    /// What was looked at within the area.
    pub item: String,
    /// What was found, in words.
    pub value: String,
    /// The verdict.
    pub verdict: Level,
    /// What to do, when the verdict is not ok.
    pub remedy: Option<String>,
    /// The figures behind the value, for scripts (absent when none).
    #[serde(skip_serializing_if = "Value::is_null")]
    pub details: Value,
}

impl Finding {
    fn new(area: &'static str, item: impl Into<String>, value: impl Into<String>) -> Finding {
        Finding {
            area,
            item: item.into(),
            value: value.into(),
            verdict: Level::Ok,
            remedy: None,
            details: Value::Null,
        }
    }

    fn level(mut self, verdict: Level) -> Finding {
        self.verdict = verdict;
        self
    }

    fn info(self, remedy: impl Into<String>) -> Finding {
        self.level(Level::Info).remedy(remedy)
    }

    fn warn(self, remedy: impl Into<String>) -> Finding {
        self.level(Level::Warn).remedy(remedy)
    }

    fn fail(self, remedy: impl Into<String>) -> Finding {
        self.level(Level::Fail).remedy(remedy)
    }

    fn remedy(mut self, remedy: impl Into<String>) -> Finding {
        let r = remedy.into();
        self.remedy = (!r.is_empty()).then_some(r);
        self
    }

    fn details(mut self, details: Value) -> Finding {
        self.details = details;
        self
    }
}

const GIB: u64 = 1 << 30;

/// Run `hostpool doctor`.
///
/// # Errors
/// A usage or configuration error in the pool given (exit status 2), or
/// stdout that cannot be written.
pub fn run(args: DoctorArgs) -> Result<i32, Error> {
    let mut plan = None;
    let mut plan_error = None;
    if pool_given(&args.pool) {
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
        serde_json::to_string_pretty(&output::Report {
            findings: &findings,
            pool: report.as_ref(),
            verdict,
        })
        .map_err(|e| Error::config(e.to_string()))?
    } else {
        output::human(&findings, verdict)
    };
    super::write_stdout(&text)?;
    Ok(i32::from(verdict == Level::Fail))
}

/// Whether any pool flag or `--config` was given. Destructured in full, so a
/// new pool flag cannot be forgotten here.
fn pool_given(a: &PoolArgs) -> bool {
    let PoolArgs {
        config,
        size,
        backing,
        dir,
        page_size,
        threads,
        prefault,
        pin,
        pin_required,
        memlock_bound,
        pin_scope,
        register,
        shared,
        world,
        rank,
        attach_timeout,
        numa_node,
    } = a;
    config.is_some()
        || size.is_some()
        || backing.is_some()
        || dir.is_some()
        || page_size.is_some()
        || threads.is_some()
        || prefault.is_some()
        || pin.is_some()
        || *pin_required
        || memlock_bound.is_some()
        || pin_scope.is_some()
        || !register.is_empty()
        || shared.is_some()
        || world.is_some()
        || rank.is_some()
        || attach_timeout.is_some()
        || numa_node.is_some()
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

/// Every finding, in the order they are shown.
fn collect(
    plan: Option<&PoolPlan>,
    report: Option<&PlanReport>,
    plan_error: Option<&Error>,
) -> Vec<Finding> {
    // The pool's own `[rdma]` table decides which library is probed.
    let rdma_options: registrar_rdma::RdmaOptions = plan
        .and_then(|p| p.config.plugin_table(registrar_rdma::NAME))
        .and_then(|t| serde_json::from_value(t.clone()).ok())
        .unwrap_or_default();
    let cuda = guarded_probe(pinner_cuda::probe_devices);
    let rdma = guarded_probe(|| registrar_rdma::probe(&rdma_options));
    let huge_need = plan.zip(report).and_then(|(p, r)| huge_need(p, r));
    let pool_dir = plan.and_then(|p| p.config.dir.clone());

    let mut out = Vec::new();
    out.extend(guarded("memory", memory::findings));
    out.extend(guarded("hugepages", || hugepages::findings(huge_need)));
    out.extend(guarded("hugetlbfs", || hugetlbfs::findings(huge_need)));
    out.extend(guarded("shm", shm::findings));
    out.extend(guarded("cgroup", cgroup::findings));
    out.extend(guarded("memlock", memlock::findings));
    out.extend(guarded("thp", thp::findings));
    out.extend(guarded("kernel", kernel::findings));
    out.extend(guarded("cuda", || cuda::findings(&cuda)));
    out.extend(guarded("rdma", || rdma::findings(&rdma, &rdma_options)));
    out.extend(guarded("plugins", plugins::findings));
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
            pool::findings(plan, report, &cuda, &rdma, &rdma_options)
        }));
    }
    out
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

/// A probe that returns a result, with a panic turned into an error.
fn guarded_probe<T>(f: impl FnOnce() -> Result<T, Error>) -> Result<T, Error> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)).unwrap_or_else(|p| {
        Err(Error::Plugin {
            what: "probe".into(),
            message: format!("failed unexpectedly: {}", panic_text(p.as_ref())),
            source: None,
        })
    })
}

/// `(page size, pages)` a hugetlb pool needs, when the pool is one.
fn huge_need(plan: &PoolPlan, report: &PlanReport) -> Option<(u64, u64)> {
    let page = report.page_size;
    pool_is_hugetlb(plan, report).then(|| (page, report.mapped_bytes.div_ceil(page.max(1))))
}

/// Whether the pool is made of reserved huge pages: the hugetlbfs backing,
/// or a `dir` on a hugetlbfs mount.
fn pool_is_hugetlb(plan: &PoolPlan, report: &PlanReport) -> bool {
    report.backing == "hugetlbfs"
        || plan
            .config
            .dir
            .as_deref()
            .is_some_and(|d| matches!(filesystem_kind(d), Ok(FsKind::Hugetlbfs { .. })))
}

/// A reason split at its first `; `: what is wrong, and what to do.
fn split_reason(reason: &str) -> (String, Option<String>) {
    match reason.split_once("; ") {
        Some((what, todo)) => (what.to_string(), Some(todo.to_string())),
        None => (reason.to_string(), None),
    }
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
