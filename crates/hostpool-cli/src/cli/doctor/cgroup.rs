//! `cgroup`: the tightest memory limit (`memory.max`, v1's
//! `memory.limit_in_bytes`) of this process's cgroup and its ancestors, from
//! the one cgroup walk (the hugetlb backing reports its hugetlb limits).

use pool_core::format_bytes;
use pool_core::host::capacity;
use serde_json::json;

use super::Finding;

/// The cgroup's `memory.max`.
pub(super) fn findings() -> Vec<Finding> {
    vec![match capacity::cgroup_memory() {
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
    }]
}
