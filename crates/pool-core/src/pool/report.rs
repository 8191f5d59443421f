//! The reports a plan and a pool give (`hostpool plan --json`, `hostpool
//! alloc --json`): their field names are a contract.

use serde::Serialize;
use serde_json::Value;

use crate::background::PinStatus;
use crate::error::TeardownIssue;
use crate::host::capacity::CapacityCheck;
use crate::plugin::ExtentReport;
use crate::prefault::PrefaultOutcome;

/// `hostpool plan --json`.
#[derive(Debug, Clone, Serialize)]
pub struct PlanReport {
    /// hostpool's version.
    pub version: &'static str,
    /// Backing name.
    pub backing: String,
    /// Page size in bytes.
    pub page_size: u64,
    /// Bytes asked for.
    pub logical_bytes: u64,
    /// Bytes that will be mapped (rounded up to the page size).
    pub mapped_bytes: u64,
    /// Segments of the mapping.
    pub segments: Vec<ExtentReport>,
    /// Files that will be created.
    pub files: Vec<String>,
    /// Resolved backing options.
    pub options: Value,
    /// Prefault method and threads.
    pub prefault: PrefaultPlanReport,
    /// Pinning policy.
    pub pin: PinPlanReport,
    /// Registrars, in order.
    pub registrations: Vec<String>,
    /// Capacity checks and their verdicts.
    pub capacity: Vec<CapacityCheck>,
    /// Whether every capacity check passes (or is unknown).
    pub fits: bool,
    /// Prefault shards: one per rank of a shared pool, else one per thread.
    pub shards: Vec<ExtentReport>,
    /// What the pinner will do (for `cuda`: its registration chunks).
    pub pin_plan: Value,
    /// What each registrar will do (RDMA regions depend on each device's
    /// `max_mr_size`, learnt at registration).
    pub registration_plans: Vec<Value>,
    /// Predicted seconds per phase.
    pub predicted_seconds: crate::plugin::Predicted,
    /// What `huge_pages` asked for and what the pool gets, when it asked.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub huge_pages: Option<HugePagesReport>,
    /// What `numa_node` asked for and the node this process binds, when it
    /// asked.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub numa: Option<super::numa::NumaPlan>,
    /// The kept pool a lease asks for (`[lease]` `keeper`); absent for a
    /// pool this process builds. A lease's `backing` is `keeper`, its
    /// `logical_bytes` and `page_size` what it asks (0: any).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub keeper: Option<String>,
    /// Every choice and why, one line each.
    pub explain: Vec<String>,
}

/// How much of a pool transparent huge pages back (`AnonHugePages` of its
/// range in `/proc/self/smaps`, read after prefault).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ThpReport {
    /// Bytes backed by transparent huge pages.
    pub backed_bytes: u64,
    /// Bytes mapped.
    pub mapped_bytes: u64,
    /// The system's THP mode (`always`, `madvise`, `never`), when readable.
    pub mode: Option<String>,
}

/// The report's `segments` of a backing's plan.
pub(super) fn segment_reports(bp: &crate::plugin::BackingPlan) -> Vec<ExtentReport> {
    bp.segments
        .iter()
        .copied()
        .map(ExtentReport::from)
        .collect()
}

/// Prefault part of a plan.
#[derive(Debug, Clone, Serialize)]
pub struct PrefaultPlanReport {
    /// Method name.
    pub method: &'static str,
    /// Threads.
    pub threads: usize,
    /// Start of the range to fault.
    pub offset: u64,
    /// Bytes to fault.
    pub bytes: u64,
}

/// Pin part of a plan.
#[derive(Debug, Clone, Serialize)]
pub struct PinPlanReport {
    /// Pinner name or "off".
    pub kind: String,
    /// Whether failure fails the pool.
    pub required: bool,
}

/// The `pin` object of the report.
#[derive(Debug, Clone, Serialize)]
pub struct PinReport {
    /// Pinner name or "off".
    pub kind: String,
    /// Outcome.
    pub status: PinStatus,
    /// Why it was skipped, when it was.
    pub reason: Option<String>,
    /// The pinner's details (chunks, device).
    pub details: Value,
}

/// One entry of the report's `registrations`.
#[derive(Debug, Clone, Serialize)]
pub struct RegistrationReport {
    /// Registrar name.
    pub kind: String,
    /// The registrar's details (devices, regions, keys).
    pub details: Value,
}

/// Seconds per phase; phases that did not run are absent.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Phases {
    /// Creating the mapping.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub map: Option<f64>,
    /// Faulting pages in.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub prefault: Option<f64>,
    /// Waiting for the other ranks of a shared pool.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub barrier: Option<f64>,
    /// Mapping the peers' shards before pinning a shared pool whole.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub attach: Option<f64>,
    /// Pinning.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pin: Option<f64>,
    /// Registering.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub register: Option<f64>,
    /// Releasing everything.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub teardown: Option<f64>,
}

/// The report of a pool (`hostpool alloc --json`). Field names are a contract.
#[derive(Debug, Clone, Serialize)]
pub struct PoolReport {
    /// hostpool's version (the workspace's, as `hostpool --version` and
    /// `hostpool.__version__` say).
    pub version: &'static str,
    /// Backing name.
    pub backing: String,
    /// Page size in bytes.
    pub page_size: u64,
    /// Bytes asked for.
    pub logical_bytes: u64,
    /// Bytes mapped.
    pub mapped_bytes: u64,
    /// Base address, hexadecimal.
    pub address: String,
    /// Segments of the mapping.
    pub segments: Vec<ExtentReport>,
    /// Resolved backing options.
    pub options: Value,
    /// What prefault did.
    pub prefault: Option<PrefaultOutcome>,
    /// Seconds per phase.
    pub phases: Phases,
    /// Pinning outcome.
    pub pin: PinReport,
    /// Registrations.
    pub registrations: Vec<RegistrationReport>,
    /// Capacity checks made before mapping.
    pub capacity: Vec<CapacityCheck>,
    /// Name, world, rank, role and shard of a shared pool; absent when private.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sharing: Option<crate::shared::SharingReport>,
    /// What `numa_node` asked for, the node bound, and where the sampled
    /// pages are after prefault (per shard, in a shared pool), when it asked.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub numa: Option<super::numa::NumaReport>,
    /// The lease, for a pool leased from a keeper (`[lease]`): name,
    /// instance, generation, content, attach_seconds, previous, tag; absent
    /// otherwise.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub keeper: Option<crate::lease::LeaseReport>,
    /// How much of the pool transparent huge pages back, when the backing
    /// asked for them (a hint the kernel may not take): after prefault.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub thp: Option<ThpReport>,
    /// What `huge_pages` asked for, what the pool got and why, when it asked.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub huge_pages: Option<HugePagesReport>,
    /// Why this pool was built rather than leased, when its keeper did not
    /// answer and `lease.fallback = "build"`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub keeper_fallback: Option<String>,
    /// Steps teardown could not undo (empty when all went well).
    pub teardown_issues: Vec<TeardownIssue>,
}

/// What `huge_pages` asked for, what the pool gets, and why (the report's
/// and the plan's `huge_pages` object).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct HugePagesReport {
    /// `required`, `prefer` or `off`.
    pub asked: &'static str,
    /// The page size the pool gets, as people write it (`2 MiB`, `4 KiB`).
    pub got: String,
    /// The same in bytes.
    pub page_size: u64,
    /// Why: the huge page pool holds it, or why it cannot.
    pub reason: String,
    /// Whether `prefer` fell back to base pages.
    pub fell_back: bool,
}

impl PoolReport {
    /// The first report of a pool mapped at `region` as `attached` says,
    /// in `map_secs`: made from what the plan's backing planned (`bp`,
    /// none for a lease), its pinner's name and `huge_pages`, and how the
    /// memory came; nothing pinned yet.
    pub(super) fn first(
        bp: Option<&crate::plugin::BackingPlan>,
        pin_kind: &str,
        huge_pages: Option<HugePagesReport>,
        region: crate::Region<'_>,
        attached: &crate::shared::Attached,
        map_secs: f64,
    ) -> PoolReport {
        let lease = attached.lease().cloned();
        PoolReport {
            version: crate::VERSION,
            backing: match (&lease, bp) {
                (Some(l), _) => l.backing.clone(),
                (None, Some(bp)) => bp.backing.to_string(),
                (None, None) => String::new(),
            },
            page_size: region.page().get(),
            logical_bytes: region.logical_len(),
            mapped_bytes: region.mapped_len(),
            address: format!("{:#x}", region.addr() as usize),
            segments: bp.map(segment_reports).unwrap_or_default(),
            options: bp.map_or(Value::Null, |bp| bp.options.clone()),
            prefault: None,
            phases: Phases {
                map: Some(map_secs),
                ..Phases::default()
            },
            pin: PinReport {
                kind: pin_kind.to_string(),
                status: PinStatus::Off,
                reason: None,
                details: Value::Null,
            },
            registrations: Vec::new(),
            capacity: match bp {
                Some(bp) if attached.checked_capacity() => bp.capacity.clone(),
                _ => Vec::new(),
            },
            sharing: attached.sharing().cloned(),
            numa: None,
            keeper: lease,
            keeper_fallback: None,
            huge_pages,
            thp: None,
            teardown_issues: Vec::new(),
        }
    }
}

/// The pin's details while it pins in the background.
pub(super) fn background_details(chunk: u64, extent: crate::Extent) -> Value {
    serde_json::json!({
        "background": true,
        "chunk": chunk,
        "bytes": extent.len,
    })
}
