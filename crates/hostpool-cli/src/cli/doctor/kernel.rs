//! `kernel`: the release, whether `MADV_POPULATE_WRITE` works, and the
//! online NUMA nodes.

use pool_core::host::numa;
use serde_json::json;

use super::Finding;

/// The release, `MADV_POPULATE_WRITE` support and the NUMA nodes.
pub(super) fn findings() -> Vec<Finding> {
    let release = match std::fs::read_to_string("/proc/sys/kernel/osrelease") {
        Ok(r) => Finding::new("kernel", "release", format!("Linux {}", r.trim())),
        Err(e) => {
            Finding::new("kernel", "release", format!("cannot be read: {e}")).info("mount /proc")
        }
    };
    let populate = if pool_core::populate_write_supported() {
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
