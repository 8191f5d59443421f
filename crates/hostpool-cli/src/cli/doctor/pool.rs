//! `pool`: the pool asked for (`--config` or a pool flag) against this node:
//! the plan, its capacity checks, its pin and registrations, and the verdict.

use pool_core::PinScope;
use pool_core::PlanReport;
use pool_core::PoolPlan;
use pool_core::format_bytes;
use pool_core::host::capacity::{CapacityCheck, Verdict};
use pool_core::host::memlock;
use pool_core::plugin;
use pool_core::plugin::DoctorContext;
use pool_core::plugin::RegistrarPlugin;
use serde_json::{Value, json};

use super::{Finding, Level};

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

/// Which rendezvous a shared pool would use, and why.
fn rendezvous_finding(sharing: &pool_core::SharingConfig) -> Finding {
    let uid = rustix::process::geteuid().as_raw();
    let value = match sharing.rendezvous {
        pool_core::Rendezvous::Socket => format!(
            "socket @hostpool/{uid}/{}: the ranks meet on a unix socket in the abstract \
             namespace and share memory that has no name in any directory, so nothing can be \
             left behind",
            sharing.name
        ),
        pool_core::Rendezvous::File => format!(
            "file {}: a control file and named data files, unlinked after the barrier",
            pool_core::gc::ctl_path(
                sharing
                    .control_dir
                    .as_deref()
                    .unwrap_or(std::path::Path::new(pool_core::gc::DEFAULT_CONTROL_DIR)),
                &sharing.name
            )
            .display()
        ),
    };
    let why = match sharing.rendezvous {
        pool_core::Rendezvous::Socket => {
            "the ranks must share a network namespace (the ranks of one engine, one pod); for \
             ranks that share only a directory, set rendezvous = \"file\" (--rendezvous file)"
        }
        pool_core::Rendezvous::File => {
            "for ranks that share a directory but not a network namespace; a crash can leave \
             files, which the next creator replaces and `hostpool gc` removes"
        }
    };
    Finding::new("pool", "rendezvous", value)
        .info(why)
        .details(json!({"rendezvous": sharing.rendezvous.to_string()}))
}

/// The plan, its capacity checks, the memlock bound of its pin, what the
/// plugins said of their part (`plugin_lines`, from their doctor hooks), and
/// the verdict.
pub(super) fn findings(
    ctx: &DoctorContext<'_>,
    plan: &PoolPlan,
    report: &PlanReport,
    plugin_lines: Vec<Finding>,
) -> Vec<Finding> {
    let config = &plan.config();
    let summary = match &report.keeper {
        Some(keeper) => format!(
            "a lease of kept pool `{keeper}`: the keeper's backing and pages, resident (`hostpool \
             keep status --name {keeper}` says how it is)"
        ),
        None => format!(
            "{} pool of {} ({} mapped in {} pages), prefault {} with {} thread(s)",
            report.backing,
            format_bytes(report.logical_bytes),
            format_bytes(report.mapped_bytes),
            format_bytes(report.page_size),
            report.prefault.method,
            report.prefault.threads
        ),
    };
    let mut out =
        vec![Finding::new("pool", "plan", summary).details(json!({"explain": report.explain}))];
    out.extend(report.capacity.iter().map(check_finding));
    if let Some(sharing) = &config.sharing {
        out.push(rendezvous_finding(sharing));
    }

    if let Some(kind) = &config.pin.kind {
        let item = format!("pin {kind} memlock");
        let pin_bytes = if config.pin.scope == PinScope::Shard && config.sharing.is_some() {
            report.prefault.bytes
        } else {
            report.mapped_bytes
        };
        out.push(match ctx.memlock_bound() {
            None => Finding::new("pool", item, "not checked (memlock_bound = ignore)"),
            Some(bound) if bound.allows(pin_bytes) => Finding::new(
                "pool",
                item,
                format!(
                    "{} within the bound: {}",
                    format_bytes(pin_bytes),
                    bound.describe()
                ),
            ),
            Some(bound) => ctx.pin_shortfall(
                Finding::new(
                    "pool",
                    item,
                    format!(
                        "{} over the bound: {}",
                        format_bytes(pin_bytes),
                        bound.describe()
                    ),
                ),
                memlock::REMEDY,
            ),
        });
    }
    // Registrars whose plugin has no doctor hook are not checked here.
    for name in &config.register {
        let hooked = plugin::lookup::<RegistrarPlugin>(name).is_ok_and(|r| r.doctor.is_some());
        if !hooked {
            out.push(
                Finding::new(
                    "pool",
                    format!("register {name}"),
                    "not checked by doctor (its plugin has no doctor hook)",
                )
                .info("`hostpool alloc` with this pool tells whether it registers"),
            );
        }
    }
    out.extend(plugin_lines);

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
