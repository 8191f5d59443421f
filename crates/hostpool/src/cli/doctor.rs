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

use std::collections::HashSet;
use std::ffi::OsString;
use std::fmt::Write as _;
use std::io;
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use clap::Args;
use pool_core::capacity::{self, CapacityCheck, Verdict};
use pool_core::config::PinScope;
use pool_core::fs::{FsKind, filesystem_kind};
use pool_core::layout::format_bytes;
use pool_core::memlock::{self, MemlockPolicy};
use pool_core::plugin::{self, PluginRecord};
use pool_core::pool::PlanReport;
use pool_core::{
    BackingPlugin, Error, PinnerPlugin, PoolPlan, RegistrarPlugin, hugetlb, numa, shared,
};
use serde::Serialize;
use serde_json::{Value, json};

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

/// `hostpool doctor --json`.
#[derive(Debug, Serialize)]
struct Report<'a> {
    findings: &'a [Finding],
    pool: Option<&'a PlanReport>,
    verdict: Level,
}

const GIB: u64 = 1 << 30;
const SHM: &str = "/dev/shm";
const THP_DIR: &str = "/sys/kernel/mm/transparent_hugepage";

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
        serde_json::to_string_pretty(&Report {
            findings: &findings,
            pool: report.as_ref(),
            verdict,
        })
        .map_err(|e| Error::config(e.to_string()))?
    } else {
        human(&findings, verdict)
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
    out.extend(guarded("memory", memory));
    out.extend(guarded("hugepages", || hugepages(huge_need)));
    out.extend(guarded("hugetlbfs", || hugetlbfs(huge_need)));
    out.extend(guarded("shm", shm));
    out.extend(guarded("cgroup", cgroup));
    out.extend(guarded("memlock", memlock_findings));
    out.extend(guarded("thp", thp));
    out.extend(guarded("kernel", kernel));
    out.extend(guarded("cuda", || cuda_findings(&cuda)));
    out.extend(guarded("rdma", || rdma_findings(&rdma, &rdma_options)));
    out.extend(guarded("plugins", plugins));
    out.extend(guarded("leftovers", || leftovers(pool_dir.as_deref())));
    if let Some(e) = plan_error {
        out.push(
            Finding::new("pool", "plan", "this pool cannot be planned on this node")
                .fail(e.to_string()),
        );
    }
    if let (Some(plan), Some(report)) = (plan, report) {
        out.extend(guarded("pool", || {
            pool_findings(plan, report, &cuda, &rdma, &rdma_options)
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

// ---------------------------------------------------------------- memory

fn memory() -> Vec<Finding> {
    let total = capacity::meminfo("MemTotal");
    let f = Finding::new("memory", "MemAvailable", "");
    vec![match capacity::meminfo("MemAvailable") {
        Some(avail) => Finding {
            value: format!(
                "{} of {} (MemTotal); reserved huge pages are not counted in it",
                format_bytes(avail),
                total.map_or("unknown".into(), format_bytes)
            ),
            ..f
        }
        .details(json!({ "available": avail, "total": total })),
        None => Finding {
            value: "cannot be read from /proc/meminfo".into(),
            ..f
        }
        .warn("mount /proc (in a container: do not mask /proc/meminfo)"),
    }]
}

// ---------------------------------------------------------------- hugepages

/// How to reserve `pages` (or some) huge pages of `page` bytes.
fn reserve_remedy(page: u64, pages: Option<u64>) -> String {
    let n = pages.map_or("<pages>".to_string(), |p| p.to_string());
    let file = hugetlb::sysfs_dir(page).join("nr_hugepages");
    if page >= GIB {
        format!(
            "reserve at boot: `hugepagesz=1G hugepages={n}` on the kernel command line (1 GiB \
             pages seldom reserve once memory is fragmented), or `echo {n} > {}`",
            file.display()
        )
    } else {
        format!(
            "`echo {n} > {}` (persist: `hugepages={n}` on the kernel command line, or \
             vm.nr_hugepages for the default size); Kubernetes pods then request hugepages-{}",
            file.display(),
            hugetlb::k8s_size_name(page)
        )
    }
}

fn hugepages(need: Option<(u64, u64)>) -> Vec<Finding> {
    let sizes = hugetlb::supported_sizes();
    if sizes.is_empty() {
        return vec![
            Finding::new(
                "hugepages",
                "huge page sizes",
                "none: /sys/kernel/mm/hugepages is missing (a kernel without CONFIG_HUGETLBFS, \
                 or no /sys)",
            )
            .info(
                "anonymous and shared-memory pools still work; for huge pages use a kernel \
                   with CONFIG_HUGETLBFS (and in a container, mount /sys)",
            ),
        ];
    }
    let default = hugetlb::default_size();
    let nodes = numa::online_nodes();
    let mut out = Vec::new();
    let mut per_node = Vec::new();
    for &size in &sizes {
        let label = format_bytes(size);
        let item = if default == Some(size) {
            format!("{label} pages (default)")
        } else {
            format!("{label} pages")
        };
        let wanted = need.filter(|(p, _)| *p == size).map(|(_, n)| n);
        let node_pools: Vec<(u32, Result<hugetlb::HugePagePool, Error>)> = nodes
            .iter()
            .map(|&n| (n, hugetlb::node_pool(n, size)))
            .collect();
        let node_json: Vec<Value> = node_pools
            .iter()
            .map(|(n, p)| match p {
                Ok(p) => json!({"node": n, "total": p.total, "free": p.free, "surplus": p.surplus}),
                Err(e) => json!({"node": n, "error": e.to_string()}),
            })
            .collect();
        let f = Finding::new("hugepages", item, "");
        out.push(match hugetlb::pool(size) {
            Ok(p) => {
                let f = Finding {
                    value: format!(
                        "total {}, free {}, reserved {}, surplus {}, overcommit {} ({} available)",
                        p.total,
                        p.free,
                        p.resv,
                        p.surplus,
                        p.overcommit,
                        format_bytes(p.available_bytes())
                    ),
                    ..f
                }
                .details(json!({
                    "page_size": size,
                    "total": p.total,
                    "free": p.free,
                    "reserved": p.resv,
                    "surplus": p.surplus,
                    "overcommit": p.overcommit,
                    "available": p.available(),
                    "nodes": node_json,
                }));
                if p.total == 0 && p.overcommit == 0 {
                    f.info(format!(
                        "none reserved (needed only for hugetlbfs pools): {}",
                        reserve_remedy(size, wanted)
                    ))
                } else if p.available() == 0 {
                    f.warn(format!(
                        "every page is in use or promised to a mapping; stop what holds them \
                         (`grep -l huge /proc/[0-9]*/smaps`, `hostpool gc`) or reserve more: {}",
                        reserve_remedy(size, wanted.map(|w| p.total.saturating_add(w)))
                    ))
                } else {
                    f
                }
            }
            Err(e) => Finding {
                value: format!("cannot be read: {e}"),
                ..f
            }
            .warn("check that /sys/kernel/mm/hugepages is readable"),
        });
        if nodes.len() > 1 {
            for (n, p) in node_pools {
                let item = format!("{label} pages, node {n}");
                per_node.push(match p {
                    Ok(p) => Finding::new(
                        "hugepages",
                        item,
                        format!("total {}, free {}, surplus {}", p.total, p.free, p.surplus),
                    )
                    .details(json!({
                        "node": n,
                        "page_size": size,
                        "total": p.total,
                        "free": p.free,
                        "surplus": p.surplus,
                    })),
                    Err(e) => Finding::new("hugepages", item, format!("cannot be read: {e}"))
                        .info("check that /sys/devices/system/node is readable"),
                });
            }
        }
    }
    out.extend(per_node);
    out
}

// ---------------------------------------------------------------- hugetlbfs

/// A mount point from `/proc/mounts`, with its options.
struct Mount {
    point: PathBuf,
    options: String,
}

/// Undo the octal escapes of `/proc/mounts` (`\040` for a space).
fn unescape(field: &str) -> PathBuf {
    let b = field.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let octal = b
            .get(i + 1..i + 4)
            .filter(|d| b[i] == b'\\' && d.iter().all(|c| (b'0'..=b'7').contains(c)));
        match octal {
            Some(d) => {
                let v = d.iter().fold(0u32, |acc, c| acc * 8 + u32::from(c - b'0'));
                out.push(u8::try_from(v).unwrap_or(b'?'));
                i += 4;
            }
            None => {
                out.push(b[i]);
                i += 1;
            }
        }
    }
    PathBuf::from(OsString::from_vec(out))
}

fn hugetlbfs_mounts() -> io::Result<Vec<Mount>> {
    let text = std::fs::read_to_string("/proc/mounts")?;
    Ok(text
        .lines()
        .filter_map(|line| {
            let mut f = line.split_whitespace();
            let (_, point, kind, options) = (f.next()?, f.next()?, f.next()?, f.next()?);
            (kind == "hugetlbfs").then(|| Mount {
                point: unescape(point),
                options: options.to_string(),
            })
        })
        .collect())
}

fn hugetlbfs(need: Option<(u64, u64)>) -> Vec<Finding> {
    let mounts = match hugetlbfs_mounts() {
        Ok(m) => m,
        Err(e) => {
            return vec![
                Finding::new(
                    "hugetlbfs",
                    "mounts",
                    format!("cannot read /proc/mounts: {e}"),
                )
                .warn("mount /proc"),
            ];
        }
    };
    if mounts.is_empty() {
        return vec![Finding::new("hugetlbfs", "mounts", "none mounted").info(
            "the hugetlbfs backing works without one (memfd_create with MFD_HUGETLB); to \
                 share a pool by path: `mount -t hugetlbfs -o pagesize=2M none /dev/hugepages` \
                 (pagesize=1G for 1 GiB pages); Kubernetes: an emptyDir with medium \
                 HugePages-2Mi or HugePages-1Gi",
        )];
    }
    mounts.iter().map(|m| mount_finding(m, need)).collect()
}

fn mount_finding(m: &Mount, need: Option<(u64, u64)>) -> Finding {
    let item = m.point.display().to_string();
    let page = match filesystem_kind(&m.point) {
        Ok(FsKind::Hugetlbfs { page_size }) => page_size,
        Ok(_) => {
            return Finding::new(
                "hugetlbfs",
                item,
                "listed in /proc/mounts, but another file \
                                 system is mounted over it",
            )
            .info("use the mount on top, or unmount the one over it");
        }
        Err(e) => {
            return Finding::new("hugetlbfs", item, format!("cannot be examined: {e}"))
                .warn(format!("check the permissions of {}", m.point.display()));
        }
    };
    let label = format_bytes(page);
    let mut value = format!("{label} pages");
    let mut details = json!({ "path": item, "page_size": page, "options": m.options });
    let mut verdict = Level::Ok;
    let mut remedies = Vec::new();
    match hugetlb::mount_limit(&m.point) {
        Ok(Some(l)) => {
            let _ = write!(
                value,
                ", size={} ({} of {} pages free)",
                format_bytes(l.total_bytes()),
                l.free_pages,
                l.total_pages
            );
            details["size_limit"] = json!(l.total_bytes());
            details["limit_free_pages"] = json!(l.free_pages);
            if l.free_pages == 0 {
                verdict = Level::Warn;
                remedies.push(format!(
                    "its size= limit is used up: remove stale files (`hostpool gc --dir {}`) or \
                     mount it again with a larger size= (hugetlbfs cannot be remounted to \
                     change it)",
                    m.point.display()
                ));
            }
        }
        Ok(None) => value.push_str(", no size= limit"),
        Err(e) => {
            let _ = write!(value, ", size= limit unknown ({e})");
        }
    }
    match hugetlb::pool(page) {
        Ok(p) => {
            let _ = write!(
                value,
                "; {label} pool: {} free, {} available",
                p.free,
                p.available()
            );
            details["pool_free"] = json!(p.free);
            details["pool_available"] = json!(p.available());
            if p.available() == 0 {
                verdict = Level::Warn;
                let wanted = need.filter(|(sz, _)| *sz == page).map(|(_, n)| n);
                remedies.push(format!(
                    "no {label} page is available to files on it: {}",
                    reserve_remedy(page, wanted)
                ));
            }
        }
        Err(e) => {
            let _ = write!(value, "; {label} pool cannot be read ({e})");
            verdict = Level::Warn;
            remedies.push("check that /sys/kernel/mm/hugepages is readable".into());
        }
    }
    Finding::new("hugetlbfs", item, value)
        .level(verdict)
        .remedy(remedies.join("; "))
        .details(details)
}

// ---------------------------------------------------------------- /dev/shm

/// `statvfs(path)`: `(size, free)` in bytes; size 0 means no limit.
#[allow(clippy::unnecessary_cast)] // the field widths differ between targets
fn statvfs(path: &Path) -> io::Result<(u64, u64)> {
    let c = std::ffi::CString::new(path.as_os_str().as_bytes())
        .map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
    let mut st = std::mem::MaybeUninit::<libc::statvfs>::zeroed();
    // SAFETY: `c` is a NUL-terminated path and `st` a writable `struct
    // statvfs`, both live for the call, which only writes into `st`.
    let rc = unsafe { libc::statvfs(c.as_ptr(), st.as_mut_ptr()) };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: all-zero bytes are a valid `statvfs` (plain integers), and the
    // call succeeded, so the kernel filled it in.
    let st = unsafe { st.assume_init() };
    let unit = if st.f_frsize > 0 {
        st.f_frsize as u64
    } else {
        st.f_bsize as u64
    };
    Ok((
        (st.f_blocks as u64).saturating_mul(unit),
        (st.f_bavail as u64).saturating_mul(unit),
    ))
}

fn shm() -> Vec<Finding> {
    let dir = Path::new(SHM);
    let grow = "docker run --shm-size=<N>g (or --ipc=host); Kubernetes: mount an emptyDir \
                {medium: Memory, sizeLimit: <N>Gi} at /dev/shm";
    let f = Finding::new("shm", SHM, "");
    let finding = match (filesystem_kind(dir), statvfs(dir)) {
        (Err(e), _) | (_, Err(e)) => Finding {
            value: format!("cannot be examined: {e}"),
            ..f
        }
        .warn(format!(
            "shared pools keep their control files in /dev/shm: mount a tmpfs there (`mount -t \
             tmpfs -o size=<N>G tmpfs /dev/shm`), or {grow}"
        )),
        (Ok(FsKind::Tmpfs), Ok((0, _))) => Finding {
            value: "tmpfs without a size limit (bounded by memory)".into(),
            ..f
        }
        .details(json!({ "size": 0, "free": null })),
        (Ok(FsKind::Tmpfs), Ok((size, free))) => {
            let f = Finding {
                value: format!("tmpfs, {}, {} free", format_bytes(size), format_bytes(free)),
                ..f
            }
            .details(json!({ "size": size, "free": free }));
            if size < GIB {
                f.warn(format!(
                    "smaller than 1 GiB (Docker's default is 64 MiB), too small for a \
                     shared-memory pool: {grow}"
                ))
            } else {
                f
            }
        }
        (Ok(kind), Ok((size, free))) => Finding {
            value: format!(
                "not tmpfs ({kind:?}), {}, {} free",
                format_bytes(size),
                format_bytes(free)
            ),
            ..f
        }
        .warn(format!(
            "shared-memory pools need a tmpfs: `mount -t tmpfs -o size=<N>G tmpfs /dev/shm`, \
             or {grow}"
        )),
    };
    vec![finding]
}

// ---------------------------------------------------------------- cgroup

fn cgroup() -> Vec<Finding> {
    let mut out = vec![match capacity::cgroup_memory() {
        Some(cg) => Finding::new(
            "cgroup",
            "memory limit",
            format!(
                "{}, {} usable ({})",
                format_bytes(cg.limit),
                format_bytes(cg.free),
                cg.path.display()
            ),
        )
        .info(
            "it bounds anonymous and shared-memory pools: raise it (Kubernetes \
             resources.limits.memory, docker --memory) or use huge pages reserved outside it",
        )
        .details(json!({"path": cg.path, "limit": cg.limit, "usable": cg.free})),
        None => Finding::new("cgroup", "memory limit", "none (no finite memory.max)"),
    }];
    let sizes = hugetlb::supported_sizes();
    let limits: Vec<(u64, hugetlb::HugetlbCgroup)> = sizes
        .iter()
        .filter_map(|&s| hugetlb::cgroup_limit(s).map(|c| (s, c)))
        .collect();
    if limits.is_empty() {
        let names: Vec<String> = sizes.iter().map(|&s| format_bytes(s)).collect();
        out.push(Finding::new(
            "cgroup",
            "hugetlb limits",
            if names.is_empty() {
                "none".to_string()
            } else {
                format!("none for {}", names.join(", "))
            },
        ));
    }
    for (size, c) in limits {
        let label = format_bytes(size);
        let kind = if c.is_reservation_limit() {
            "reservation limit, enforced at mmap"
        } else {
            "fault limit, enforced as SIGBUS on touch"
        };
        out.push(
            Finding::new(
                "cgroup",
                format!("hugetlb {label} limit"),
                format!(
                    "{}, {} used ({kind}; {})",
                    format_bytes(c.limit),
                    format_bytes(c.usage),
                    c.path.display()
                ),
            )
            .info(format!(
                "it bounds {label} hugetlb pools: raise it (Kubernetes \
                 resources.limits.hugepages-{})",
                hugetlb::k8s_size_name(size)
            ))
            .details(json!({
                "page_size": size,
                "path": c.path,
                "limit": c.limit,
                "usage": c.usage,
            })),
        );
    }
    out
}

// ---------------------------------------------------------------- memlock

fn limit_text(l: Option<u64>) -> String {
    l.map_or("unlimited".to_string(), format_bytes)
}

fn bound_text(b: &memlock::MemlockBound) -> String {
    match b.limit {
        Some(l) => format!("{} ({})", format_bytes(l), b.source),
        None => format!("none ({})", b.source),
    }
}

fn memlock_findings() -> Vec<Finding> {
    let st = memlock::state();
    let rl = Finding::new(
        "memlock",
        "RLIMIT_MEMLOCK",
        format!("soft {}, hard {}", limit_text(st.soft), limit_text(st.hard)),
    )
    .details(json!({"soft": st.soft, "hard": st.hard}));
    let rl = match st.hard {
        Some(hard) if !st.cap_ipc_lock && hard < st.ram / 2 => rl.warn(format!(
            "pinning (cuda, mlock) and RDMA registration are bounded to {} without \
             CAP_IPC_LOCK; {}",
            format_bytes(hard),
            memlock::REMEDY
        )),
        _ => rl,
    };
    let cap = Finding::new(
        "memlock",
        "CAP_IPC_LOCK",
        if st.cap_ipc_lock {
            "yes: RLIMIT_MEMLOCK does not bind this process"
        } else {
            "no"
        },
    );
    let cap = if st.cap_ipc_lock || st.hard.is_none() {
        cap
    } else {
        cap.info(
            "grant it to lift the memlock bound: docker --cap-add IPC_LOCK; Kubernetes \
             securityContext.capabilities.add: [\"IPC_LOCK\"]; systemd \
             AmbientCapabilities=CAP_IPC_LOCK",
        )
    };
    let ordinary = memlock::bound(&st, false);
    let huge = memlock::bound(&st, true);
    let value = if ordinary == huge {
        format!("{} for every page size", bound_text(&ordinary))
    } else {
        format!(
            "ordinary pages {}; huge pages {}",
            bound_text(&ordinary),
            bound_text(&huge)
        )
    };
    let bound = Finding::new("memlock", "pin bound", value)
        .details(json!({"ordinary": ordinary, "huge": huge, "cap_ipc_lock": st.cap_ipc_lock}));
    vec![rl, cap, bound]
}

// ---------------------------------------------------------------- thp

/// The `[selected]` word of a THP setting, or the whole text.
fn selected(text: &str) -> String {
    text.split_whitespace()
        .find_map(|w| w.strip_prefix('[').and_then(|w| w.strip_suffix(']')))
        .unwrap_or(text.trim())
        .to_string()
}

fn thp() -> Vec<Finding> {
    let dir = Path::new(THP_DIR);
    if !dir.exists() {
        return vec![
            Finding::new("thp", "transparent huge pages", "not in this kernel").info(
                "anonymous pools with thp = true get 4 KiB pages; use the hugetlbfs backing for \
                 huge pages",
            ),
        ];
    }
    let read = |name: &str| std::fs::read_to_string(dir.join(name));
    let mut out = Vec::new();
    for (name, wanted) in [("enabled", "always or madvise"), ("defrag", "")] {
        let item = format!("THP {name}");
        let path = dir.join(name);
        out.push(match read(name) {
            Ok(text) => {
                let s = selected(&text);
                let f = Finding::new("thp", item, s.clone()).details(json!({ "value": s }));
                match (name, s.as_str()) {
                    ("enabled", "never") => f.info(format!(
                        "anonymous pools with thp = true get 4 KiB pages; `echo madvise > {}` \
                         ({wanted})",
                        path.display()
                    )),
                    ("defrag", "never") => f.info(format!(
                        "THP faults never compact memory, so a thp pool may get few huge pages; \
                         `echo madvise > {}`",
                        path.display()
                    )),
                    _ => f,
                }
            }
            Err(e) => Finding::new("thp", item, format!("cannot read {}: {e}", path.display()))
                .info("check that /sys is mounted and readable"),
        });
    }
    out.push(match read("hpage_pmd_size") {
        Ok(text) => match text.trim().parse::<u64>() {
            Ok(b) => Finding::new("thp", "THP page size", format_bytes(b))
                .details(json!({ "hpage_pmd_size": b })),
            Err(_) => Finding::new(
                "thp",
                "THP page size",
                format!("unreadable hpage_pmd_size `{}`", text.trim()),
            )
            .info("anonymous pools with thp = true assume 2 MiB"),
        },
        Err(e) => Finding::new(
            "thp",
            "THP page size",
            format!("cannot read hpage_pmd_size: {e}"),
        )
        .info("anonymous pools with thp = true assume 2 MiB"),
    });
    out
}

// ---------------------------------------------------------------- kernel

fn kernel() -> Vec<Finding> {
    let release = match std::fs::read_to_string("/proc/sys/kernel/osrelease") {
        Ok(r) => Finding::new("kernel", "release", format!("Linux {}", r.trim())),
        Err(e) => {
            Finding::new("kernel", "release", format!("cannot be read: {e}")).info("mount /proc")
        }
    };
    let populate = if pool_core::sys::populate_write_supported() {
        Finding::new(
            "kernel",
            "MADV_POPULATE_WRITE",
            "supported: prefault = auto uses it",
        )
    } else {
        Finding::new(
            "kernel",
            "MADV_POPULATE_WRITE",
            "not supported (Linux before 5.14): prefault falls back to touching each page",
        )
        .warn(
            "Linux 5.14 or later prefaults faster; until then prefault = touch works, more slowly",
        )
    };
    let nodes = numa::online_nodes();
    let numa = Finding::new(
        "kernel",
        "NUMA nodes",
        format!(
            "{} ({} online)",
            numa::format_node_list(&nodes),
            nodes.len()
        ),
    )
    .details(json!({ "nodes": nodes }));
    vec![release, populate, numa]
}

// ---------------------------------------------------------------- cuda

/// Device names, compact: `8 × NVIDIA H200` when they are all the same.
fn device_list(names: &[String]) -> String {
    match names.first() {
        Some(first) if names.len() > 1 && names.iter().all(|n| n == first) => {
            format!("{} × {first}", names.len())
        }
        _ => names
            .iter()
            .enumerate()
            .map(|(i, n)| format!("{i}: {n}"))
            .collect::<Vec<_>>()
            .join(", "),
    }
}

const GPU_VISIBLE: &str = "check `nvidia-smi`; in a container: the NVIDIA container toolkit and \
                           `--gpus all` (Kubernetes: resources.limits nvidia.com/gpu)";

fn cuda_findings(probe: &Result<pinner_cuda::DriverInfo, Error>) -> Vec<Finding> {
    let f = Finding::new("cuda", "driver", "");
    vec![match probe {
        Ok(info) => {
            let version = info
                .version_text()
                .map_or("CUDA driver (version unknown)".to_string(), |v| {
                    format!("CUDA {v}")
                });
            let details = json!({"version": info.version, "devices": info.devices});
            match &info.no_device {
                _ if !info.devices.is_empty() => Finding {
                    value: format!(
                        "{version}, {} device{}: {}",
                        info.devices.len(),
                        if info.devices.len() == 1 { "" } else { "s" },
                        device_list(&info.devices)
                    ),
                    ..f
                }
                .details(details),
                Some(why) => Finding {
                    value: format!("{version}, no device ({why})"),
                    ..f
                }
                .warn(GPU_VISIBLE)
                .details(details),
                None => Finding {
                    value: format!("{version}, no device"),
                    ..f
                }
                .warn(GPU_VISIBLE)
                .details(details),
            }
        }
        Err(Error::NotAvailable { reason, .. }) => {
            let (what, todo) = split_reason(reason);
            Finding {
                value: format!("absent: {what}"),
                ..f
            }
            .info(todo.unwrap_or_else(|| {
                "pinning with cuda needs the NVIDIA driver (libcuda.so.1)".to_string()
            }))
        }
        Err(e) => Finding {
            value: format!("cannot be queried: {e}"),
            ..f
        }
        .warn(GPU_VISIBLE),
    }]
}

// ---------------------------------------------------------------- rdma

const RDMA_DEVICES: &str = "check `ibv_devices` or `rdma link`, that the NIC's RDMA driver (e.g. \
                            mlx5_ib) and ibverbs-providers are installed, and in a container that \
                            /dev/infiniband is passed through";

fn rdma_findings(
    probe: &Result<Vec<registrar_rdma::DeviceProbe>, Error>,
    options: &registrar_rdma::RdmaOptions,
) -> Vec<Finding> {
    let library = options.library();
    match probe {
        Ok(devices) if devices.is_empty() => vec![
            Finding::new(
                "rdma",
                "devices",
                format!("{library} loaded, no RDMA device"),
            )
            .info(RDMA_DEVICES),
        ],
        Ok(devices) => devices
            .iter()
            .map(|d| {
                let f = Finding::new("rdma", d.name.clone(), "")
                    .details(json!({"max_mr_size": d.max_mr_size, "error": d.error}));
                match (&d.error, d.max_mr_size) {
                    (None, Some(m)) => Finding {
                        value: format!("max_mr_size {}", format_bytes(m)),
                        ..f
                    },
                    (err, max) => Finding {
                        value: format!(
                            "max_mr_size {}: {}",
                            max.map_or("unknown".to_string(), format_bytes),
                            err.as_deref().unwrap_or("cannot be queried")
                        ),
                        ..f
                    }
                    .warn(
                        "check access to /dev/infiniband/uverbs* and that the NIC's RDMA driver is \
                         loaded (dmesg)",
                    ),
                }
            })
            .collect(),
        Err(Error::NotAvailable { reason, .. }) => {
            let (what, todo) = split_reason(reason);
            vec![
                Finding::new("rdma", "libibverbs", format!("not available: {what}"))
                    .info(todo.unwrap_or_else(|| RDMA_DEVICES.to_string())),
            ]
        }
        Err(e) => vec![
            Finding::new("rdma", "libibverbs", format!("cannot list devices: {e}"))
                .warn(RDMA_DEVICES),
        ],
    }
}

// ---------------------------------------------------------------- plugins

fn plugin_kind<T: PluginRecord>(item: &str) -> Finding {
    match plugin::registry::<T>() {
        Ok(map) => {
            let names: Vec<&str> = map.keys().copied().collect();
            let details: Vec<Value> = map
                .values()
                .map(|r| json!({"name": r.name(), "origin": r.origin(), "summary": r.summary()}))
                .collect();
            let f = Finding::new(
                "plugins",
                item,
                if names.is_empty() {
                    "none".to_string()
                } else {
                    names.join(", ")
                },
            )
            .details(Value::Array(details));
            if names.is_empty() && T::KIND == "backing" {
                f.fail(
                    "no backing is linked: the binary must name the backing crates \
                     (`use backing_anon as _;`)",
                )
            } else {
                f
            }
        }
        Err(e) => Finding::new("plugins", item, e.to_string())
            .fail("every plan fails until one of the two plugins is renamed or unlinked"),
    }
}

fn plugins() -> Vec<Finding> {
    vec![
        plugin_kind::<BackingPlugin>("backings"),
        plugin_kind::<PinnerPlugin>("pinners"),
        plugin_kind::<RegistrarPlugin>("registrars"),
    ]
}

// ---------------------------------------------------------------- leftovers

/// Files that any lock is held on, as `(major, minor, inode)`, from
/// `/proc/locks` (flock, POSIX and OFD locks alike).
fn locked_files() -> io::Result<HashSet<(u32, u32, u64)>> {
    let text = std::fs::read_to_string("/proc/locks")?;
    Ok(text
        .lines()
        .filter_map(|line| {
            line.split_whitespace().find_map(|w| {
                let mut p = w.split(':');
                let (maj, min, ino) = (p.next()?, p.next()?, p.next()?);
                if p.next().is_some() {
                    return None;
                }
                Some((
                    u32::from_str_radix(maj, 16).ok()?,
                    u32::from_str_radix(min, 16).ok()?,
                    ino.parse().ok()?,
                ))
            })
        })
        .collect())
}

/// One pool file and whether a live process holds it.
struct PoolFile {
    path: PathBuf,
    bytes: u64,
    live: bool,
}

fn scan(dirs: &[PathBuf], locks: &HashSet<(u32, u32, u64)>) -> (Vec<PoolFile>, Vec<String>) {
    let held = |p: &Path| {
        std::fs::symlink_metadata(p)
            .is_ok_and(|m| locks.contains(&(libc::major(m.dev()), libc::minor(m.dev()), m.ino())))
    };
    let mut files = Vec::new();
    let mut unreadable = Vec::new();
    for dir in dirs {
        let Ok(entries) = std::fs::read_dir(dir) else {
            unreadable.push(dir.display().to_string());
            continue;
        };
        for e in entries.flatten() {
            let Ok(name) = e.file_name().into_string() else {
                continue;
            };
            // `file_type` does not follow symbolic links: gc never touches them.
            if !e.file_type().is_ok_and(|t| t.is_file()) || !pool_core::gc::is_pool_file(&name) {
                continue;
            }
            let path = e.path();
            let Ok(meta) = std::fs::symlink_metadata(&path) else {
                continue;
            };
            let ctl_live = !name.ends_with(".ctl")
                && pool_core::gc::pool_name(&name).is_some_and(|n| {
                    [dir.as_path(), Path::new(shared::DEFAULT_CONTROL_DIR)]
                        .iter()
                        .any(|d| held(&shared::ctl_path(d, n)))
                });
            files.push(PoolFile {
                live: held(&path) || ctl_live,
                bytes: meta.len(),
                path,
            });
        }
    }
    files.sort_by(|a, b| a.path.cmp(&b.path));
    (files, unreadable)
}

/// Stale files listed one per line, at most this many.
const LISTED_STALE: usize = 5;

fn leftovers(pool_dir: Option<&Path>) -> Vec<Finding> {
    let mut dirs = pool_core::gc::default_dirs();
    if let Some(d) = pool_dir
        && !dirs.iter().any(|x| x == d)
    {
        dirs.push(d.to_path_buf());
    }
    let dir_list = dirs
        .iter()
        .map(|d| d.display().to_string())
        .collect::<Vec<_>>()
        .join(", ");
    let locks = match locked_files() {
        Ok(l) => l,
        Err(e) => {
            return vec![
                Finding::new(
                    "leftovers",
                    "pool files",
                    format!("cannot read /proc/locks ({e}): which files are stale is unknown"),
                )
                .info(format!(
                    "`hostpool gc` checks with flock and removes the stale ones in {dir_list}"
                )),
            ];
        }
    };
    let (files, unreadable) = scan(&dirs, &locks);
    let mut out = Vec::new();
    for d in &unreadable {
        if Path::new(d).exists() {
            out.push(
                Finding::new("leftovers", d.clone(), "cannot be read")
                    .info(format!("check the permissions of {d}")),
            );
        }
    }
    let (live, stale): (Vec<&PoolFile>, Vec<&PoolFile>) = files.iter().partition(|f| f.live);
    let live_bytes: u64 = live.iter().map(|f| f.bytes).sum();
    let stale_bytes: u64 = stale.iter().map(|f| f.bytes).sum();
    let live_note = if live.is_empty() {
        String::new()
    } else {
        format!(
            "; {} file(s) of live pools ({})",
            live.len(),
            format_bytes(live_bytes)
        )
    };
    if stale.is_empty() {
        out.push(
            Finding::new(
                "leftovers",
                "pool files",
                format!("no stale file in {dir_list}{live_note}"),
            )
            .details(json!({
                "dirs": dirs,
                "stale": [],
                "live": live.iter().map(|f| &f.path).collect::<Vec<_>>(),
            })),
        );
        return out;
    }
    out.push(
        Finding::new(
            "leftovers",
            "pool files",
            format!(
                "{} stale file(s), {}, held by no process{live_note}",
                stale.len(),
                format_bytes(stale_bytes)
            ),
        )
        .warn("`hostpool gc` removes them (what crashed runs left; live pools are never touched)")
        .details(json!({
            "dirs": dirs,
            "stale": stale
                .iter()
                .map(|f| json!({"path": f.path, "bytes": f.bytes}))
                .collect::<Vec<_>>(),
            "live": live.iter().map(|f| &f.path).collect::<Vec<_>>(),
        })),
    );
    for f in stale.iter().take(LISTED_STALE) {
        out.push(
            Finding::new(
                "leftovers",
                f.path.display().to_string(),
                format!("{}, stale", format_bytes(f.bytes)),
            )
            .warn(format!(
                "`hostpool gc --dir {}`",
                f.path.parent().unwrap_or(Path::new("/")).display()
            )),
        );
    }
    if stale.len() > LISTED_STALE {
        out.push(
            Finding::new(
                "leftovers",
                "…",
                format!("{} more stale file(s)", stale.len() - LISTED_STALE),
            )
            .warn("`hostpool gc`"),
        );
    }
    out
}

// ---------------------------------------------------------------- pool

fn check_finding(c: &CapacityCheck) -> Finding {
    let f = Finding::new(
        "pool",
        c.resource.clone(),
        format!(
            "need {}, free {} ({})",
            format_bytes(c.need),
            c.free.map_or("unknown".to_string(), format_bytes),
            c.source
        ),
    )
    .details(serde_json::to_value(c).unwrap_or(Value::Null));
    match c.verdict {
        Verdict::Fits => f,
        Verdict::Short => f.fail(c.remedy.clone()),
        Verdict::Unknown => f.warn(format!("the figure could not be read; {}", c.remedy)),
    }
}

fn pool_findings(
    plan: &PoolPlan,
    report: &PlanReport,
    cuda: &Result<pinner_cuda::DriverInfo, Error>,
    rdma: &Result<Vec<registrar_rdma::DeviceProbe>, Error>,
    rdma_options: &registrar_rdma::RdmaOptions,
) -> Vec<Finding> {
    let config = &plan.config;
    let mut out = vec![
        Finding::new(
            "pool",
            "plan",
            format!(
                "{} pool of {} ({} mapped in {} pages), prefault {} with {} thread(s)",
                report.backing,
                format_bytes(report.logical_bytes),
                format_bytes(report.mapped_bytes),
                format_bytes(report.page_size),
                report.prefault.method,
                report.prefault.threads
            ),
        )
        .details(json!({"explain": report.explain})),
    ];
    out.extend(report.capacity.iter().map(check_finding));

    let hugetlb = pool_is_hugetlb(plan, report);
    let state = memlock::state();
    let pin_bytes = if config.pin.scope == PinScope::Shard && config.sharing.is_some() {
        report.prefault.bytes
    } else {
        report.mapped_bytes
    };
    let bound = memlock::bound(&state, hugetlb);
    let within = |bytes: u64| bound.limit.is_none_or(|l| bytes <= l);

    if config.pin.is_on() {
        let kind = config.pin.kind.as_str();
        let required = config.pin.required;
        let short = |f: Finding, remedy: String| {
            if required {
                f.fail(remedy)
            } else {
                f.warn(format!("the pin would be skipped (best effort): {remedy}"))
            }
        };
        let item = format!("pin {kind}");
        if config.pin.memlock_bound == MemlockPolicy::Ignore {
            out.push(Finding::new(
                "pool",
                format!("{item} memlock"),
                "not checked (memlock_bound = ignore)",
            ));
        } else if within(pin_bytes) {
            out.push(Finding::new(
                "pool",
                format!("{item} memlock"),
                format!(
                    "{} within the bound: {}",
                    format_bytes(pin_bytes),
                    bound_text(&bound)
                ),
            ));
        } else {
            out.push(short(
                Finding::new(
                    "pool",
                    format!("{item} memlock"),
                    format!(
                        "{} over the bound: {}",
                        format_bytes(pin_bytes),
                        bound_text(&bound)
                    ),
                ),
                memlock::REMEDY.to_string(),
            ));
        }
        if kind == pinner_cuda::NAME {
            let device =
                pinner_cuda::CudaOptions::from_table(config.plugin_table(pinner_cuda::NAME))
                    .map_or(0, |o| o.device);
            let f = Finding::new("pool", format!("{item} device"), "");
            out.push(match cuda {
                Ok(info) => match info.devices.get(device as usize) {
                    Some(name) => Finding {
                        value: format!("device {device}: {name}"),
                        ..f
                    },
                    None => short(
                        Finding {
                            value: format!(
                                "device {device} does not exist ({} device(s))",
                                info.devices.len()
                            ),
                            ..f
                        },
                        format!("set [cuda] device, or make the GPU visible: {GPU_VISIBLE}"),
                    ),
                },
                Err(e) => short(
                    Finding {
                        value: "no usable CUDA driver".into(),
                        ..f
                    },
                    match e {
                        Error::NotAvailable { reason, .. } => reason.clone(),
                        other => other.to_string(),
                    },
                ),
            });
        }
    }

    for name in &config.register {
        let item = format!("register {name}");
        if name != registrar_rdma::NAME {
            out.push(
                Finding::new(
                    "pool",
                    item,
                    "not checked by doctor (an out-of-tree registrar)",
                )
                .info("`hostpool alloc` with this pool tells whether it registers"),
            );
            continue;
        }
        let f = Finding::new("pool", item, "");
        out.push(match rdma {
            Err(e) => Finding {
                value: "registration would fail".into(),
                ..f
            }
            .fail(e.to_string()),
            Ok(devices) => {
                let selected: Vec<&registrar_rdma::DeviceProbe> = match &rdma_options.devices {
                    Some(wanted) => devices
                        .iter()
                        .filter(|d| wanted.contains(&d.name))
                        .collect(),
                    None => devices.iter().collect(),
                };
                let missing: Vec<&String> = rdma_options
                    .devices
                    .iter()
                    .flatten()
                    .filter(|w| !devices.iter().any(|d| &d.name == *w))
                    .collect();
                let copies = u64::try_from(selected.len()).unwrap_or(u64::MAX);
                let need = report.mapped_bytes.saturating_mul(copies);
                if devices.is_empty() {
                    Finding {
                        value: "no RDMA device".into(),
                        ..f
                    }
                    .fail(RDMA_DEVICES)
                } else if !missing.is_empty() {
                    Finding {
                        value: format!(
                            "no device {}",
                            missing
                                .iter()
                                .map(|s| s.as_str())
                                .collect::<Vec<_>>()
                                .join(", ")
                        ),
                        ..f
                    }
                    .fail(format!(
                        "set [rdma] devices to some of: {}",
                        devices
                            .iter()
                            .map(|d| d.name.as_str())
                            .collect::<Vec<_>>()
                            .join(", ")
                    ))
                } else if config.pin.memlock_bound == MemlockPolicy::Check && !within(need) {
                    Finding {
                        value: format!(
                            "{} on {} device(s) over the memlock bound: {}",
                            format_bytes(need),
                            selected.len(),
                            bound_text(&bound)
                        ),
                        ..f
                    }
                    .fail(format!(
                        "ibv_reg_mr counts every registration against RLIMIT_MEMLOCK unless the \
                         process has CAP_IPC_LOCK; {}",
                        memlock::REMEDY
                    ))
                } else {
                    Finding {
                        value: selected
                            .iter()
                            .map(|d| {
                                format!(
                                    "{} (regions of at most {})",
                                    d.name,
                                    d.max_mr_size.map_or("?".to_string(), format_bytes)
                                )
                            })
                            .collect::<Vec<_>>()
                            .join(", "),
                        ..f
                    }
                }
            }
        });
    }

    let first_short = report.capacity.iter().find(|c| c.verdict == Verdict::Short);
    let failing: Vec<&str> = out
        .iter()
        .filter(|f| f.verdict == Level::Fail)
        .map(|f| f.item.as_str())
        .collect();
    out.push(match first_short {
        None if failing.is_empty() => Finding::new("pool", "verdict", "fits"),
        None => Finding::new(
            "pool",
            "verdict",
            format!("fits, but would fail at: {}", failing.join(", ")),
        )
        .fail("see the failing lines above"),
        Some(c) => Finding::new(
            "pool",
            "verdict",
            format!(
                "DOES NOT FIT: {} has {} free, the pool needs {}",
                c.resource,
                c.free.map_or("unknown".to_string(), format_bytes),
                format_bytes(c.need)
            ),
        )
        .fail("make room as the failing check above says, or ask for a smaller --size"),
    });
    out
}

// ---------------------------------------------------------------- output

/// Widest a column gets before a long cell just pushes the rest right.
const MAX_ITEM: usize = 30;

fn human(findings: &[Finding], verdict: Level) -> String {
    let area_w = findings
        .iter()
        .map(|f| f.area.chars().count())
        .max()
        .unwrap_or(4)
        .max(4);
    let item_w = findings
        .iter()
        .map(|f| f.item.chars().count())
        .filter(|&w| w <= MAX_ITEM)
        .max()
        .unwrap_or(4)
        .max(4);
    let mut s = format!(
        "{:<7} {:<area_w$}  {:<item_w$}  VALUE\n",
        "VERDICT", "AREA", "ITEM"
    );
    for f in findings {
        let _ = writeln!(
            s,
            "{:<7} {:<area_w$}  {:<item_w$}  {}",
            f.verdict.name(),
            f.area,
            f.item,
            f.value
        );
        if let (Some(r), false) = (&f.remedy, f.verdict == Level::Ok) {
            let _ = writeln!(s, "{:<7} {:<area_w$}  ↳ {r}", "", "");
        }
    }
    let count = |l: Level| findings.iter().filter(|f| f.verdict == l).count();
    let _ = write!(
        s,
        "verdict: {} ({} fail, {} warn, {} info, {} ok)",
        verdict.name(),
        count(Level::Fail),
        count(Level::Warn),
        count(Level::Info),
        count(Level::Ok)
    );
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mount_fields_are_unescaped() {
        assert_eq!(
            unescape("/mnt/huge\\040pages"),
            PathBuf::from("/mnt/huge pages")
        );
        assert_eq!(unescape("/a\\134b"), PathBuf::from("/a\\b"));
        assert_eq!(unescape("/odd\\04"), PathBuf::from("/odd\\04"));
        assert_eq!(unescape("\\"), PathBuf::from("\\"));
    }

    #[test]
    fn thp_settings_read_the_bracketed_word() {
        assert_eq!(selected("always [madvise] never\n"), "madvise");
        assert_eq!(selected("weird\n"), "weird");
    }

    #[test]
    fn the_overall_verdict_ignores_info() {
        let f = |l| Finding::new("memory", "x", "y").level(l);
        assert_eq!(overall(&[f(Level::Ok), f(Level::Info)]), Level::Ok);
        assert_eq!(overall(&[f(Level::Warn), f(Level::Info)]), Level::Warn);
        assert_eq!(overall(&[f(Level::Warn), f(Level::Fail)]), Level::Fail);
    }

    #[test]
    fn device_lists_are_compact() {
        let same = vec!["H200".to_string(); 8];
        assert_eq!(device_list(&same), "8 × H200");
        assert_eq!(device_list(&["A".into(), "B".into()]), "0: A, 1: B");
    }

    #[test]
    fn proc_locks_lines_parse() {
        // The real file of this process's namespace parses without error.
        assert!(locked_files().is_ok());
    }
}
