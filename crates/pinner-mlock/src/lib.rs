//! `mlock`: the CPU-side pin. `mlock(2)` keeps the pool resident (never
//! swapped); `munlock` on teardown. Same policy as every pinner: best effort
//! by default, `pin.required = true` to fail the pool; the memlock bound is
//! checked first ([`pool_core::host::memlock`]), and the soft `RLIMIT_MEMLOCK` is
//! raised to the hard one when the pool needs it (and restored after).
//!
//! On hugetlb mappings `mlock` succeeds and does nothing (`VmLck` stays 0):
//! reserved huge pages are never swapped. This pinner says so instead of
//! reporting a meaningless time, and makes no call.
//!
//! On 4 KiB pages `mlock` of resident memory costs about 0.13 s/GiB on this
//! project's CI machines; on THP about 0.45 ms/GiB.

mod sys;

use std::time::Instant;

use pool_core::format_bytes;
use pool_core::host::{memlock, process};
use pool_core::plugin::PinContext;
use pool_core::plugin::{Pin, Pinner, PinnerPlugin};
use pool_core::plugin::{PinCost, parse_table};
use pool_core::{Context, Error, Region, Result, Span, TeardownIssue};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

/// The plugin name.
pub const NAME: &str = "mlock";

/// The `[mlock]` table (no keys yet; unknown ones are errors).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MlockOptions {}

/// The configured pinner.
#[derive(Debug, Clone, Copy, Default)]
pub struct MlockPinner;

fn build(table: Option<&Value>) -> Result<Box<dyn Pinner>> {
    let _: MlockOptions = parse_table(NAME, table)?;
    Ok(Box::new(MlockPinner))
}

inventory::submit! {
    PinnerPlugin::new(
        NAME,
        "mlock the pool so it is never swapped (a no-op, said so, on reserved huge pages)",
        env!("CARGO_PKG_NAME"),
        build,
    )
    // About 0.13 s/GiB of resident 4 KiB pages on the CI machines.
    .with_cost(PinCost::new(0.13 / 262_144.0, true))
}

/// Locked bytes of this process (`VmLck` in /proc/self/status).
pub fn locked_bytes() -> Option<u64> {
    process::status_field("VmLck")
}

/// Raise the soft memlock limit to cover `need` more bytes when the hard
/// limit allows; returns the soft limit to restore.
fn raise_soft_limit(need: u64) -> Option<rustix::process::Rlimit> {
    use rustix::process::{Resource, getrlimit, setrlimit};
    let old = getrlimit(Resource::Memlock);
    let wanted = locked_bytes().unwrap_or(0).saturating_add(need);
    match old.current {
        Some(soft) if soft < wanted && old.maximum.is_none_or(|h| h > soft) => {
            let new = rustix::process::Rlimit {
                current: old.maximum,
                maximum: old.maximum,
            };
            setrlimit(Resource::Memlock, new).ok().map(|()| old)
        }
        _ => None,
    }
}

impl Pinner for MlockPinner {
    fn name(&self) -> &'static str {
        NAME
    }

    fn pin(&self, region: Region<'_>, ctx: &PinContext) -> Result<Box<dyn Pin>> {
        let len = region.mapped_len();
        if region.is_hugetlb() {
            return Ok(Box::new(Locked {
                span: region.span(),
                called: false,
                restore: None,
                details: json!({
                    "mlock_called": false,
                    "bytes": len,
                    "note": format!("{} pages are reserved huge pages, which are never swapped: mlock would succeed and do nothing (VmLck stays 0), so it was not called", region.page()),
                }),
            }));
        }
        let line = memlock::check(len, "mlock", false, ctx.memlock_bound)?;
        let restore = raise_soft_limit(len);
        let before = locked_bytes().unwrap_or(0);
        let t = Instant::now();
        if let Err(e) = sys::lock(&region) {
            if let Some(old) = restore {
                let _ = rustix::process::setrlimit(rustix::process::Resource::Memlock, old);
            }
            let remedy = match e.raw_os_error() {
                Some(libc::ENOMEM) | Some(libc::EPERM) => memlock::REMEDY.to_string(),
                Some(libc::EAGAIN) => {
                    "some pages could not be locked; retry, or check memory pressure".to_string()
                }
                _ => "see the error number".to_string(),
            };
            return Err(Error::os(
                "mlock",
                e,
                Context::new(len, region.page())
                    .addr(region.addr() as usize)
                    .remedy(remedy),
            ));
        }
        let secs = t.elapsed().as_secs_f64();
        let after = locked_bytes().unwrap_or(0);
        Ok(Box::new(Locked {
            span: region.span(),
            called: true,
            restore,
            details: json!({
                "mlock_called": true,
                "bytes": len,
                "seconds": secs,
                "seconds_per_gib": secs / (len as f64 / f64::from(1u32 << 30)),
                "vmlck_added": after.saturating_sub(before),
                "memlock": line,
            }),
        }))
    }
}

/// A live `mlock`.
#[derive(Debug)]
struct Locked {
    span: Span,
    called: bool,
    restore: Option<rustix::process::Rlimit>,
    details: Value,
}

impl Pin for Locked {
    fn details(&self) -> Value {
        self.details.clone()
    }

    fn unpin(self: Box<Self>) -> Vec<TeardownIssue> {
        let mut issues = Vec::new();
        if self.called
            && let Err(e) = sys::unlock(self.span)
        {
            issues.push(TeardownIssue::log(
                "munlock",
                format!(
                    "{:#x}+{} ({}): {e}",
                    self.span.addr,
                    self.span.len,
                    format_bytes(self.span.len)
                ),
            ));
        }
        if let Some(old) = self.restore {
            let _ = rustix::process::setrlimit(rustix::process::Resource::Memlock, old);
        }
        issues
    }
}
