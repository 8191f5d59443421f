//! The GPU plugin record's calls: which GPU a `[cuda]` table selects and
//! where it sits on the PCI bus, for `numa_node = "gpu"` and `hostpool
//! doctor`'s GPU table.
//!
//! Only `cuInit`, `cuDeviceGetCount`, `cuDeviceGet`, `cuDeviceGetName` and
//! `cuDeviceGetPCIBusId` are called: no context is retained or made
//! current, so the driver's primary context is left as it is.

use pool_core::host::numa::normalize_pci_address;
use pool_core::plugin::GpuDevice;
use pool_core::{Error, Result};
use serde_json::Value;

use crate::CudaOptions;
use crate::probe::{describe, driver, panicked};
use crate::session::{device_by_index, failed};
use crate::sys::{self, Api};

/// What a [`locate_gpu`] or [`list_gpus`] that cannot answer adds to the
/// driver's remedy.
pub const GIVE_NODE_NUMBER: &str = "give numa_node as a number instead (see `hostpool doctor`'s \
                                    GPU table, item \"GPU NUMA placement\")";

/// The GPU a `[cuda]` table selects (`None`: the defaults, device 0): its
/// ordinal, its PCI address as the driver writes it (`0000:3B:00.0`) and
/// its name. The `locate` of this crate's [`GpuPlugin`](pool_core::plugin::GpuPlugin)
/// record, which `numa_node = "gpu"` asks.
///
/// Calls `cuInit`, `cuDeviceGetCount`, `cuDeviceGet`, `cuDeviceGetName`
/// and `cuDeviceGetPCIBusId`; retains no context. Never panics.
///
/// # Errors
/// [`Error::Config`] for a table [`CudaOptions::from_table`] refuses (an
/// unknown key, …); [`Error::NotAvailable`], naming `numa_node = "gpu"`,
/// when there is no usable driver, no device, or no device of that
/// ordinal (as pinning says it, with the device count and `[cuda] device`),
/// the reason ending with [`GIVE_NODE_NUMBER`]; [`Error::Plugin`] when a
/// driver call fails otherwise or the driver's PCI address is not one.
pub fn locate_gpu(table: Option<&Value>) -> Result<GpuDevice> {
    let options = CudaOptions::from_table(table)?;
    let index = options.device;
    let what = format!("numa_node = \"gpu\" (the NUMA node of CUDA device {index})");
    sys::guarded(|| {
        let api = driver(&what).map_err(give_node_number)?;
        let device = device_by_index(api, &what, index).map_err(give_node_number)?;
        gpu_device(api, &what, index, device)
    })
    .unwrap_or_else(|msg| Err(panicked(&what, &msg)))
}

/// Every GPU the driver sees, by ordinal: the `list` of this crate's
/// [`GpuPlugin`](pool_core::plugin::GpuPlugin) record, for `hostpool
/// doctor`'s GPU table. A driver without devices (`cuInit` says
/// `CUDA_ERROR_NO_DEVICE`) gives an empty list.
///
/// Calls what [`locate_gpu`] calls, for each device; retains no context.
///
/// # Errors
/// [`Error::NotAvailable`] when there is no usable driver (the reason
/// ending with [`GIVE_NODE_NUMBER`]); [`Error::Plugin`] when a driver call
/// fails or a device's PCI address is not one.
pub fn list_gpus() -> Result<Vec<GpuDevice>> {
    const WHAT: &str = "the NUMA nodes of the CUDA devices (numa_node = \"gpu\")";
    sys::guarded(|| {
        let api = driver(WHAT).map_err(give_node_number)?;
        match api.init() {
            Ok(()) => {}
            Err(s) if s == sys::NO_DEVICE => return Ok(Vec::new()),
            Err(s) => {
                return Err(give_node_number(Error::NotAvailable {
                    what: WHAT.into(),
                    reason: format!(
                        "the CUDA driver did not initialise: cuInit returned {}",
                        describe(api, s)
                    ),
                }));
            }
        }
        let count = api
            .device_count()
            .map_err(|s| failed(api, WHAT, "cuDeviceGetCount", s))?;
        (0..count.max(0))
            .map(|i| {
                let index = i.unsigned_abs();
                let device = api
                    .device(i)
                    .map_err(|s| failed(api, WHAT, &format!("cuDeviceGet({i})"), s))?;
                gpu_device(api, WHAT, index, device)
            })
            .collect()
    })
    .unwrap_or_else(|msg| Err(panicked(WHAT, &msg)))
}

/// The record of one device: its PCI address (checked to be one) and name.
fn gpu_device(
    api: &Api,
    what: &str,
    index: u32,
    device: cudarc::driver::sys::CUdevice,
) -> Result<GpuDevice> {
    let address = api.pci_bus_id(device).map_err(|s| {
        failed(
            api,
            what,
            &format!("cuDeviceGetPCIBusId of device {index}"),
            s,
        )
    })?;
    if let Err(why) = normalize_pci_address(&address) {
        return Err(Error::Plugin {
            what: what.to_string(),
            message: format!(
                "cuDeviceGetPCIBusId gave CUDA device {index} an address that is not one: {why}"
            ),
            source: None,
        });
    }
    let gpu = GpuDevice::new(index, address);
    Ok(
        match api.device_name(device).ok().filter(|n| !n.is_empty()) {
            Some(name) => gpu.with_name(name),
            None => gpu,
        },
    )
}

/// A not-available error whose reason also says that a node number does
/// without the GPU; other errors as they are.
fn give_node_number(e: Error) -> Error {
    match e {
        Error::NotAvailable { what, reason } => Error::NotAvailable {
            what,
            // The first `; ` separates what is wrong from what to do
            // (`split_reason`): join the remedy to the one there is.
            reason: if reason.contains("; ") {
                format!("{reason}, or {GIVE_NODE_NUMBER}")
            } else {
                format!("{reason}; {GIVE_NODE_NUMBER}")
            },
        },
        other => other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_number_remedy_joins_the_drivers_own() {
        let na = |reason: &str| Error::NotAvailable {
            what: "numa_node = \"gpu\" (the NUMA node of CUDA device 0)".into(),
            reason: reason.into(),
        };
        let e = give_node_number(na("no CUDA driver (libcuda.so.1) on this host; install it"));
        let Error::NotAvailable { what, reason } = &e else {
            panic!("{e:?}")
        };
        assert!(what.contains("numa_node = \"gpu\""), "{what}");
        assert_eq!(
            pool_core::plugin::split_reason(reason),
            (
                "no CUDA driver (libcuda.so.1) on this host".to_string(),
                Some(format!("install it, or {GIVE_NODE_NUMBER}"))
            )
        );
        let e = give_node_number(na("no CUDA device: cuInit returned X"));
        assert_eq!(
            e.to_string(),
            format!(
                "numa_node = \"gpu\" (the NUMA node of CUDA device 0) is not available on this \
                 host: no CUDA device: cuInit returned X; {GIVE_NODE_NUMBER}"
            )
        );
        let other = give_node_number(Error::config("bad"));
        assert!(other.is_usage() && !other.to_string().contains("numa_node"));
    }

    #[test]
    fn a_bad_table_is_a_config_error_before_any_driver_call() {
        let e = locate_gpu(Some(&serde_json::json!({"devcie": 1}))).unwrap_err();
        assert!(e.is_usage(), "{e:?}");
        assert!(e.to_string().contains("devcie"), "{e}");
    }
}
