//! `keepers`: the kept pools this network namespace serves (`hostpool
//! keep`), each asked for its status: size, page size, backing, who leases
//! it, and which cgroup the keeper's memory is charged to (the pool's pages
//! are charged once, to the group that faulted them: the keeper's, never its
//! engines'). A keeper socket that does not answer is a warning: its engines
//! cannot attach.

use pool_core::format_bytes;
use pool_core::host::capacity::memory_controller;
use pool_core::host::cgroup::{self, ChargedGroup, Controller};
use serde_json::{Value, json};

use super::Finding;

/// One finding per kept pool; none when no keeper runs.
pub(super) fn findings() -> Vec<Finding> {
    hostpool_keeper::list()
        .into_iter()
        .map(|name| match hostpool_keeper::status_and_pid(&name) {
            Ok((mut s, pid)) => {
                let tenants = s["tenants"].as_array().cloned().unwrap_or_default();
                let lease = match (s["lease"].as_object(), tenants.len()) {
                    // Several engines at once: each, by engine and pid.
                    (Some(_), n) if n > 1 => format!(
                        "leased by {n} engines ({})",
                        tenants
                            .iter()
                            .map(|t| match t["engine"].as_str().unwrap_or("") {
                                "" => format!("pid {}", t["pids"][0]),
                                engine => format!("`{engine}` pid {}", t["pids"][0]),
                            })
                            .collect::<Vec<_>>()
                            .join(", ")
                    ),
                    (Some(l), _) => format!(
                        "leased by pid {} since {}",
                        l["pid"],
                        l["since"].as_str().unwrap_or("?")
                    ),
                    (None, _) => s["state"].as_str().unwrap_or("?").to_string(),
                };
                let huge = s["page_size"]
                    .as_u64()
                    .is_some_and(|p| p > pool_core::base_page_size() as u64);
                let charged = charged_to(pid, huge, &mut s);
                let value = format!(
                    "{} ({} pages, {}), content {}, generation {}, {lease}; keeper pid {}; \
                     {charged}",
                    format_bytes(s["size"].as_u64().unwrap_or(0)),
                    format_bytes(s["page_size"].as_u64().unwrap_or(0)),
                    s["backing"].as_str().unwrap_or("?"),
                    s["content"].as_str().unwrap_or("?"),
                    s["generation"],
                    s["pid"],
                );
                let f = Finding::new("keepers", name, value);
                match s["broken"].as_str() {
                    Some(why) => f.warn(format!(
                        "{why}; restart the keeper (`kill -TERM {}`, then start it again)",
                        s["pid"]
                    )),
                    None => f,
                }
                .details(s)
            }
            Err(e) => Finding::new("keepers", name, "does not answer").warn(format!(
                "{}; a process holds the keeper's socket but does not serve it: find it with `ss \
                 -xlp | grep hostpool-keep`",
                e.chain_message()
            )),
        })
        .collect()
}

/// Which cgroup the keeper (pid `pid` in this PID namespace; 0 when it is
/// not visible here) is charged to, in words; the figures go into the
/// status `s` (the finding's details): `cgroup` (the memory group, as
/// `/proc/PID/cgroup` writes it), `cgroup_dir`, `cgroup_version`,
/// `cgroup_memory_bytes` (what the group is charged now, the pool
/// included), and for a pool of huge pages (`huge`) `cgroup_hugetlb`, the
/// group the hugetlb controller charges them to. Each is null when unknown.
fn charged_to(pid: u32, huge: bool, s: &mut Value) -> String {
    let memory = (pid != 0)
        .then(|| cgroup::charged_group(pid, &memory_controller()))
        .flatten();
    let hugetlb = (pid != 0 && huge)
        .then(|| cgroup::charged_group(pid, &hugetlb()))
        .flatten();
    if let Some(obj) = s.as_object_mut() {
        let group = memory.as_ref();
        obj.insert("cgroup".into(), json!(group.map(|g| &g.path)));
        obj.insert(
            "cgroup_dir".into(),
            json!(group.and_then(|g| g.dir.as_ref())),
        );
        obj.insert("cgroup_version".into(), json!(group.map(|g| g.version)));
        obj.insert(
            "cgroup_memory_bytes".into(),
            json!(group.and_then(|g| g.usage)),
        );
        obj.insert(
            "cgroup_hugetlb".into(),
            json!(hugetlb.as_ref().map(|g| &g.path)),
        );
    }
    let said = |g: &ChargedGroup| match g.usage {
        Some(bytes) => format!(
            "cgroup {} (v{}, {} charged now)",
            g.path,
            g.version,
            format_bytes(bytes)
        ),
        None => format!("cgroup {} (v{})", g.path, g.version),
    };
    match (memory, hugetlb) {
        _ if pid == 0 => "its cgroup is not visible from this PID namespace".to_string(),
        (Some(m), Some(h)) => format!(
            "its huge pages are charged to hugetlb cgroup {} (v{}), its other memory to memory {}",
            h.path,
            h.version,
            said(&m)
        ),
        (Some(m), None) if huge => format!(
            "its huge pages are charged to no hugetlb cgroup (no hierarchy has the controller), \
             its other memory to memory {}",
            said(&m)
        ),
        (Some(m), None) => format!(
            "its memory, the pool's pages included, is charged to {}",
            said(&m)
        ),
        (None, Some(h)) => format!(
            "its huge pages are charged to hugetlb cgroup {} (v{}); no cgroup hierarchy has the \
             memory controller",
            h.path, h.version
        ),
        (None, None) => "no cgroup hierarchy has the memory controller".to_string(),
    }
}

/// The hugetlb controller, for its group alone (its files depend on the
/// page size; none are read).
fn hugetlb() -> Controller {
    Controller {
        name: "hugetlb".into(),
        v2: Vec::new(),
        v1: Vec::new(),
    }
}
