//! `memory`: `MemAvailable` and `MemTotal` from `/proc/meminfo`.

use pool_core::format_bytes;
use pool_core::host::capacity;
use serde_json::json;

use super::Finding;

/// The memory available to new pools.
pub(super) fn findings() -> Vec<Finding> {
    let total = capacity::meminfo("MemTotal");
    let f = Finding::new("memory", "MemAvailable", "");
    vec![match capacity::meminfo("MemAvailable") {
        Some(avail) => f
            .with_value(format!(
                "{} of {} (MemTotal); reserved huge pages are not counted in it",
                format_bytes(avail),
                total.map_or("unknown".into(), format_bytes)
            ))
            .details(json!({ "available": avail, "total": total })),
        None => f
            .with_value("cannot be read from /proc/meminfo")
            .warn("mount /proc (in a container: do not mask /proc/meminfo)"),
    }]
}
