//! `hostpool doctor`'s findings for this pinner: the CUDA driver and its
//! devices, where each device sits (its PCI address, NUMA node and CPUs:
//! "GPU NUMA placement"), and, for a pool that pins with `cuda`, whether its
//! device exists and whether a numeric `numa_node` is that device's node.
//! The probe is `cuInit` and device queries; nothing is registered and no
//! context is created.

use pool_core::Error;
use pool_core::host::numa::{PciPlace, format_node_list, node_cpus, online_nodes, pci_place};
use pool_core::plugin::{DoctorContext, Finding, GpuDevice, split_reason};
use serde_json::{Value, json};

use crate::{CudaOptions, DriverInfo, NAME, list_gpus, locate_gpu, probe_devices};

/// The item of the GPU table (area `cuda`).
pub const PLACEMENT_ITEM: &str = "GPU NUMA placement";

/// The item of the check of a pool's numeric `numa_node` against its GPU
/// (area `pool`).
pub const POOL_NODE_ITEM: &str = "numa_node vs GPU";

/// The hook in this pinner's record.
pub(crate) fn findings(ctx: &DoctorContext<'_>) -> Vec<Finding> {
    let probe = crate::sys::guarded(probe_devices)
        .unwrap_or_else(|msg| Err(crate::probe::panicked("cuda driver probe", &msg)));
    let mut out = driver(&probe);
    if probe.as_ref().is_ok_and(|info| !info.devices.is_empty()) {
        out.extend(placement(&list_gpus()));
    }
    if ctx.pins_with(NAME) {
        out.push(pool_device(ctx, &probe));
        out.extend(pool_node(ctx));
    }
    out
}

/// One device of the GPU table: where sysfs puts it.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Row {
    gpu: GpuDevice,
    /// Its place, or why sysfs does not say.
    place: Result<PciPlace, String>,
    /// The CPUs near it: `local_cpulist`, else its node's `cpulist`.
    cpus: Option<String>,
}

impl Row {
    fn of(gpu: GpuDevice) -> Row {
        let place = pci_place(&gpu.pci_address).map_err(|e| e.to_string());
        let cpus = place.as_ref().ok().and_then(|p| {
            p.local_cpus
                .clone()
                .or_else(|| p.node.and_then(node_cpus).filter(|c| !c.is_empty()))
        });
        Row { gpu, place, cpus }
    }

    /// `GPU 1 0000:28:00.0: node 1, CPUs 4-7`.
    fn text(&self) -> String {
        let address = self
            .place
            .as_ref()
            .map_or(self.gpu.pci_address.as_str(), |p| p.address.as_str());
        let node = match &self.place {
            Ok(PciPlace { node: Some(n), .. }) => format!("node {n}"),
            Ok(PciPlace { node: None, .. }) => "no node (-1)".to_string(),
            Err(_) => "not in sysfs".to_string(),
        };
        let cpus = self
            .cpus
            .as_deref()
            .map(|c| format!(", CPUs {c}"))
            .unwrap_or_default();
        format!("GPU {} {address}: {node}{cpus}", self.gpu.ordinal)
    }

    fn details(&self) -> Value {
        let mut d = json!({
            "device": self.gpu.ordinal,
            "name": self.gpu.name,
            "pci_address": self
                .place
                .as_ref()
                .map_or(self.gpu.pci_address.as_str(), |p| p.address.as_str()),
            "node": self.place.as_ref().ok().and_then(|p| p.node),
            "cpus": self.cpus,
        });
        if let Err(e) = &self.place {
            d["error"] = json!(e);
        }
        d
    }
}

/// The GPU table: each device's PCI address, NUMA node and CPUs, one row
/// per device joined by `; ` (a finding's value is one line), e.g. `GPU 0
/// 0000:18:00.0: node 0, CPUs 0-3; GPU 1 0000:28:00.0: no node (-1)`.
/// `details`: `[{device, name, pci_address, node, cpus}]`, the address as
/// sysfs names it, `node` null where sysfs says -1, `cpus` the device's
/// `local_cpulist` or else its node's `cpulist` (null when neither is
/// known), plus `error` where sysfs does not know the device. Nothing when
/// there is no device or no driver to list them (the driver finding says
/// why).
fn placement(list: &pool_core::Result<Vec<GpuDevice>>) -> Option<Finding> {
    let f = Finding::new("cuda", PLACEMENT_ITEM, "");
    let gpus = match list {
        Ok(gpus) if gpus.is_empty() => return None,
        Ok(gpus) => gpus,
        Err(Error::NotAvailable { .. }) => return None,
        Err(e) => {
            return Some(f.with_value(format!("cannot be listed: {e}")).warn(
                "numa_node = \"gpu\" cannot find the GPU either; give numa_node as a number",
            ));
        }
    };
    let rows: Vec<Row> = gpus.iter().cloned().map(Row::of).collect();
    let value = rows.iter().map(Row::text).collect::<Vec<_>>().join("; ");
    let f = f
        .with_value(value)
        .details(Value::Array(rows.iter().map(Row::details).collect()));
    if let Some((row, e)) = rows
        .iter()
        .find_map(|r| r.place.as_ref().err().map(|e| (r, e)))
    {
        // pci_place's error says what to do (give numa_node as a number).
        return Some(f.info(format!(
            "numa_node = \"gpu\" fails for GPU {}: {e}",
            row.gpu.ordinal
        )));
    }
    let online = online_nodes();
    let unplaced: Vec<String> = rows
        .iter()
        .filter(|r| r.place.as_ref().is_ok_and(|p| p.node.is_none()))
        .map(|r| r.gpu.ordinal.to_string())
        .collect();
    if !unplaced.is_empty() && online.len() > 1 {
        return Some(f.info(format!(
            "the kernel gives GPU {} no NUMA node (-1) although this host has nodes {}: the \
             firmware reports no PCI affinity (common in VMs), so numa_node = \"gpu\" leaves such \
             a pool unbound; give numa_node as a number",
            unplaced.join(", "),
            format_node_list(&online)
        )));
    }
    Some(f)
}

/// For a pool that pins with `cuda` and gives `numa_node` as a number:
/// whether that is the node of its `[cuda] device`. Nothing when the
/// device cannot be located (the device finding says why) or the pool
/// gives no number.
fn pool_node(ctx: &DoctorContext<'_>) -> Option<Finding> {
    let config = ctx.config()?;
    let asked = config.numa_node.as_ref().and_then(|n| n.node())?;
    let gpu = locate_gpu(config.plugin_table(NAME)).ok()?;
    let f = Finding::new("pool", POOL_NODE_ITEM, "");
    let device = format!("CUDA device {}", gpu.ordinal);
    let mut details = json!({
        "numa_node": asked,
        "device": gpu.ordinal,
        "pci_address": gpu.pci_address,
        "gpu_node": Value::Null,
    });
    let place = match pci_place(&gpu.pci_address) {
        Ok(place) => place,
        Err(e) => {
            return Some(
                f.with_value(format!(
                    "numa_node = {asked}; the node of {device} ({}) is unknown",
                    gpu.pci_address
                ))
                .info(format!("cannot check it against the GPU: {e}"))
                .details(details),
            );
        }
    };
    details["pci_address"] = json!(place.address);
    details["gpu_node"] = json!(place.node);
    let at = format!("{device} ({})", place.address);
    Some(match place.node {
        Some(n) if n == asked => f
            .with_value(format!("numa_node = {asked}, the node of {at}"))
            .details(details),
        Some(n) => f
            .with_value(format!("numa_node = {asked}, but {at} is on node {n}"))
            .warn(format!(
                "every copy between the pool and the GPU crosses the link between the sockets; \
                 set numa_node = \"gpu\" (or numa_node = {n})"
            ))
            .details(details),
        None => f
            .with_value(format!("numa_node = {asked}; {at} has no NUMA node (-1)"))
            .info(
                "sysfs gives the GPU no node (a host of one node, or a VM without PCI \
                 affinity), so numa_node cannot be checked against it",
            )
            .details(details),
    })
}

/// Whether the device the pool's `[cuda]` table names exists.
fn pool_device(ctx: &DoctorContext<'_>, probe: &Result<DriverInfo, Error>) -> Finding {
    let device = ctx
        .config()
        .and_then(|c| CudaOptions::from_table(c.plugin_table(NAME)).ok())
        .map_or(0, |o| o.device);
    let f = Finding::new("pool", format!("pin {NAME} device"), "");
    match probe {
        Ok(info) => match info.devices.get(device as usize) {
            Some(name) => f.with_value(format!("device {device}: {name}")),
            None => ctx.pin_shortfall(
                f.with_value(format!(
                    "device {device} does not exist ({} device(s))",
                    info.devices.len()
                )),
                format!("set [cuda] device, or make the GPU visible: {GPU_VISIBLE}"),
            ),
        },
        Err(e) => ctx.pin_shortfall(
            f.with_value("no usable CUDA driver"),
            match e {
                Error::NotAvailable { reason, .. } => reason.clone(),
                other => other.to_string(),
            },
        ),
    }
}

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

/// How to make a GPU visible to this process.
const GPU_VISIBLE: &str = "check `nvidia-smi`; in a container: the NVIDIA container toolkit and \
                           `--gpus all` (Kubernetes: resources.limits nvidia.com/gpu)";

/// The CUDA driver's version and devices, from [`probe_devices`].
fn driver(probe: &Result<DriverInfo, Error>) -> Vec<Finding> {
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
                _ if !info.devices.is_empty() => f
                    .with_value(format!(
                        "{version}, {} device{}: {}",
                        info.devices.len(),
                        if info.devices.len() == 1 { "" } else { "s" },
                        device_list(&info.devices)
                    ))
                    .details(details),
                Some(why) => f
                    .with_value(format!("{version}, no device ({why})"))
                    .warn(GPU_VISIBLE)
                    .details(details),
                None => f
                    .with_value(format!("{version}, no device"))
                    .warn(GPU_VISIBLE)
                    .details(details),
            }
        }
        Err(Error::NotAvailable { reason, .. }) => {
            let (what, todo) = split_reason(reason);
            f.with_value(format!("absent: {what}"))
                .info(todo.unwrap_or_else(|| {
                    "pinning with cuda needs the NVIDIA driver (libcuda.so.1)".to_string()
                }))
        }
        Err(e) => f
            .with_value(format!("cannot be queried: {e}"))
            .warn(GPU_VISIBLE),
    }]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn device_lists_are_compact() {
        let same = vec!["H200".to_string(); 8];
        assert_eq!(device_list(&same), "8 × H200");
        assert_eq!(device_list(&["A".into(), "B".into()]), "0: A, 1: B");
    }
}
