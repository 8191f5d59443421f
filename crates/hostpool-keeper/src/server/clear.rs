//! Clearing the pool between leases (`content = "zero"`), on a thread of
//! its own while the keeper serves: the state says when
//! ([`Serving::end_lease`]) and hears how it went ([`Serving::cleared`]).
//!
//! [`Serving::end_lease`]: super::state::Serving::end_lease
//! [`Serving::cleared`]: super::state::Serving::cleared

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use pool_core::Region;
use pool_core::{Error, Result};

use super::Memory;

/// Clear the pool between leases: zero it in place on the prefault plan's
/// threads. Its pages stay resident and allocated (nothing is punched out
/// and faulted again), so no other process can take them in between and
/// the next lease finds them as the build left them. Its seconds.
pub(super) fn clear(
    name: &str,
    region: Region<'_>,
    memory: &Memory,
    abort: &AtomicBool,
) -> Result<f64> {
    let t = Instant::now();
    // A file a lease truncated would make the zeroing a SIGBUS: check
    // first (the lease is over, so no holder is left to truncate it now
    // but one that kept a descriptor against the rules).
    if let Some(why) = memory.truncated() {
        return Err(Error::Keeper {
            name: name.to_string(),
            message: why,
            pid: None,
            absent: false,
        });
    }
    if let Some(e) = pool_core::failpoint::check("keeper-clear") {
        return Err(Error::os(
            "zeroing",
            e,
            pool_core::Context::new(0, region.page())
                .remedy(format!("clearing kept pool `{name}` between leases failed")),
        ));
    }
    pool_core::failpoint::stall("keeper-zeroing");
    // A keeper that stops serving (a second stop request, or the drain
    // timeout) stops the zeroing too, at its next step.
    pool_core::prefault::zero(&region, &memory.prefault, &|| abort.load(Ordering::SeqCst))?;
    Ok(t.elapsed().as_secs_f64())
}
