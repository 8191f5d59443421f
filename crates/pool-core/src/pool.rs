//! A pool from config to teardown.
//!
//! The data flows one way: config → [`PoolPlan`] (pure: plugins resolved,
//! layout, capacity verdicts, prefault threads) → [`Pool::build`] (map,
//! prefault, pin, register) → [`PoolReport`]. Teardown runs the same steps
//! backwards: deregister, unpin, unmap/close/unlink. A failure part-way
//! through a build tears down what was built before the error is returned, and
//! a `Pool` that is dropped without [`Pool::teardown`] tears itself down.

use std::time::Instant;

use serde::Serialize;
use serde_json::Value;

use crate::background::PinStatus;
use crate::config::PoolConfig;
use crate::error::{Context, Result, TeardownIssue};
use crate::host::capacity::{self, CapacityCheck};
use crate::layout::{Extent, MAX_POOL_BYTES, format_bytes};
use crate::plugin::{self, PinnerPlugin, RegistrarPlugin};
use crate::plugin::{
    Backing, BackingPlan, ExtentReport, Mapping, Pin, Pinner, RankBarrier, Registrar, Registration,
};
use crate::prefault::{self, FaultIn, PrefaultOutcome, PrefaultPlan};
use crate::sys::Region;

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

/// Everything a build will do, resolved from the config. Making a plan
/// creates, maps and reserves nothing.
#[derive(Debug)]
pub struct PoolPlan {
    /// The config the plan was made from.
    pub config: PoolConfig,
    /// Why this backing.
    pub backing_reason: String,
    /// The configured backing.
    pub backing: Box<dyn Backing>,
    /// What the backing will map.
    pub backing_plan: BackingPlan,
    /// How it will be prefaulted.
    pub prefault: PrefaultPlan,
    /// The pinner, when one is asked for (shared with a background pin).
    pub pinner: Option<std::sync::Arc<dyn Pinner>>,
    /// The registrars, in order.
    pub registrars: Vec<Box<dyn Registrar>>,
}

impl PoolPlan {
    /// Resolve a config: plugins, sizes, capacity checks and prefault.
    ///
    /// # Errors
    /// Configuration errors (unknown plugins or tables, bad sizes, settings a
    /// backing cannot honour). Capacity shortfalls are *not* errors here:
    /// they are verdicts in the plan, and [`Pool::build`] refuses them.
    pub fn new(config: PoolConfig) -> Result<PoolPlan> {
        check_size(&config)?;
        check_dir(&config)?;
        plugin::validate_plugin_tables(&config)?;
        if let Some(node) = config.numa_node {
            crate::host::numa::check_node(node)?;
        }
        let selection = plugin::select_backing(&config)?;
        let backing = (selection.plugin.build)(config.plugin_table(selection.plugin.name))?;
        let backing_plan = backing.plan(&config)?;
        if let Some(block) = config.block_size {
            check_block(block.get(), backing_plan.size)?;
        }
        // A shared pool's rank faults only its own shard.
        let extent = match &config.sharing {
            Some(sharing) => {
                sharing.validate()?;
                crate::shared::shard(backing_plan.size, sharing)?
            }
            None => Extent {
                offset: 0,
                len: backing_plan.size.mapped(),
            },
        };
        let prefault = prefault::plan(
            config.prefault,
            extent,
            backing_plan.size.page(),
            config.threads,
        )?;
        let pinner = if let Some(kind) = &config.pin.kind {
            let p = plugin::lookup::<PinnerPlugin>(kind)?;
            Some(std::sync::Arc::from((p.build)(
                config.plugin_table(p.name),
            )?))
        } else {
            if config.pin.background {
                return Err(crate::Error::config(
                    "background pinning needs a pinner: set pin.kind (--pin cuda or --pin mlock)",
                ));
            }
            None
        };
        if config.pin.background_chunk.is_some_and(|c| c.get() == 0) {
            return Err(crate::Error::config(
                "pin.background_chunk is 0; give a size such as \"256MiB\", or leave it out",
            ));
        }
        let registrars = config
            .register
            .iter()
            .map(|name| {
                let r = plugin::lookup::<RegistrarPlugin>(name)?;
                (r.build)(config.plugin_table(r.name))
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(PoolPlan {
            backing_reason: selection.reason,
            backing,
            backing_plan,
            prefault,
            pinner,
            registrars,
            config,
        })
    }

    /// The plan as a serializable report (`hostpool plan --json`).
    pub fn report(&self) -> PlanReport {
        let bp = &self.backing_plan;
        let mut explain = vec![self.backing_reason.clone()];
        explain.extend(bp.explain.iter().cloned());
        explain.extend(self.prefault.explain.iter().cloned());
        explain.push(match &self.pinner {
            Some(p) => format!(
                "pin with {} ({})",
                p.name(),
                if self.config.pin.required {
                    "required"
                } else {
                    "best effort"
                }
            ),
            None => "no pinning (pin kind off)".to_string(),
        });
        for r in &self.registrars {
            explain.push(format!("register with {}", r.name()));
        }
        if let Some(node) = self.config.numa_node {
            explain.push(format!(
                "bind to NUMA node {node} with mbind(MPOL_BIND) before prefault (first touch decides \
                 placement), then check sampled pages with get_mempolicy"
            ));
        }
        for c in &bp.capacity {
            explain.push(format!(
                "capacity {}: need {}, free {} ({}): {:?}",
                c.resource,
                format_bytes(c.need),
                c.free.map_or("unknown".to_string(), format_bytes),
                c.source,
                c.verdict
            ));
        }
        let size = bp.size;
        let shards: Vec<ExtentReport> = match &self.config.sharing {
            Some(s) => crate::layout::shards(size.mapped(), size.page(), s.world)
                .map(|v| v.into_iter().map(ExtentReport::from).collect())
                .unwrap_or_default(),
            None => crate::layout::shards(
                size.page().round_down(self.prefault.extent.len),
                size.page(),
                u32::try_from(self.prefault.threads).unwrap_or(1),
            )
            .map(|v| v.into_iter().map(ExtentReport::from).collect())
            .unwrap_or_default(),
        };
        let pin_plan = self
            .pinner
            .as_ref()
            .map_or(Value::Null, |p| p.plan(size, &self.config));
        let registration_plans = self
            .registrars
            .iter()
            .map(|r| serde_json::json!({"kind": r.name(), "plan": r.plan(size, &self.config)}))
            .collect();
        let prefault_cost = plugin::lookup::<plugin::BackingPlugin>(bp.backing)
            .ok()
            .and_then(|r| r.cost)
            .unwrap_or(plugin::PrefaultCost::DEFAULT);
        let predicted = crate::plugin::predict(
            size,
            &crate::plugin::CostInputs {
                prefault: prefault_cost,
                prefault_bytes: self.prefault.extent.len,
                threads: self.prefault.threads,
                pin: self
                    .pinner
                    .as_ref()
                    .and_then(|p| plugin::lookup::<PinnerPlugin>(p.name()).ok())
                    .and_then(|r| r.cost),
                registrars: self
                    .registrars
                    .iter()
                    .filter_map(|r| plugin::lookup::<RegistrarPlugin>(r.name()).ok())
                    .filter_map(|r| r.cost)
                    .collect(),
            },
        );
        explain.push(format!(
            "predicted: prefault {:.1} s{}{} ({})",
            predicted.prefault,
            predicted
                .pin
                .map(|p| format!(", pin {p:.1} s"))
                .unwrap_or_default(),
            predicted
                .register
                .map(|r| format!(", register {r:.1} s"))
                .unwrap_or_default(),
            predicted.basis
        ));
        PlanReport {
            shards,
            pin_plan,
            registration_plans,
            predicted_seconds: predicted,
            backing: bp.backing.to_string(),
            page_size: bp.size.page().get(),
            logical_bytes: bp.size.logical(),
            mapped_bytes: bp.size.mapped(),
            segments: bp
                .segments
                .iter()
                .copied()
                .map(ExtentReport::from)
                .collect(),
            files: bp.files.iter().map(|p| p.display().to_string()).collect(),
            options: bp.options.clone(),
            prefault: PrefaultPlanReport {
                method: self.prefault.method.name(),
                threads: self.prefault.threads,
                offset: self.prefault.extent.offset,
                bytes: self.prefault.extent.len,
            },
            pin: PinPlanReport {
                kind: self.config.pin.kind_name().to_string(),
                required: self.config.pin.required,
            },
            registrations: self
                .registrars
                .iter()
                .map(|r| r.name().to_string())
                .collect(),
            capacity: bp.capacity.clone(),
            fits: bp
                .capacity
                .iter()
                .all(|c| c.verdict != capacity::Verdict::Short),
            explain,
        }
    }
}

/// `dir`, where it exists, must be a directory: a file or a device there
/// (`--dir /dev/null`, whose devtmpfs passes for tmpfs) is bad input, not a
/// failed `open`. A missing dir is left to the backings, which say how to
/// make the one they serve.
fn check_dir(config: &PoolConfig) -> Result<()> {
    let Some(dir) = &config.dir else {
        return Ok(());
    };
    let Ok(meta) = std::fs::metadata(dir) else {
        return Ok(());
    };
    if meta.is_dir() {
        return Ok(());
    }
    use std::os::unix::fs::FileTypeExt;
    let t = meta.file_type();
    let kind = if t.is_char_device() {
        "a character device"
    } else if t.is_block_device() {
        "a block device"
    } else if t.is_fifo() {
        "a FIFO"
    } else if t.is_socket() {
        "a socket"
    } else {
        "a file"
    };
    Err(crate::Error::config(format!(
        "dir {} is not a directory (it is {kind}); give the directory the pool's files are to \
         be made in",
        dir.display()
    )))
}

/// A pool larger than [`MAX_POOL_BYTES`] is a configuration error that names
/// the limit.
fn check_size(config: &PoolConfig) -> Result<()> {
    let size = config.size.get();
    if size > MAX_POOL_BYTES {
        return Err(crate::Error::config(format!(
            "size = {} ({size} bytes) is more than the {} a pool can have (the user address space \
             of x86-64 with 5-level page tables); ask for at most {} (--size {})",
            format_bytes(size),
            format_bytes(MAX_POOL_BYTES),
            format_bytes(MAX_POOL_BYTES),
            format_bytes(MAX_POOL_BYTES).replace(' ', "")
        )));
    }
    Ok(())
}

/// The caller's block is any positive number of bytes (an engine's copy unit:
/// vLLM's 61 × 512 B, SGLang's 300 MiB pages). Registration chunks (CUDA
/// chunks, RDMA and NIXL regions, background pin chunks) are cut on
/// multiples of `lcm(block_size, page size)`, which is page-aligned and never
/// splits a block, so that unit must fit in the pool; a zero block, a unit
/// larger than the pool, or one that overflows 64 bits is a configuration
/// error. Checked at plan time whatever the pin policy.
fn check_block(block: u64, size: crate::layout::MappedSize) -> Result<()> {
    let page = size.page();
    let pool = size.mapped();
    if block == 0 {
        return Err(crate::Error::config(format!(
            "block_size = 0 bytes is not a positive number of bytes, so there is no registration \
             unit lcm(block_size, page size) to cut the {} ({pool} bytes) pool of {page} pages \
             on; give the engine's block (its copy unit) in bytes, any positive size such as \
             31232 or 2MiB, or leave block_size out to use the page size",
            format_bytes(pool)
        )));
    }
    let too_big = |unit: String| {
        crate::Error::config(format!(
            "block_size = {} ({block} bytes) with the {page} ({} bytes) page size gives a \
             registration unit lcm(block_size, page size) = {unit}, more than the {} ({pool} \
             bytes) pool, and registration chunks are cut on multiples of that unit; give a \
             block_size whose lcm with the page size is at most the pool size (a smaller block, \
             or one with more factors of two in common with the page), or a larger pool",
            format_bytes(block),
            page.get(),
            format_bytes(pool)
        ))
    };
    match crate::layout::lcm(page.get(), block) {
        Ok(unit) if unit <= pool => Ok(()),
        Ok(unit) => Err(too_big(format!("{} ({unit} bytes)", format_bytes(unit)))),
        Err(_) => Err(too_big(
            "more than 16 EiB (it overflows a 64-bit byte count)".into(),
        )),
    }
}

/// `hostpool plan --json`.
#[derive(Debug, Clone, Serialize)]
pub struct PlanReport {
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
    /// Every choice and why, one line each.
    pub explain: Vec<String>,
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
    pub sharing: Option<Value>,
    /// NUMA placement found after prefault, when a node was asked for.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub numa: Option<crate::host::numa::Placement>,
    /// Steps teardown could not undo (empty when all went well).
    pub teardown_issues: Vec<TeardownIssue>,
}

/// A built pool: owns its mapping, pin and registrations.
#[derive(Debug)]
pub struct Pool {
    mapping: Option<Box<dyn Mapping>>,
    pin: Option<Box<dyn Pin>>,
    /// A background pin, while the pool has one.
    background: Option<crate::background::Background>,
    /// What the pin covers (offsets in the pool), when a pinner was asked for.
    pin_extent: Option<Extent>,
    registrations: Vec<Box<dyn Registration>>,
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
    /// Build the pool a plan describes: refuse a capacity shortfall, map,
    /// prefault, pin, register.
    ///
    /// # Errors
    /// The first failing step's error, after everything built so far has been
    /// torn down. A best-effort pin that fails is not an error: the report
    /// says `skipped` with the reason.
    pub fn build(plan: &PoolPlan, observer: &dyn Observer) -> Result<Pool> {
        Pool::build_with(plan, observer, None)
    }

    /// As [`Pool::build`], with the embedding engine's own barrier for a
    /// shared pool (the built-in one uses the pool's control file).
    ///
    /// # Errors
    /// As for [`Pool::build`], and [`crate::Error::Peer`] when a peer rank
    /// failed, died or never attached.
    pub fn build_with(
        plan: &PoolPlan,
        observer: &dyn Observer,
        barrier: Option<&dyn RankBarrier>,
    ) -> Result<Pool> {
        let bp = &plan.backing_plan;
        // A shared pool's creator checks capacity itself: once it has
        // reserved the pages, the counts look too low to joiners.
        if plan.config.sharing.is_none() {
            capacity::require(&bp.capacity)?;
        }
        let (mapping, map_secs) = timed(observer, Phase::Map, bp.size.mapped(), || {
            plan.backing.map(bp, &plan.config)
        });
        let mapping = mapping?;
        let report = {
            let region = mapping.region();
            PoolReport {
                backing: bp.backing.to_string(),
                page_size: region.page().get(),
                logical_bytes: region.logical_len(),
                mapped_bytes: region.mapped_len(),
                address: format!("{:#x}", region.addr() as usize),
                segments: bp
                    .segments
                    .iter()
                    .copied()
                    .map(ExtentReport::from)
                    .collect(),
                options: bp.options.clone(),
                prefault: None,
                phases: Phases {
                    map: Some(map_secs),
                    ..Phases::default()
                },
                pin: PinReport {
                    kind: plan.config.pin.kind_name().to_string(),
                    status: PinStatus::Off,
                    reason: None,
                    details: Value::Null,
                },
                registrations: Vec::new(),
                capacity: if mapping.checked_capacity() {
                    bp.capacity.clone()
                } else {
                    Vec::new()
                },
                sharing: mapping.sharing(),
                numa: None,
                teardown_issues: Vec::new(),
            }
        };
        let mut pool = Pool {
            mapping: Some(mapping),
            pin: None,
            background: None,
            pin_extent: None,
            registrations: Vec::new(),
            report,
            owner: std::process::id(),
        };
        // From here on, an early return drops `pool`, which tears down.
        let shared = plan.config.sharing.is_some();
        let Some(mapping) = pool.mapping.as_mut() else {
            return Err(gone());
        };
        if let Some(node) = plan.config.numa_node
            && let Err(e) = crate::host::numa::bind(&mapping.region(), node)
        {
            // A shared pool's peers learn the cause rather than a vanished rank.
            if shared {
                let _ = mapping.rendezvous(Err(e.to_string()), barrier);
            }
            return Err(e);
        }
        let (outcome, secs) = timed(observer, Phase::Prefault, plan.prefault.extent.len, || {
            // Touching a page the backing cannot supply is SIGBUS: have the
            // backing allocate the range first, which fails cleanly instead.
            if matches!(plan.prefault.method, prefault::PrefaultMethod::Touch(_)) {
                mapping.reserve_for_touch(plan.prefault.extent)?;
            }
            prefault::run(&mapping.region(), &plan.prefault, &|done| {
                observer.progress(Phase::Prefault, done)
            })
        });
        pool.report.phases.prefault = Some(secs);
        // Every rank of a shared pool meets its peers, even after a failure,
        // so that they fail on its error instead of waiting for it.
        let met = if shared {
            let t = Instant::now();
            let met = mapping.rendezvous(
                outcome.as_ref().map(|_| ()).map_err(|e| e.to_string()),
                barrier,
            );
            pool.report.phases.barrier = Some(t.elapsed().as_secs_f64());
            met
        } else {
            Ok(())
        };
        pool.report.prefault = Some(outcome?);
        met?;
        let region = mapping.region();
        // A shared pool pinned whole: fill the page tables of the peers'
        // shards now, in one pass, rather than let the driver fault them in
        // one page at a time under its lock.
        if shared && plan.pinner.is_some() && plan.config.pin.scope == crate::config::PinScope::Pool
        {
            let (attached, secs) = timed(
                observer,
                Phase::Attach,
                region.mapped_len() - plan.prefault.extent.len,
                || attach_peers(&region, plan.prefault.extent),
            );
            pool.report.phases.attach = Some(secs);
            attached?;
        }
        if let Some(node) = plan.config.numa_node {
            let placement = crate::host::numa::verify(&region, node, NUMA_SAMPLES)?;
            pool.report.numa = Some(placement.clone());
            // Exact placement is required only where this process faulted
            // every page: not in a shared pool (peers fault their shards),
            // and not without prefault (pages are not in memory yet).
            let faulted_all = !shared
                && !matches!(
                    plan.prefault.method,
                    prefault::PrefaultMethod::NoPrefault(_)
                );
            if faulted_all {
                placement.require_exact()?;
            }
        }

        crate::interrupt::check()?;
        // Pin the whole pool, or with scope = shard only this rank's shard;
        // an empty shard (more ranks than pages) pins nothing.
        let pin_extent = match (shared, plan.config.pin.scope) {
            (true, crate::config::PinScope::Shard) => plan.prefault.extent,
            _ => Extent {
                offset: 0,
                len: region.mapped_len(),
            },
        };
        let pin_region = region.sub(pin_extent).filter(|_| pin_extent.len > 0);
        if plan.pinner.is_some() {
            pool.pin_extent = Some(pin_extent);
        }
        match (&plan.pinner, pin_region) {
            (Some(_), None) => {
                pool.report.pin.status = PinStatus::Skipped;
                pool.report.pin.reason = Some(
                    "this rank's shard is empty (more ranks than pages): nothing to pin".into(),
                );
            }
            (Some(pinner), Some(_)) if plan.config.pin.background => {
                // The pool stops (and joins) it in `release`, before it
                // releases the mapping.
                let started = crate::background::Background::start(
                    region,
                    pin_extent,
                    std::sync::Arc::clone(pinner),
                    &plan.config,
                )?;
                pool.report.pin.status = PinStatus::Pinning;
                pool.report.pin.details = serde_json::json!({
                    "background": true,
                    "chunk": started.chunk(),
                    "bytes": pin_extent.len,
                });
                pool.background = Some(started);
            }
            (Some(pinner), Some(pin_region)) => {
                let (pinned, secs) = timed(observer, Phase::Pin, pin_region.mapped_len(), || {
                    pinner.pin(pin_region, &plan.config)
                });
                pool.report.phases.pin = Some(secs);
                match pinned {
                    Ok(pin) => {
                        pool.report.pin.status = PinStatus::Pinned;
                        pool.report.pin.details = pin.details();
                        pool.pin = Some(pin);
                    }
                    Err(e) if !plan.config.pin.required => {
                        tracing::warn!(
                            "pinning with {} skipped, the pool stays pageable: {e}",
                            pinner.name()
                        );
                        pool.report.pin.status = PinStatus::Skipped;
                        pool.report.pin.reason = Some(e.to_string());
                    }
                    Err(e) => return Err(e),
                }
            }
            (None, _) => {}
        }

        crate::interrupt::check()?;
        if !plan.registrars.is_empty() {
            let (registered, secs) = timed(observer, Phase::Register, region.mapped_len(), || {
                for r in &plan.registrars {
                    let reg = r.register(region, &plan.config)?;
                    pool.report.registrations.push(RegistrationReport {
                        kind: r.name().to_string(),
                        details: reg.details(),
                    });
                    pool.registrations.push(reg);
                }
                Ok::<(), crate::Error>(())
            });
            pool.report.phases.register = Some(secs);
            registered?;
        }
        Ok(pool)
    }

    /// The pool's memory, for as long as the pool is borrowed (`None` only
    /// once torn down).
    pub fn region(&self) -> Option<Region<'_>> {
        self.mapping.as_ref().map(|m| m.region())
    }

    /// The report so far (teardown not yet included).
    pub fn report(&self) -> &PoolReport {
        &self.report
    }

    /// Where the pin stands: for a background pin its progress so far, for
    /// a foreground one its outcome.
    pub fn pin_status(&self) -> crate::PinProgress {
        if let Some(owner) = self.inherited_from()
            && self.report.pin.status != PinStatus::Off
        {
            return crate::PinProgress::settled(
                PinStatus::Skipped,
                None,
                Some(format!(
                    "this process inherited the pool from pid {owner} through fork: pins and \
                     registrations stay with the process that made them, so this copy is not \
                     pinned; build the pool in this process to pin it here"
                )),
                0.0,
            );
        }
        if let Some(bg) = &self.background {
            return bg.progress();
        }
        let pin = &self.report.pin;
        crate::PinProgress::settled(
            pin.status,
            self.pin_extent,
            pin.reason.clone(),
            self.report.phases.pin.unwrap_or(0.0),
        )
    }

    /// Wait until the pin is settled (`pinned`, `skipped` or `failed`), at
    /// most `timeout` (`None`: as long as it takes), and return where it
    /// stands; still `pinning` after a timeout or a stop request.
    ///
    /// # Errors
    /// The error of a required background pin that failed (nothing stays
    /// pinned).
    pub fn wait_pinned(&self, timeout: Option<std::time::Duration>) -> Result<crate::PinProgress> {
        let progress = match &self.background {
            // A forked child has no pinning thread to wait for.
            Some(bg) if self.inherited_from().is_none() => bg.wait(timeout),
            _ => self.pin_status(),
        };
        if progress.status == PinStatus::Failed {
            return Err(crate::background::failure(&progress, &self.report.pin.kind));
        }
        Ok(progress)
    }

    /// Pause a background pin between chunks (the chunk being pinned
    /// finishes first), so an engine can keep the driver to its own
    /// transfers for a while; [`Pool::resume_pinning`] goes on. While
    /// paused, [`Pool::pin_status`] says `paused` and [`Pool::wait_pinned`]
    /// waits; teardown still stops and unpins. Whether a background pin was
    /// running (`false`: nothing to pause).
    pub fn pause_pinning(&self) -> bool {
        self.set_paused(true)
    }

    /// Resume a paused background pin. Whether one was running.
    pub fn resume_pinning(&self) -> bool {
        self.set_paused(false)
    }

    fn set_paused(&self, paused: bool) -> bool {
        match &self.background {
            Some(bg) if self.inherited_from().is_none() => bg.pause(paused),
            _ => false,
        }
    }

    /// The pid of the process that built the pool, when this process is a
    /// child that inherited it through `fork`; `None` in the builder.
    pub fn inherited_from(&self) -> Option<u32> {
        (std::process::id() != self.owner).then_some(self.owner)
    }

    /// Files backing the pool that exist right now.
    pub fn files(&self) -> Vec<std::path::PathBuf> {
        self.mapping.as_ref().map(|m| m.files()).unwrap_or_default()
    }

    /// Tear down in reverse (deregister, unpin, unmap/close/unlink) and return
    /// the final report, with the teardown time and anything not undone.
    pub fn teardown(mut self) -> PoolReport {
        self.release(&Quiet);
        self.report.clone()
    }

    /// As [`Pool::teardown`], reporting the phase to an observer.
    pub fn teardown_observed(mut self, observer: &dyn Observer) -> PoolReport {
        self.release(observer);
        self.report.clone()
    }

    fn release(&mut self, observer: &dyn Observer) {
        if self.mapping.is_none() {
            return;
        }
        if let Some(owner) = self.inherited_from() {
            self.release_inherited(owner);
            return;
        }
        let (issues, secs) = timed(observer, Phase::Teardown, self.report.mapped_bytes, || {
            let mut issues = Vec::new();
            // A background pin stops after its current chunk and unpins, so
            // nothing is unmapped under a pinning call.
            if let Some(bg) = self.background.take() {
                let (progress, undone) = bg.stop();
                issues.extend(undone);
                // A pin stopped part way is skipped, whatever it pinned.
                self.report.pin.status = match progress.status {
                    PinStatus::Pinning => PinStatus::Skipped,
                    done => done,
                };
                self.report.pin.reason = progress.error.clone();
                if let Some(d) = self.report.pin.details.as_object_mut() {
                    d.insert("pinned_bytes".into(), progress.pinned_bytes.into());
                    d.insert("chunks".into(), progress.chunks.into());
                    d.insert("seconds".into(), progress.seconds.into());
                }
            }
            while let Some(reg) = self.registrations.pop() {
                issues.extend(reg.deregister());
            }
            if let Some(pin) = self.pin.take() {
                issues.extend(pin.unpin());
            }
            if let Some(mapping) = self.mapping.take() {
                issues.extend(mapping.teardown());
            }
            issues
        });
        self.report.phases.teardown = Some(secs);
        self.report.teardown_issues.extend(issues);
    }
}

impl Pool {
    /// Teardown in a child that inherited the pool through `fork`: only this
    /// process's view is given back. The pinning thread exists only in the
    /// parent (joining it here would fail), and the pins and registrations
    /// are the parent's (unregistering them from a child is at best refused
    /// and at worst breaks the parent's), so they are forgotten, never run.
    /// The mapping is released as usual: after the build it holds no named
    /// file, so that unmaps and closes this process's descriptors only.
    fn release_inherited(&mut self, owner: u32) {
        let t = Instant::now();
        tracing::info!(
            "releasing a pool inherited from pid {owner} through fork: only this process's view; \
             its pins and registrations stay with pid {owner}"
        );
        std::mem::forget(self.background.take());
        std::mem::forget(std::mem::take(&mut self.registrations));
        std::mem::forget(self.pin.take());
        let issues = self
            .mapping
            .take()
            .map(Mapping::teardown)
            .unwrap_or_default();
        if self.report.pin.status != PinStatus::Off {
            self.report.pin.status = PinStatus::Skipped;
            self.report.pin.reason = Some(format!("inherited from pid {owner} through fork"));
        }
        self.report.phases.teardown = Some(t.elapsed().as_secs_f64());
        self.report.teardown_issues.extend(issues);
    }
}

fn gone() -> crate::Error {
    crate::Error::Plugin {
        what: "pool".into(),
        message: "the mapping was released while the pool was being built".into(),
        source: None,
    }
}

/// Map every page outside `own` (pages the peers faulted) into this
/// process's page tables with `MADV_POPULATE_READ`.
fn attach_peers(region: &Region<'_>, own: Extent) -> Result<()> {
    let before = Extent {
        offset: 0,
        len: own.offset,
    };
    let after = Extent {
        offset: own.end(),
        len: region.mapped_len() - own.end(),
    };
    for e in [before, after].into_iter().filter(|e| e.len > 0) {
        region.populate_read(e).map_err(|source| {
            let mut context = Context::new(e.len, region.page()).remedy(format!(
                "attaching to the peers' pages at offset {} failed",
                e.offset
            ));
            if let Some(addr) = region.at(e.offset) {
                context = context.addr(addr as usize);
            }
            crate::Error::os("madvise(MADV_POPULATE_READ)", source, context)
        })?;
    }
    Ok(())
}

impl Drop for Pool {
    fn drop(&mut self) {
        self.release(&Quiet);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::layout::{PageSize, round_to_page};
    use crate::size::ByteSize;

    #[test]
    fn a_zero_block_or_one_whose_lcm_with_the_page_exceeds_the_pool_is_a_usage_error() {
        let huge = round_to_page(4 << 30, PageSize::HUGE_1G).unwrap();
        let small = round_to_page(8 << 20, PageSize::BASE_4K).unwrap();
        let tiny = round_to_page(64 << 10, PageSize::BASE_4K).unwrap();
        // 31232 = 61 × 512 and 4096 = 8 × 512: the lcm is 61 × 4096.
        let vllm = 61 * 512;
        let vllm_unit = 61 * 4096;
        for (block, size, says) in [
            (
                0,
                small,
                vec![
                    "block_size = 0 bytes",
                    "not a positive number of bytes",
                    "lcm(block_size, page size)",
                    "4 KiB pages",
                    "8 MiB (8388608 bytes) pool",
                ],
            ),
            (
                vllm,
                tiny,
                vec![
                    "block_size = 30.50 KiB (31232 bytes)",
                    "4 KiB (4096 bytes) page size",
                    "lcm(block_size, page size) = 244 KiB (249856 bytes)",
                    "more than the 64 KiB (65536 bytes) pool",
                    "or a larger pool",
                ],
            ),
            (
                5 << 30,
                huge,
                vec![
                    "block_size = 5 GiB",
                    "1 GiB (1073741824 bytes) page size",
                    "= 5 GiB (5368709120 bytes)",
                    "more than the 4 GiB (4294967296 bytes) pool",
                ],
            ),
            (
                // Odd: 4097 GiB of unit for a 4 GiB pool.
                4097,
                huge,
                vec![
                    "(4097 bytes)",
                    "= 4.00 TiB (4399120252928 bytes)",
                    "4 GiB (4294967296 bytes) pool",
                ],
            ),
            (
                // Odd, so its lcm with a 1 GiB page overflows 64 bits.
                u64::MAX,
                huge,
                vec![
                    "18446744073709551615 bytes",
                    "1 GiB (1073741824 bytes) page size",
                    "more than 16 EiB",
                    "4 GiB (4294967296 bytes) pool",
                ],
            ),
        ] {
            let e = check_block(block, size).unwrap_err();
            assert_eq!(e.exit_code(), 2, "{e}");
            let msg = e.to_string();
            for want in says {
                assert!(msg.contains(want), "{block}: wants {want:?}: {msg}");
            }
            assert!(!msg.contains("multiple of 4 KiB"), "the old rule: {msg}");
        }
        assert_eq!(crate::layout::lcm(4096, vllm), Ok(vllm_unit));
        for (block, size) in [
            (1, small),
            (1000, small),
            (vllm, small),
            (4096, small),
            (4097, round_to_page(32 << 20, PageSize::BASE_4K).unwrap()),
            (2 << 20, huge),
            (1 << 30, huge),
            (64 << 10, huge),
            (
                300 << 20,
                round_to_page(600 << 20, PageSize::HUGE_2M).unwrap(),
            ),
            // The unit exactly fills the pool.
            (vllm, round_to_page(vllm_unit, PageSize::BASE_4K).unwrap()),
        ] {
            check_block(block, size).unwrap_or_else(|e| panic!("{block}: {e}"));
        }
    }

    #[test]
    fn pools_beyond_the_address_space_name_the_limit() {
        let config = PoolConfig {
            size: ByteSize(u64::MAX),
            ..PoolConfig::default()
        };
        let e = check_size(&config).unwrap_err();
        assert_eq!(e.exit_code(), 2);
        let msg = e.to_string();
        assert!(
            msg.contains("64 PiB") && !msg.contains("too large"),
            "{msg}"
        );
        let config = PoolConfig {
            size: ByteSize(MAX_POOL_BYTES),
            ..PoolConfig::default()
        };
        check_size(&config).unwrap();
    }
}
