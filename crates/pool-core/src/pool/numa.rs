//! `numa_node` resolved at plan time ([`NumaPlan`]): a number, the node of
//! the pool's GPU (`"gpu"`: its plugin's PCI address, then sysfs), or one
//! node per rank of a shared pool; and after prefault, where the pages are
//! ([`NumaReport`]), per shard of a shared pool.

use std::collections::BTreeMap;

use serde::Serialize;

use crate::config::{NumaNode, PoolConfig};
use crate::error::{Error, Result};
use crate::host::numa::{self, Placement};
use crate::layout::{Extent, format_bytes};
use crate::sys::Region;

/// The GPU `numa_node = "gpu"` placed the pool by.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct GpuPlace {
    /// The GPU plugin that found it (`cuda`).
    pub plugin: &'static str,
    /// The device's ordinal (`[cuda] device`).
    pub device: u32,
    /// The device's name, when the driver says.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// Its PCI address, as sysfs names it.
    pub pci_address: String,
    /// Its NUMA node; `None` where sysfs says -1 (no affinity).
    pub node: Option<u32>,
    /// The CPUs near it, in the kernel's list format, when sysfs says.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub local_cpus: Option<String>,
}

/// What `numa_node` asked for and the node this process binds (its shard,
/// in a shared pool): the plan's and the report's `numa` object.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct NumaPlan {
    /// As written: a number, `"gpu"` or a list.
    pub asked: NumaNode,
    /// The node this process binds; `None`: no binding (a GPU without
    /// affinity).
    pub node: Option<u32>,
    /// This process's rank, in a shared pool.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rank: Option<u32>,
    /// Every rank's node, where this process knows them (a number or a
    /// list; with `"gpu"` each rank finds its own).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub nodes: Option<Vec<u32>>,
    /// The GPU, for `"gpu"`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub gpu: Option<GpuPlace>,
    /// One line: what was asked and what it gives.
    pub reason: String,
}

impl NumaPlan {
    /// Whether the backing may check the node's own capacity for the whole
    /// pool: one node holds all of it (a private pool, or every rank on the
    /// same node).
    pub(crate) fn whole_pool_on(&self) -> Option<u32> {
        let node = self.node?;
        match (&self.rank, &self.nodes) {
            (None, _) => Some(node),
            (Some(_), Some(nodes)) if nodes.iter().all(|n| *n == node) => Some(node),
            _ => None,
        }
    }
}

/// Resolve `numa_node` for this process: check the nodes exist, a list
/// has one node per rank, and find the GPU's node for `"gpu"`.
///
/// # Errors
/// [`Error::Config`] (exit 2) for a node that is not online, a list in a
/// private pool or of another length than the world; for `"gpu"`, the GPU
/// plugin's errors (no driver: [`Error::NotAvailable`], exit 1) and
/// [`numa::pci_place`]'s.
pub(crate) fn resolve(config: &PoolConfig) -> Result<Option<NumaPlan>> {
    let Some(asked) = &config.numa_node else {
        return Ok(None);
    };
    let sharing = config.sharing.as_ref();
    let rank = sharing.map(|s| s.rank);
    let plan = match asked {
        NumaNode::Node(n) => {
            numa::check_node(*n)?;
            NumaPlan {
                asked: asked.clone(),
                node: Some(*n),
                rank,
                nodes: sharing.map(|s| vec![*n; s.world as usize]),
                gpu: None,
                reason: format!("numa_node = {n}"),
            }
        }
        NumaNode::PerRank(nodes) => {
            let Some(s) = sharing else {
                return Err(Error::config(format!(
                    "numa_node = {asked} gives one node per rank of a shared pool, and this pool \
                     is private; give one node (numa_node = {}) or \"gpu\"",
                    nodes.first().copied().unwrap_or(0)
                )));
            };
            if nodes.len() != s.world as usize {
                return Err(Error::config(format!(
                    "numa_node = {asked} lists {} node(s) for a shared pool of {} ranks; give \
                     exactly one per rank, in rank order",
                    nodes.len(),
                    s.world
                )));
            }
            for n in nodes {
                numa::check_node(*n)?;
            }
            let node = nodes[s.rank as usize];
            NumaPlan {
                asked: asked.clone(),
                node: Some(node),
                rank,
                nodes: Some(nodes.clone()),
                gpu: None,
                reason: format!("numa_node = {asked}: rank {} takes node {node}", s.rank),
            }
        }
        NumaNode::Gpu => {
            let plugin = crate::plugin::gpu_plugin(config)?;
            let device = (plugin.locate)(config.plugin_table(plugin.name))?;
            let place = numa::pci_place(&device.pci_address)?;
            if let Some(n) = place.node {
                numa::check_node(n).map_err(|_| {
                    Error::config(format!(
                        "numa_node = \"gpu\": sysfs puts {} device {} ({}) on NUMA node {n}, which \
                         is not online; give numa_node as a number",
                        plugin.name, device.ordinal, place.address
                    ))
                })?;
            }
            let what = format!(
                "{} device {}{} at {}",
                plugin.name,
                device.ordinal,
                device
                    .name
                    .as_deref()
                    .map(|n| format!(" ({n})"))
                    .unwrap_or_default(),
                place.address
            );
            let reason = match place.node {
                Some(n) => format!("numa_node = \"gpu\": {what} is on NUMA node {n}"),
                None => format!(
                    "numa_node = \"gpu\": {what} has no NUMA node (sysfs says -1: a host of one \
                     node, or a VM whose firmware gives no affinity): the pool is not bound"
                ),
            };
            NumaPlan {
                asked: asked.clone(),
                node: place.node,
                rank,
                nodes: None,
                gpu: Some(GpuPlace {
                    plugin: plugin.name,
                    device: device.ordinal,
                    name: device.name,
                    pci_address: place.address,
                    node: place.node,
                    local_cpus: place.local_cpus,
                }),
                reason,
            }
        }
    };
    Ok(Some(plan))
}

/// The plan's explain line.
pub(crate) fn explain(plan: &NumaPlan, own: Extent, shared: bool) -> String {
    match plan.node {
        None => plan.reason.clone(),
        Some(node) => {
            let what = if shared {
                format!(
                    "this rank's shard ({} at offset {})",
                    format_bytes(own.len),
                    format_bytes(own.offset)
                )
            } else {
                "the pool".to_string()
            };
            format!(
                "{}: bind {what} to NUMA node {node} with mbind(MPOL_BIND) before prefault (first \
                 touch decides placement), then check sampled pages with get_mempolicy",
                plan.reason
            )
        }
    }
}

/// Where the sampled pages of one shard of a shared pool are.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ShardPlacement {
    /// The rank whose shard it is.
    pub rank: u32,
    /// Its first byte in the pool.
    pub offset: u64,
    /// Its bytes.
    pub bytes: u64,
    /// The node it should be on, where this process knows it.
    pub node: Option<u32>,
    /// Pages sampled.
    pub sampled: usize,
    /// Sampled pages by the node that backs them (`"0"`, `"1"`), and
    /// `"not_present"` for those not in this process's memory.
    pub pages: BTreeMap<String, usize>,
}

/// The report's `numa` object: the plan, where this process's pages are
/// (its shard, in a shared pool: `sampled`, `on_node`, `elsewhere` with
/// offsets in the pool), and in a shared pool every shard.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct NumaReport {
    /// What was asked, the node bound and why.
    #[serde(flatten)]
    pub plan: NumaPlan,
    /// Whether this process bound its pages (`false`: no node, or the
    /// memory was leased from a keeper, which placed it).
    pub bound: bool,
    /// Pages of this process's range sampled.
    pub sampled: usize,
    /// How many of them are on `node`.
    pub on_node: usize,
    /// The others: offset in the pool and the node that backs it (-1: not
    /// in memory).
    pub elsewhere: Vec<(u64, i32)>,
    /// Every shard of a shared pool (empty for a private one).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub shards: Vec<ShardPlacement>,
}

impl NumaReport {
    /// The report of a pool placed by `plan` and not sampled (yet).
    pub(crate) fn unsampled(plan: &NumaPlan, bound: bool) -> NumaReport {
        NumaReport {
            plan: plan.clone(),
            bound,
            sampled: 0,
            on_node: 0,
            elsewhere: Vec::new(),
            shards: Vec::new(),
        }
    }
}

/// Sample this process's range (`own` of `region`) for `node`; offsets
/// come back relative to the pool.
pub(crate) fn sample_own(
    region: &Region<'_>,
    own: Extent,
    node: u32,
    samples: usize,
) -> Result<Placement> {
    let Some(sub) = region.sub(own).filter(|_| own.len > 0) else {
        return Ok(Placement {
            node,
            sampled: 0,
            on_node: 0,
            elsewhere: Vec::new(),
        });
    };
    let mut p = numa::verify(&sub, node, samples)?;
    for (off, _) in &mut p.elsewhere {
        *off += own.offset;
    }
    Ok(p)
}

/// Where every shard's sampled pages are, `samples` per shard (at least 2).
/// Pages of a peer's shard that are not in this process's page tables (a
/// hugetlbfs pool not attached whole) count as `not_present`.
pub(crate) fn sample_shards(
    region: &Region<'_>,
    shards: &[Extent],
    plan: &NumaPlan,
    own_rank: u32,
    samples: usize,
) -> Result<Vec<ShardPlacement>> {
    let mut out = Vec::with_capacity(shards.len());
    for (rank, shard) in (0u32..).zip(shards) {
        let expect = if rank == own_rank {
            plan.node
        } else {
            plan.nodes
                .as_ref()
                .and_then(|n| n.get(rank as usize).copied())
        };
        let mut pages = BTreeMap::new();
        let mut sampled = 0;
        if shard.len > 0
            && let Some(sub) = region.sub(*shard)
        {
            // Ask against the node expected, or this process's: `verify`
            // lets a refused query pass only on a host of that one node.
            let asked = expect.or(plan.node).unwrap_or(0);
            let p = numa::verify(&sub, asked, samples)?;
            sampled = p.sampled;
            if p.on_node > 0 {
                pages.insert(asked.to_string(), p.on_node);
            }
            for (_, n) in &p.elsewhere {
                let key = if *n == numa::NOT_PRESENT {
                    "not_present".to_string()
                } else {
                    n.to_string()
                };
                *pages.entry(key).or_default() += 1;
            }
        }
        out.push(ShardPlacement {
            rank,
            offset: shard.offset,
            bytes: shard.len,
            node: expect,
            sampled,
            pages,
        });
    }
    Ok(out)
}
