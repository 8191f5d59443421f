//! `hostpool doctor`'s findings for this registrar: libibverbs and the RDMA
//! devices with their `max_mr_size`, and, for a pool that registers with
//! `rdma`, whether it can. The probe opens each device read-only to query
//! it; nothing is registered.

use pool_core::Error;
use pool_core::format_bytes;
use pool_core::plugin::{DoctorContext, Finding, split_reason};
use serde_json::json;

use crate::{DeviceProbe, NAME, RdmaOptions, probe};

/// The hook in this registrar's record.
pub(crate) fn findings(ctx: &DoctorContext<'_>) -> Vec<Finding> {
    // The pool's own `[rdma]` table decides which library is probed.
    let options: RdmaOptions = ctx
        .config()
        .and_then(|c| c.plugin_table(NAME))
        .and_then(|t| serde_json::from_value(t.clone()).ok())
        .unwrap_or_default();
    let probed = std::panic::catch_unwind(|| probe(&options)).unwrap_or_else(|_| {
        Err(Error::Plugin {
            what: "rdma probe".into(),
            message: "failed unexpectedly (a panic)".into(),
            source: None,
        })
    });
    let mut out = devices(&probed, &options);
    if ctx.registers_with(NAME) {
        out.push(pool_registration(ctx, &probed, &options));
    }
    out
}

/// Whether the pool's registration can work: devices present (the ones
/// `[rdma] devices` names), and within the memlock bound.
fn pool_registration(
    ctx: &DoctorContext<'_>,
    probe: &Result<Vec<DeviceProbe>, Error>,
    options: &RdmaOptions,
) -> Finding {
    let f = Finding::new("pool", format!("register {NAME}"), "");
    let devices = match probe {
        Err(e) => {
            return f.with_value("registration would fail").fail(e.to_string());
        }
        Ok(d) => d,
    };
    let selected: Vec<&DeviceProbe> = match &options.devices {
        Some(wanted) => devices
            .iter()
            .filter(|d| wanted.contains(&d.name))
            .collect(),
        None => devices.iter().collect(),
    };
    let missing: Vec<&str> = options
        .devices
        .iter()
        .flatten()
        .filter(|w| !devices.iter().any(|d| &d.name == *w))
        .map(String::as_str)
        .collect();
    let mapped = ctx.pool.map_or(0, |p| p.mapped_bytes);
    let need = mapped.saturating_mul(u64::try_from(selected.len()).unwrap_or(u64::MAX));
    let bound = ctx.memlock_bound();
    if devices.is_empty() {
        f.with_value("no RDMA device").fail(RDMA_DEVICES)
    } else if !missing.is_empty() {
        f.with_value(format!("no device {}", missing.join(", ")))
            .fail(format!(
                "set [rdma] devices to some of: {}",
                devices
                    .iter()
                    .map(|d| d.name.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            ))
    } else if let Some(bound) = bound.filter(|b| !b.allows(need)) {
        f.with_value(format!(
            "{} on {} device(s) over the memlock bound: {}",
            format_bytes(need),
            selected.len(),
            bound.describe()
        ))
        .fail(format!(
            "ibv_reg_mr counts every registration against RLIMIT_MEMLOCK unless the process has \
             CAP_IPC_LOCK; {}",
            pool_core::host::memlock::REMEDY
        ))
    } else {
        f.with_value(
            selected
                .iter()
                .map(|d| {
                    format!(
                        "{} (regions of at most {})",
                        d.name,
                        d.max_mr_size.map_or("?".to_string(), format_bytes)
                    )
                })
                .collect::<Vec<_>>()
                .join(", "),
        )
    }
}

/// How to find out why no RDMA device shows.
const RDMA_DEVICES: &str = "check `ibv_devices` or `rdma link`, that the NIC's RDMA driver (e.g. \
                            mlx5_ib) and ibverbs-providers are installed, and in a container that \
                            /dev/infiniband is passed through";

/// Each RDMA device's `max_mr_size`, from [`probe()`].
fn devices(probe: &Result<Vec<DeviceProbe>, Error>, options: &RdmaOptions) -> Vec<Finding> {
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
                    (None, Some(m)) => f.with_value(format!("max_mr_size {}", format_bytes(m))),
                    (err, max) => f.with_value(format!(
                            "max_mr_size {}: {}",
                            max.map_or("unknown".to_string(), format_bytes),
                            err.as_deref().unwrap_or("cannot be queried")
                        ))
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
