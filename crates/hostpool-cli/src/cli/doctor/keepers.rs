//! `keepers`: the kept pools this network namespace serves (`hostpool
//! keep`), each asked for its status: size, page size, backing, who leases
//! it, and which cgroup the keeper's memory is charged to (the pool's pages
//! are charged once, to the group that faulted them: the keeper's, never its
//! engines'). A keeper socket that does not answer is a warning: its engines
//! cannot attach.

use hostpool::hostpool_handoff::lease::KeeperStatus;
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
            Ok((sent, pid)) => match KeeperStatus::from_value(&name, sent.clone(), Some(pid)) {
                Ok(s) => finding(name, &s, pid),
                Err(e) => Finding::new(
                    "keepers",
                    name,
                    "answers a status this hostpool cannot read",
                )
                .warn(format!(
                    "{}; run the keeper and this command from one hostpool version",
                    e.chain_message()
                ))
                .details(sent),
            },
            Err(e) => Finding::new("keepers", name, "does not answer").warn(format!(
                "{}; a process holds the keeper's socket but does not serve it: find it with `ss \
                 -xlp | grep hostpool-keep`",
                e.chain_message()
            )),
        })
        .collect()
}

/// The finding of the keeper of `name` (pid `pid` in this PID namespace),
/// whose status is `s`: its pool, who leases it, where it is charged; the
/// status, with the cgroup's figures, its details.
fn finding(name: String, s: &KeeperStatus, pid: u32) -> Finding {
    let lease = match (&s.lease, s.tenants.len()) {
        // Several engines at once: each, by engine and pid.
        (Some(_), n) if n > 1 => format!(
            "leased by {n} engines ({})",
            s.tenants
                .iter()
                .map(|t| {
                    let pid = t.pids.first().map_or_else(|| "?".into(), u32::to_string);
                    match t.engine.as_str() {
                        "" => format!("pid {pid}"),
                        engine => format!("`{engine}` pid {pid}"),
                    }
                })
                .collect::<Vec<_>>()
                .join(", ")
        ),
        (Some(l), _) => format!(
            "leased by pid {} since {}",
            l.pid.map_or_else(|| "?".into(), |p| p.to_string()),
            l.since
        ),
        (None, _) => s.state.to_string(),
    };
    let huge = s.page_size > pool_core::base_page_size() as u64;
    let mut details = serde_json::to_value(s).unwrap_or_default();
    let charged = charged_to(pid, huge, &mut details);
    let value = format!(
        "{} ({} pages, {}), content {}, generation {}, {lease}; keeper pid {}; {charged}",
        format_bytes(s.size),
        format_bytes(s.page_size),
        s.backing,
        s.content,
        s.generation,
        s.pid,
    );
    let f = Finding::new("keepers", name, value);
    match &s.broken {
        Some(why) => f.warn(format!(
            "{why}; restart the keeper (`kill -TERM {}`, then start it again)",
            s.pid
        )),
        None => f,
    }
    .details(details)
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
