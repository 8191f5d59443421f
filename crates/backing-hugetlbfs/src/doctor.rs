//! `hostpool doctor`'s findings for this backing: each huge page size's
//! pool (system-wide and per NUMA node), the hugetlbfs mounts with their
//! page size and `size=` limit, and the hugetlb cgroup limits.

use std::fmt::Write as _;

use pool_core::Error;
use pool_core::format_bytes;
use pool_core::host::fs::{FsKind, Mount, filesystem_kind};
use pool_core::host::numa;
use pool_core::plugin::{DoctorContext, Finding, Level};
use serde_json::{Value, json};

use crate::host as hugetlb;

const GIB: u64 = 1 << 30;

/// The hook in this backing's record.
pub(crate) fn findings(ctx: &DoctorContext<'_>) -> Vec<Finding> {
    let need = ctx.huge_need();
    let mut out = hugepages(need);
    out.extend(mounts(need));
    out.extend(cgroup_limits());
    out
}

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

/// Each huge page size's pool, and each NUMA node's when there are several;
/// `need` is the `(page size, pages)` of the hugetlb pool asked for, if any.
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
                let f = f
                    .with_value(format!(
                        "total {}, free {}, reserved {}, surplus {}, overcommit {} ({} available)",
                        p.total,
                        p.free,
                        p.resv,
                        p.surplus,
                        p.overcommit,
                        format_bytes(p.available_bytes())
                    ))
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
            Err(e) => f
                .with_value(format!("cannot be read: {e}"))
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

/// One finding per hugetlbfs mount; `need` as for [`hugepages`].
fn mounts(need: Option<(u64, u64)>) -> Vec<Finding> {
    let mounts = match pool_core::host::fs::mounts() {
        Ok(m) => m
            .into_iter()
            .filter(|m| m.fstype == "hugetlbfs")
            .collect::<Vec<_>>(),
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

/// A mount's page size, `size=` limit and pool.
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

/// The hugetlb limits of this process's cgroup.
fn cgroup_limits() -> Vec<Finding> {
    let mut out = Vec::new();
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
