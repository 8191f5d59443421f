//! `cuda`: the CUDA driver and its devices, which the `cuda` pinner needs.

use pool_core::Error;
use serde_json::json;

use super::{Finding, split_reason};

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
pub(super) const GPU_VISIBLE: &str = "check `nvidia-smi`; in a container: the NVIDIA container toolkit and \
                           `--gpus all` (Kubernetes: resources.limits nvidia.com/gpu)";

/// The CUDA driver's version and devices, from [`pinner_cuda::probe_devices`].
pub(super) fn findings(probe: &Result<pinner_cuda::DriverInfo, Error>) -> Vec<Finding> {
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
                _ if !info.devices.is_empty() => Finding {
                    value: format!(
                        "{version}, {} device{}: {}",
                        info.devices.len(),
                        if info.devices.len() == 1 { "" } else { "s" },
                        device_list(&info.devices)
                    ),
                    ..f
                }
                .details(details),
                Some(why) => Finding {
                    value: format!("{version}, no device ({why})"),
                    ..f
                }
                .warn(GPU_VISIBLE)
                .details(details),
                None => Finding {
                    value: format!("{version}, no device"),
                    ..f
                }
                .warn(GPU_VISIBLE)
                .details(details),
            }
        }
        Err(Error::NotAvailable { reason, .. }) => {
            let (what, todo) = split_reason(reason);
            Finding {
                value: format!("absent: {what}"),
                ..f
            }
            .info(todo.unwrap_or_else(|| {
                "pinning with cuda needs the NVIDIA driver (libcuda.so.1)".to_string()
            }))
        }
        Err(e) => Finding {
            value: format!("cannot be queried: {e}"),
            ..f
        }
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
