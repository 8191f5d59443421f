//! `cgroup`: the memory limit (`memory.max`) and the hugetlb limits of this
//! process's cgroup.

use pool_core::layout::format_bytes;
use pool_core::{capacity, hugetlb};
use serde_json::json;

use super::Finding;

/// The cgroup's `memory.max` and its hugetlb limits.
pub(super) fn findings() -> Vec<Finding> {
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
