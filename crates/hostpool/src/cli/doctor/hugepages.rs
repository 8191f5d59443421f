//! `hugepages`: the pool of each huge page size, system-wide and per NUMA
//! node, and how to reserve more.

use pool_core::layout::format_bytes;
use pool_core::{Error, hugetlb, numa};
use serde_json::{Value, json};

use super::{Finding, GIB};

/// How to reserve `pages` (or some) huge pages of `page` bytes.
pub(super) fn reserve_remedy(page: u64, pages: Option<u64>) -> String {
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
pub(super) fn findings(need: Option<(u64, u64)>) -> Vec<Finding> {
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
