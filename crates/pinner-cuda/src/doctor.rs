//! `hostpool doctor`'s findings for this pinner: the CUDA driver and its
//! devices, and, for a pool that pins with `cuda`, whether its device exists.
//! The probe is `cuInit` and device queries; nothing is registered.

use pool_core::Error;
use pool_core::plugin::{DoctorContext, Finding, split_reason};
use serde_json::json;

use crate::{CudaOptions, DriverInfo, NAME, probe_devices};

/// The hook in this pinner's record.
pub(crate) fn findings(ctx: &DoctorContext<'_>) -> Vec<Finding> {
    let probe = crate::sys::guarded(probe_devices)
        .unwrap_or_else(|msg| Err(crate::probe::panicked("cuda driver probe", &msg)));
    let mut out = driver(&probe);
    if ctx.pins_with(NAME) {
        out.push(pool_device(ctx, &probe));
    }
    out
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
