//! A pool from config to teardown.
//!
//! The data flows one way: config → [`PoolPlan`] (pure: plugins resolved,
//! layout, capacity verdicts, prefault threads; `plan.rs`) →
//! [`Pool::build`] (map, bind, prefault, rendezvous, attach, pin, register:
//! one function each in `build.rs`) → [`PoolReport`] (`report.rs`).
//! Teardown runs the same steps backwards: deregister, unpin,
//! unmap/close/unlink. A failure part-way through a build tears down what was
//! built before the error is returned, and a `Pool` that is dropped without
//! [`Pool::teardown`] tears itself down.

mod build;
mod handoff;

pub use build::BuildOptions;
pub use handoff::Handoff;
mod numa;
mod pin_status;
mod plan;
mod report;
mod source;
mod teardown;

use std::time::Instant;

use crate::background::MappingOwner;
use crate::layout::Extent;
use crate::plugin::{Pin, Registration};
use crate::sys::Region;

pub use numa::{GpuPlace, NumaPlan, NumaReport, ShardPlacement};
pub use plan::{LeasePlan, Memory, PinPlan, PoolPlan, Share, Source};
pub use report::{
    HugePagesReport, Phases, PinPlanReport, PinReport, PlanReport, PoolReport, PrefaultPlanReport,
    RegistrationReport, ThpReport,
};

/// Pages sampled with `get_mempolicy` to verify NUMA placement.
pub const NUMA_SAMPLES: usize = 64;

/// The phases of a build, for progress reporting.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    /// Creating the mapping.
    Map,
    /// Faulting pages in.
    Prefault,
    /// Mapping the peers' shards of a shared pool into this rank's page tables.
    Attach,
    /// Pinning.
    Pin,
    /// Registering with devices.
    Register,
    /// Releasing everything.
    Teardown,
}

impl Phase {
    /// The phase's name in reports.
    pub fn name(self) -> &'static str {
        match self {
            Phase::Map => "map",
            Phase::Prefault => "prefault",
            Phase::Attach => "attach",
            Phase::Pin => "pin",
            Phase::Register => "register",
            Phase::Teardown => "teardown",
        }
    }
}

/// Watches a build: called from the building thread, and `progress` from
/// prefault workers too. Every method has a no-op default.
pub trait Observer: Sync {
    /// A phase starts; `total` is its work in bytes.
    fn start(&self, _phase: Phase, _total: u64) {}
    /// Bytes done so far in the phase.
    fn progress(&self, _phase: Phase, _done: u64) {}
    /// The phase ended after `seconds`.
    fn end(&self, _phase: Phase, _seconds: f64) {}
}

/// An observer that watches nothing.
#[derive(Debug, Clone, Copy, Default)]
pub struct Quiet;
impl Observer for Quiet {}

/// A built pool: owns its mapping, pin and registrations.
#[derive(Debug)]
pub struct Pool {
    /// The mapping, with the background pin's thread when there is one
    /// (joined before the mapping goes).
    mapping: Option<MappingOwner>,
    pin: Option<Box<dyn Pin>>,
    /// A background pin, while the pool has one.
    background: Option<crate::background::Background>,
    /// What the pin covers (offsets in the pool), when a pinner was asked for.
    pin_extent: Option<Extent>,
    registrations: Vec<Box<dyn Registration>>,
    /// How the memory came: the build's own, a share, a lease.
    attached: crate::shared::Attached,
    report: PoolReport,
    /// The process that built the pool. A child that inherited it through
    /// `fork` has the mapping but none of the rest: the pins and
    /// registrations are its parent's, and the pinning thread is not there.
    owner: u32,
}

fn timed<T>(observer: &dyn Observer, phase: Phase, total: u64, f: impl FnOnce() -> T) -> (T, f64) {
    observer.start(phase, total);
    let t = Instant::now();
    let out = f();
    let secs = t.elapsed().as_secs_f64();
    observer.end(phase, secs);
    (out, secs)
}

impl Pool {
    /// The pool's memory, for as long as the pool is borrowed (`None` only
    /// once torn down).
    pub fn region(&self) -> Option<Region<'_>> {
        self.mapping.as_ref().map(|m| m.get().region())
    }

    /// How the pool's memory came to this process: mapped alone, a shared
    /// pool's share, or a lease (what the keeper told).
    pub fn attached(&self) -> &crate::shared::Attached {
        &self.attached
    }

    /// The report so far (teardown not yet included).
    pub fn report(&self) -> &PoolReport {
        &self.report
    }

    /// The pid of the process that built the pool, when this process is a
    /// child that inherited it through `fork`; `None` in the builder.
    pub fn inherited_from(&self) -> Option<u32> {
        (std::process::id() != self.owner).then_some(self.owner)
    }

    /// The open files the pool's memory is, in pool order, each mapped
    /// from its offset 0 over its extent (empty for anonymous memory and
    /// once torn down): what another process or library maps to reach the
    /// same pages (`/proc/self/fd/N` of an unlinked file or memfd).
    pub fn pool_files(&self) -> &[crate::file::PoolFile] {
        self.mapping.as_ref().map_or(&[], |m| m.get().pool_files())
    }

    /// The connection a leased pool holds to its keeper, for the
    /// keeper's CPU tier (`None` for a pool not leased, and once torn
    /// down).
    pub fn keeper_conn(&self) -> Option<std::os::fd::BorrowedFd<'_>> {
        self.mapping.as_ref().and_then(|m| m.get().keeper_conn())
    }

    /// Files backing the pool that exist right now.
    pub fn files(&self) -> Vec<std::path::PathBuf> {
        self.mapping
            .as_ref()
            .map(|m| m.get().files())
            .unwrap_or_default()
    }
}

fn gone() -> crate::Error {
    crate::Error::Plugin {
        what: "pool".into(),
        message: "the mapping was released while the pool was being built".into(),
        source: None,
    }
}
