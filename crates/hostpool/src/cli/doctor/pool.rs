//! `pool`: the pool asked for (`--config` or a pool flag) against this node:
//! the plan, its capacity checks, its pin and registrations, and the verdict.

use pool_core::capacity::{CapacityCheck, Verdict};
use pool_core::config::PinScope;
use pool_core::layout::format_bytes;
use pool_core::memlock::{self, MemlockPolicy};
use pool_core::pool::PlanReport;
use pool_core::{Error, PoolPlan};
use serde_json::{Value, json};

use super::cuda::GPU_VISIBLE;
use super::memlock::bound_text;
use super::rdma::RDMA_DEVICES;
use super::{Finding, Level, pool_is_hugetlb};

/// One capacity check of the plan.
fn check_finding(c: &CapacityCheck) -> Finding {
    let f = Finding::new(
        "pool",
        c.resource.clone(),
        format!(
            "need {}, free {} ({})",
            format_bytes(c.need),
            c.free.map_or("unknown".to_string(), format_bytes),
            c.source
        ),
    )
    .details(serde_json::to_value(c).unwrap_or(Value::Null));
    match c.verdict {
        Verdict::Fits => f,
        Verdict::Short => f.fail(c.remedy.clone()),
        Verdict::Unknown => f.warn(format!("the figure could not be read; {}", c.remedy)),
    }
}

/// The plan, its capacity checks, whether its pin and registrations can
/// work here, and the verdict.
pub(super) fn findings(
    plan: &PoolPlan,
    report: &PlanReport,
    cuda: &Result<pinner_cuda::DriverInfo, Error>,
    rdma: &Result<Vec<registrar_rdma::DeviceProbe>, Error>,
    rdma_options: &registrar_rdma::RdmaOptions,
) -> Vec<Finding> {
    let config = &plan.config;
    let mut out = vec![
        Finding::new(
            "pool",
            "plan",
            format!(
                "{} pool of {} ({} mapped in {} pages), prefault {} with {} thread(s)",
                report.backing,
                format_bytes(report.logical_bytes),
                format_bytes(report.mapped_bytes),
                format_bytes(report.page_size),
                report.prefault.method,
                report.prefault.threads
            ),
        )
        .details(json!({"explain": report.explain})),
    ];
    out.extend(report.capacity.iter().map(check_finding));

    let hugetlb = pool_is_hugetlb(plan, report);
    let state = memlock::state();
    let pin_bytes = if config.pin.scope == PinScope::Shard && config.sharing.is_some() {
        report.prefault.bytes
    } else {
        report.mapped_bytes
    };
    let bound = memlock::bound(&state, hugetlb);
    let within = |bytes: u64| bound.limit.is_none_or(|l| bytes <= l);

    if config.pin.is_on() {
        let kind = config.pin.kind.as_str();
        let required = config.pin.required;
        let short = |f: Finding, remedy: String| {
            if required {
                f.fail(remedy)
            } else {
                f.warn(format!("the pin would be skipped (best effort): {remedy}"))
            }
        };
        let item = format!("pin {kind}");
        if config.pin.memlock_bound == MemlockPolicy::Ignore {
            out.push(Finding::new(
                "pool",
                format!("{item} memlock"),
                "not checked (memlock_bound = ignore)",
            ));
        } else if within(pin_bytes) {
            out.push(Finding::new(
                "pool",
                format!("{item} memlock"),
                format!(
                    "{} within the bound: {}",
                    format_bytes(pin_bytes),
                    bound_text(&bound)
                ),
            ));
        } else {
            out.push(short(
                Finding::new(
                    "pool",
                    format!("{item} memlock"),
                    format!(
                        "{} over the bound: {}",
                        format_bytes(pin_bytes),
                        bound_text(&bound)
                    ),
                ),
                memlock::REMEDY.to_string(),
            ));
        }
        if kind == pinner_cuda::NAME {
            let device =
                pinner_cuda::CudaOptions::from_table(config.plugin_table(pinner_cuda::NAME))
                    .map_or(0, |o| o.device);
            let f = Finding::new("pool", format!("{item} device"), "");
            out.push(match cuda {
                Ok(info) => match info.devices.get(device as usize) {
                    Some(name) => Finding {
                        value: format!("device {device}: {name}"),
                        ..f
                    },
                    None => short(
                        Finding {
                            value: format!(
                                "device {device} does not exist ({} device(s))",
                                info.devices.len()
                            ),
                            ..f
                        },
                        format!("set [cuda] device, or make the GPU visible: {GPU_VISIBLE}"),
                    ),
                },
                Err(e) => short(
                    Finding {
                        value: "no usable CUDA driver".into(),
                        ..f
                    },
                    match e {
                        Error::NotAvailable { reason, .. } => reason.clone(),
                        other => other.to_string(),
                    },
                ),
            });
        }
    }

    for name in &config.register {
        let item = format!("register {name}");
        if name != registrar_rdma::NAME {
            out.push(
                Finding::new(
                    "pool",
                    item,
                    "not checked by doctor (an out-of-tree registrar)",
                )
                .info("`hostpool alloc` with this pool tells whether it registers"),
            );
            continue;
        }
        let f = Finding::new("pool", item, "");
        out.push(match rdma {
            Err(e) => Finding {
                value: "registration would fail".into(),
                ..f
            }
            .fail(e.to_string()),
            Ok(devices) => {
                let selected: Vec<&registrar_rdma::DeviceProbe> = match &rdma_options.devices {
                    Some(wanted) => devices
                        .iter()
                        .filter(|d| wanted.contains(&d.name))
                        .collect(),
                    None => devices.iter().collect(),
                };
                let missing: Vec<&String> = rdma_options
                    .devices
                    .iter()
                    .flatten()
                    .filter(|w| !devices.iter().any(|d| &d.name == *w))
                    .collect();
                let copies = u64::try_from(selected.len()).unwrap_or(u64::MAX);
                let need = report.mapped_bytes.saturating_mul(copies);
                if devices.is_empty() {
                    Finding {
                        value: "no RDMA device".into(),
                        ..f
                    }
                    .fail(RDMA_DEVICES)
                } else if !missing.is_empty() {
                    Finding {
                        value: format!(
                            "no device {}",
                            missing
                                .iter()
                                .map(|s| s.as_str())
                                .collect::<Vec<_>>()
                                .join(", ")
                        ),
                        ..f
                    }
                    .fail(format!(
                        "set [rdma] devices to some of: {}",
                        devices
                            .iter()
                            .map(|d| d.name.as_str())
                            .collect::<Vec<_>>()
                            .join(", ")
                    ))
                } else if config.pin.memlock_bound == MemlockPolicy::Check && !within(need) {
                    Finding {
                        value: format!(
                            "{} on {} device(s) over the memlock bound: {}",
                            format_bytes(need),
                            selected.len(),
                            bound_text(&bound)
                        ),
                        ..f
                    }
                    .fail(format!(
                        "ibv_reg_mr counts every registration against RLIMIT_MEMLOCK unless the \
                         process has CAP_IPC_LOCK; {}",
                        memlock::REMEDY
                    ))
                } else {
                    Finding {
                        value: selected
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
                        ..f
                    }
                }
            }
        });
    }

    let first_short = report.capacity.iter().find(|c| c.verdict == Verdict::Short);
    let failing: Vec<&str> = out
        .iter()
        .filter(|f| f.verdict == Level::Fail)
        .map(|f| f.item.as_str())
        .collect();
    out.push(match first_short {
        None if failing.is_empty() => Finding::new("pool", "verdict", "fits"),
        None => Finding::new(
            "pool",
            "verdict",
            format!("fits, but would fail at: {}", failing.join(", ")),
        )
        .fail("see the failing lines above"),
        Some(c) => Finding::new(
            "pool",
            "verdict",
            format!(
                "DOES NOT FIT: {} has {} free, the pool needs {}",
                c.resource,
                c.free.map_or("unknown".to_string(), format_bytes),
                format_bytes(c.need)
            ),
        )
        .fail("make room as the failing check above says, or ask for a smaller --size"),
    });
    out
}
