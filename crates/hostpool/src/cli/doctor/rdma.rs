//! `rdma`: libibverbs and the RDMA devices, which the `rdma` registrar needs.

use pool_core::Error;
use pool_core::layout::format_bytes;
use serde_json::json;

use super::{Finding, split_reason};

/// How to find out why no RDMA device shows.
pub(super) const RDMA_DEVICES: &str = "check `ibv_devices` or `rdma link`, that the NIC's RDMA driver (e.g. \
                            mlx5_ib) and ibverbs-providers are installed, and in a container that \
                            /dev/infiniband is passed through";

/// Each RDMA device's `max_mr_size`, from [`registrar_rdma::probe`].
pub(super) fn findings(
    probe: &Result<Vec<registrar_rdma::DeviceProbe>, Error>,
    options: &registrar_rdma::RdmaOptions,
) -> Vec<Finding> {
    let library = options.library();
    match probe {
        Ok(devices) if devices.is_empty() => vec![
            Finding::new(
                "rdma",
                "devices",
                format!("{library} loaded, no RDMA device"),
            )
            .info(RDMA_DEVICES),
        ],
        Ok(devices) => devices
            .iter()
            .map(|d| {
                let f = Finding::new("rdma", d.name.clone(), "")
                    .details(json!({"max_mr_size": d.max_mr_size, "error": d.error}));
                match (&d.error, d.max_mr_size) {
                    (None, Some(m)) => Finding {
                        value: format!("max_mr_size {}", format_bytes(m)),
                        ..f
                    },
                    (err, max) => Finding {
                        value: format!(
                            "max_mr_size {}: {}",
                            max.map_or("unknown".to_string(), format_bytes),
                            err.as_deref().unwrap_or("cannot be queried")
                        ),
                        ..f
                    }
                    .warn(
                        "check access to /dev/infiniband/uverbs* and that the NIC's RDMA driver is \
                         loaded (dmesg)",
                    ),
                }
            })
            .collect(),
        Err(Error::NotAvailable { reason, .. }) => {
            let (what, todo) = split_reason(reason);
            vec![
                Finding::new("rdma", "libibverbs", format!("not available: {what}"))
                    .info(todo.unwrap_or_else(|| RDMA_DEVICES.to_string())),
            ]
        }
        Err(e) => vec![
            Finding::new("rdma", "libibverbs", format!("cannot list devices: {e}"))
                .warn(RDMA_DEVICES),
        ],
    }
}
