//! The `hostpool` command line: `alloc`, `plan` and `plugins`.
//!
//! Exit status: 0 success; 1 a runtime failure (including a plan whose
//! capacity checks fail); 2 a usage or configuration error. Errors are one
//! paragraph on stderr.

mod bench;
mod doctor;
mod output;
mod progress;

use std::io::{IsTerminal, Write};
use std::num::NonZeroUsize;
use std::path::PathBuf;

use clap::{Args, Parser, Subcommand, ValueEnum};
use pool_core::plugin::{self, PluginRecord};
use pool_core::{
    BackingPlugin, ByteSize, Error, PinnerPlugin, Pool, PoolConfig, PoolPlan, PrefaultChoice,
    RegistrarPlugin,
};

use crate::sys::TerminationSignals;

/// Build, prefault, pin and register large host-memory pools for GPU KV-cache offload.
#[derive(Debug, Parser)]
#[command(name = "hostpool", version, about, long_about = None)]
pub struct Cli {
    /// More logging on stderr (-v info, -vv debug); RUST_LOG overrides.
    #[arg(short, long, action = clap::ArgAction::Count, global = true)]
    pub verbose: u8,
    /// The command.
    #[command(subcommand)]
    pub command: Command,
}

/// The subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Build the pool, prefault it, print a report, tear it down (or hold it).
    Alloc(AllocArgs),
    /// Show everything `alloc` would do and why, with no side effects.
    Plan(PlanArgs),
    /// List the registered backings, pinners and registrars.
    Plugins(PluginsArgs),
    /// Remove pool files that no live process holds (left by crashed runs).
    Gc(GcArgs),
    /// Say whether this node can hold a pool, and why not, with remedies.
    Doctor(doctor::DoctorArgs),
    /// Measure memset, prefault per backing, page size, method and threads, and mlock.
    Bench(bench::BenchArgs),
}

/// `hostpool gc`.
#[derive(Debug, Args)]
pub struct GcArgs {
    /// Directory to scan (repeatable; default /dev/shm and every hugetlbfs mount).
    #[arg(long, value_name = "DIR")]
    pub dir: Vec<PathBuf>,
    /// Print as JSON on stdout.
    #[arg(long)]
    pub json: bool,
}

/// Flags that describe a pool; each overrides the same key of `--config`.
#[derive(Debug, Clone, Default, Args)]
pub struct PoolArgs {
    /// Config file (TOML, or JSON); flags override its keys.
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Pool size: bytes or an IEC unit (4GiB, 512MiB). Default 1GiB.
    #[arg(long, value_name = "SIZE")]
    pub size: Option<ByteSize>,
    /// Backing plugin (anon, …, or auto).
    #[arg(long, value_name = "NAME")]
    pub backing: Option<String>,
    /// Directory for file-backed pools (a hugetlbfs mount or tmpfs).
    #[arg(long, value_name = "DIR")]
    pub dir: Option<PathBuf>,
    /// Page size the backing must use (2MiB, 1GiB).
    #[arg(long, value_name = "SIZE")]
    pub page_size: Option<ByteSize>,
    /// Prefault threads (default: available cores, at least 64 MiB each).
    #[arg(long, value_name = "N")]
    pub threads: Option<NonZeroUsize>,
    /// Prefault method.
    #[arg(long, value_enum, value_name = "METHOD")]
    pub prefault: Option<PrefaultArg>,
    /// Pin the pool with this pinner.
    #[arg(long, value_name = "KIND")]
    pub pin: Option<String>,
    /// Fail when pinning fails (default: warn and keep the pool pageable).
    #[arg(long)]
    pub pin_required: bool,
    /// Check the memlock bound before pinning (check), or not (ignore).
    #[arg(long, value_enum, value_name = "POLICY")]
    pub memlock_bound: Option<MemlockArg>,
    /// Pin the whole pool, or in a shared pool only this rank's shard.
    #[arg(long, value_enum, value_name = "SCOPE")]
    pub pin_scope: Option<ScopeArg>,
    /// Register the pool with this registrar (repeatable).
    #[arg(long, value_name = "KIND")]
    pub register: Vec<String>,
    /// Share the pool between ranks under this name (with --world and --rank).
    #[arg(long, value_name = "NAME", requires_all = ["world", "rank"])]
    pub shared: Option<String>,
    /// Number of ranks sharing the pool.
    #[arg(long, value_name = "N", requires = "shared")]
    pub world: Option<u32>,
    /// This process's rank, 0 to N-1.
    #[arg(long, value_name = "R", requires = "shared")]
    pub rank: Option<u32>,
    /// Seconds to wait for the creator and for ranks that never attach (default 30).
    #[arg(long, value_name = "SECS", requires = "shared")]
    pub attach_timeout: Option<f64>,
    /// Bind the pool's pages to this NUMA node.
    #[arg(long, value_name = "N")]
    pub numa_node: Option<u32>,
}

/// `--memlock-bound` values.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum MemlockArg {
    /// Compare the pool with the memlock bound before pinning.
    Check,
    /// Do not.
    Ignore,
}

/// `--pin-scope` values.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum ScopeArg {
    /// The whole pool.
    Pool,
    /// This rank's shard of a shared pool.
    Shard,
}

/// `--prefault` values.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum PrefaultArg {
    /// populate-write where the kernel has it, else touch.
    Auto,
    /// madvise(MADV_POPULATE_WRITE).
    PopulateWrite,
    /// One read-modify-write per page.
    Touch,
    /// No prefault.
    None,
}

impl From<PrefaultArg> for PrefaultChoice {
    fn from(a: PrefaultArg) -> Self {
        match a {
            PrefaultArg::Auto => PrefaultChoice::Auto,
            PrefaultArg::PopulateWrite => PrefaultChoice::PopulateWrite,
            PrefaultArg::Touch => PrefaultChoice::Touch,
            PrefaultArg::None => PrefaultChoice::None,
        }
    }
}

/// `hostpool alloc`.
#[derive(Debug, Args)]
pub struct AllocArgs {
    /// The pool.
    #[command(flatten)]
    pub pool: PoolArgs,
    /// Keep the pool after printing the report until SIGINT or SIGTERM, then tear down.
    #[arg(long)]
    pub hold: bool,
    /// Print the report as JSON on stdout (and no progress bar).
    #[arg(long)]
    pub json: bool,
    /// With --pin cuda: copy up to 1 GiB host→device→host from the pinned
    /// pool, check the data, and report both bandwidths (`verify_copy`).
    #[arg(long)]
    pub verify_copy: bool,
}

/// `hostpool plan`.
#[derive(Debug, Args)]
pub struct PlanArgs {
    /// The pool.
    #[command(flatten)]
    pub pool: PoolArgs,
    /// Print the plan as JSON on stdout.
    #[arg(long)]
    pub json: bool,
}

/// `hostpool plugins`.
#[derive(Debug, Args)]
pub struct PluginsArgs {
    /// Print as JSON on stdout.
    #[arg(long)]
    pub json: bool,
}

/// Run the CLI on the process arguments; returns the exit status.
pub fn main() -> i32 {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => {
            // Help and version go to stdout with status 0; usage errors to
            // stderr with status 2.
            let _ = e.print();
            return e.exit_code();
        }
    };
    init_logging(cli.verbose);
    match run(cli) {
        Ok(code) => code,
        Err(e) => {
            report_error(&e);
            e.exit_code()
        }
    }
}

fn init_logging(verbose: u8) {
    let default = match verbose {
        0 => "warn",
        1 => "info",
        _ => "debug",
    };
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .without_time()
        .with_target(false)
        .try_init();
}

/// Print an error as one paragraph: the message, then its causes.
fn report_error(e: &Error) {
    let mut text = format!("hostpool: error: {e}");
    let mut source = std::error::Error::source(e);
    while let Some(s) = source {
        text.push_str(&format!(" (cause: {s})"));
        source = s.source();
    }
    eprintln!("{text}");
}

fn run(cli: Cli) -> Result<i32, Error> {
    match cli.command {
        Command::Alloc(args) => alloc(args),
        Command::Plan(args) => plan(args),
        Command::Plugins(args) => plugins(args),
        Command::Gc(args) => gc(args),
        Command::Doctor(args) => doctor::run(args),
        Command::Bench(args) => bench::run(args),
    }
}

/// The config from `--config` (or the embedded default) with flags applied.
///
/// # Errors
/// [`Error::Config`] for an unreadable or invalid file.
pub fn resolve_config(args: &PoolArgs) -> Result<PoolConfig, Error> {
    let mut config = match &args.config {
        Some(path) => PoolConfig::from_path(path)?,
        None => PoolConfig::default(),
    };
    if let Some(size) = args.size {
        config.size = size;
    }
    if let Some(backing) = &args.backing {
        config.backing = backing.clone();
    }
    if let Some(dir) = &args.dir {
        config.dir = Some(dir.clone());
    }
    if let Some(page) = args.page_size {
        config.page_size = Some(page);
    }
    if let Some(threads) = args.threads {
        config.threads = Some(threads);
    }
    if let Some(prefault) = args.prefault {
        config.prefault = prefault.into();
    }
    if let Some(pin) = &args.pin {
        config.pin.kind = pin.clone();
    }
    if args.pin_required {
        config.pin.required = true;
    }
    if let Some(m) = args.memlock_bound {
        config.pin.memlock_bound = match m {
            MemlockArg::Check => pool_core::host::memlock::MemlockPolicy::Check,
            MemlockArg::Ignore => pool_core::host::memlock::MemlockPolicy::Ignore,
        };
    }
    if let Some(scope) = args.pin_scope {
        config.pin.scope = match scope {
            ScopeArg::Pool => pool_core::PinScope::Pool,
            ScopeArg::Shard => pool_core::PinScope::Shard,
        };
    }
    if !args.register.is_empty() {
        config.register = args.register.clone();
    }
    if let Some(node) = args.numa_node {
        config.numa_node = Some(node);
    }
    if let (Some(name), Some(world), Some(rank)) = (&args.shared, args.world, args.rank) {
        let previous = config.sharing.take();
        config.sharing = Some(pool_core::SharingConfig {
            name: name.clone(),
            world,
            rank,
            attach_timeout_secs: args
                .attach_timeout
                .or(previous.as_ref().map(|p| p.attach_timeout_secs))
                .unwrap_or(30.0),
            control_dir: previous.and_then(|p| p.control_dir),
        });
    } else if let (Some(t), Some(s)) = (args.attach_timeout, config.sharing.as_mut()) {
        s.attach_timeout_secs = t;
    }
    Ok(config)
}

fn alloc(args: AllocArgs) -> Result<i32, Error> {
    // Block SIGINT/SIGTERM before any thread exists, so that every prefault
    // thread inherits the mask and `sigwait` below receives the signal. A
    // signal that arrives during the build is handled once it is ready.
    let signals = if args.hold {
        Some(TerminationSignals::block().map_err(|e| Error::Plugin {
            what: "alloc --hold".into(),
            message: "cannot block SIGINT/SIGTERM".into(),
            source: Some(Box::new(e)),
        })?)
    } else {
        None
    };
    let plan = PoolPlan::new(resolve_config(&args.pool)?)?;
    let show_progress = !args.json && std::io::stderr().is_terminal();
    let observer = progress::Bars::new(show_progress);
    if args.verify_copy && plan.config.pin.kind != "cuda" {
        return Err(Error::config(
            "--verify-copy needs --pin cuda: it copies through the GPU from the pinned pool",
        ));
    }
    let mut pool = Pool::build(&plan, &observer)?;
    let mut extra = serde_json::Map::new();
    let mut copy_ok = true;
    if args.verify_copy {
        let value = match verify_copy(&mut pool, &plan)? {
            Some(report) => {
                copy_ok = report.verified;
                serde_json::to_value(&report).map_err(|e| Error::config(e.to_string()))?
            }
            None => serde_json::json!({
                "bytes": 0,
                "skipped": "this rank's shard is empty (more ranks than pages): nothing to copy",
            }),
        };
        extra.insert("verify_copy".into(), value);
    }
    match signals {
        Some(signals) => {
            print_report(
                pool.report(),
                &extra,
                args.json,
                "ready; holding until SIGINT or SIGTERM",
            )?;
            let sig = signals.wait().map_err(|e| Error::Plugin {
                what: "alloc --hold".into(),
                message: "waiting for SIGINT/SIGTERM failed".into(),
                source: Some(Box::new(e)),
            })?;
            let report = pool.teardown_observed(&observer);
            eprintln!(
                "hostpool: signal {sig} received; pool released in {:.3} s{}",
                report.phases.teardown.unwrap_or(0.0),
                teardown_note(&report)
            );
            Ok(i32::from(!report.teardown_issues.is_empty() || !copy_ok))
        }
        None => {
            let report = pool.teardown_observed(&observer);
            print_report(&report, &extra, args.json, "built, prefaulted and released")?;
            Ok(i32::from(!report.teardown_issues.is_empty() || !copy_ok))
        }
    }
}

fn teardown_note(report: &pool_core::PoolReport) -> String {
    if report.teardown_issues.is_empty() {
        String::new()
    } else {
        format!(
            "; {} step(s) could not be undone (see warnings)",
            report.teardown_issues.len()
        )
    }
}

fn print_report(
    report: &pool_core::PoolReport,
    extra: &serde_json::Map<String, serde_json::Value>,
    json: bool,
    status: &str,
) -> Result<(), Error> {
    let text = if json {
        let mut v = serde_json::to_value(report).map_err(|e| Error::config(e.to_string()))?;
        if let Some(obj) = v.as_object_mut() {
            obj.extend(extra.clone());
        }
        serde_json::to_string_pretty(&v).map_err(|e| Error::config(e.to_string()))?
    } else {
        let mut t = output::human_report(report, status);
        if let Some(c) = extra.get("verify_copy") {
            t.push_str(&format!(
                "\n  copy       {} bytes: H2D {:.1} GiB/s, D2H {:.1} GiB/s, data {}",
                c["bytes"],
                c["h2d_gib_s"].as_f64().unwrap_or(0.0),
                c["d2h_gib_s"].as_f64().unwrap_or(0.0),
                if c["verified"] == true {
                    "checked"
                } else {
                    "MISMATCH"
                }
            ));
        }
        t
    };
    write_stdout(&text)
}

/// `--verify-copy`: a round trip through the GPU from the pinned pool.
/// `None` when this rank's shard is empty: it copies nothing, and never
/// anything outside its shard (the check overwrites what it copies).
fn verify_copy(pool: &mut Pool, plan: &PoolPlan) -> Result<Option<pinner_cuda::CopyReport>, Error> {
    let r = pool.report();
    if r.pin.status != pool_core::PinStatus::Pinned {
        return Err(Error::Plugin {
            what: "--verify-copy".into(),
            message: format!(
                "the pool is not pinned ({}); nothing to copy through",
                r.pin.reason.as_deref().unwrap_or("pinning was skipped")
            ),
            source: None,
        });
    }
    let device = r.pin.details["device"]
        .as_u64()
        .and_then(|d| u32::try_from(d).ok())
        .unwrap_or(0);
    // A shared pool's rank copies only through its own shard.
    let extent = plan.prefault.extent;
    if extent.len == 0 {
        return Ok(None);
    }
    let bytes = extent.len.min(1 << 30);
    pinner_cuda::verify_copy(pool, extent, device, bytes).map(Some)
}

pub(crate) fn write_stdout(text: &str) -> Result<(), Error> {
    let mut out = std::io::stdout().lock();
    writeln!(out, "{text}")
        .and_then(|()| out.flush())
        .map_err(|e| Error::Plugin {
            what: "writing the report".into(),
            message: "stdout is closed or full".into(),
            source: Some(Box::new(e)),
        })
}

fn plan(args: PlanArgs) -> Result<i32, Error> {
    let plan = PoolPlan::new(resolve_config(&args.pool)?)?;
    let report = plan.report();
    let text = if args.json {
        serde_json::to_string_pretty(&report).map_err(|e| Error::config(e.to_string()))?
    } else {
        output::human_plan(&report)
    };
    write_stdout(&text)?;
    if report.fits {
        Ok(0)
    } else {
        if let Some(e) = report.capacity.iter().find_map(|c| c.to_error()) {
            report_error(&e);
        }
        Ok(1)
    }
}

#[derive(serde::Serialize)]
struct PluginEntry {
    name: &'static str,
    summary: &'static str,
    origin: &'static str,
}

fn entries<T: PluginRecord>() -> Result<Vec<PluginEntry>, Error> {
    Ok(plugin::registry::<T>()?
        .into_values()
        .map(|r| PluginEntry {
            name: r.name(),
            summary: r.summary(),
            origin: r.origin(),
        })
        .collect())
}

fn plugins(args: PluginsArgs) -> Result<i32, Error> {
    let kinds = [
        ("backings", entries::<BackingPlugin>()?),
        ("pinners", entries::<PinnerPlugin>()?),
        ("registrars", entries::<RegistrarPlugin>()?),
    ];
    let text = if args.json {
        let map: serde_json::Map<String, serde_json::Value> = kinds
            .iter()
            .map(|(k, v)| (k.to_string(), serde_json::to_value(v).unwrap_or_default()))
            .collect();
        serde_json::to_string_pretty(&map).map_err(|e| Error::config(e.to_string()))?
    } else {
        let mut s = String::new();
        for (kind, list) in &kinds {
            s.push_str(&format!("{kind}:\n"));
            if list.is_empty() {
                s.push_str("  (none)\n");
            }
            for p in list {
                s.push_str(&format!("  {:<16} {}  [{}]\n", p.name, p.summary, p.origin));
            }
        }
        s.trim_end().to_string()
    };
    write_stdout(&text)?;
    Ok(0)
}

fn gc(args: GcArgs) -> Result<i32, Error> {
    let dirs = if args.dir.is_empty() {
        pool_core::gc::default_dirs()
    } else {
        args.dir
    };
    let report = pool_core::gc::collect(&dirs);
    let text = if args.json {
        serde_json::to_string_pretty(&report).map_err(|e| Error::config(e.to_string()))?
    } else {
        output::human_gc(&report)
    };
    write_stdout(&text)?;
    Ok(0)
}
