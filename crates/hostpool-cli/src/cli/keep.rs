//! `hostpool keep`: build pools once and keep them, serving leases to
//! engines that restart (see `hostpool_keeper`); `hostpool keep status`.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use clap::{Args, Subcommand};
use hostpool::hostpool_handoff::lease::{KeeperStatus, LeaseStatus, TenantStatus};
use hostpool_keeper::metrics::{Endpoint, Metrics};
use hostpool_keeper::{
    CameBack, Content, Keeper, KeptPoolConfig, LeaseEnd, StopRequests, fdstore, notify,
};
use pool_core::{Error, format_bytes};
use serde_json::Value;

use super::args::{PoolArgs, resolve_config};

use super::{forward_signals, progress, say, to_json, write_stdout};

/// `hostpool keep`.
#[derive(Debug, Args)]
#[command(args_conflicts_with_subcommands = true)]
pub struct KeepArgs {
    /// `status`: what the keepers of this node keep and who leases it.
    #[command(subcommand)]
    pub command: Option<KeepCommand>,
    /// Keep one pool of this name, described by the pool flags; without it,
    /// --config is a keeper's config (`keep.toml`: one [[pool]] table per
    /// kept pool).
    #[arg(long, value_name = "NAME")]
    pub name: Option<String>,
    /// With --name: zero (default: clear the pool between leases) or keep
    /// (the next lease finds the bytes).
    #[arg(long, value_enum, requires = "name")]
    pub content: Option<Content>,
    /// With --name: a user id besides the keeper's own that may lease the
    /// pool (repeatable).
    #[arg(long = "allow-uid", value_name = "UID", requires = "name")]
    pub allow_uids: Vec<u32>,
    /// With --name: how many engines may lease the pool at once, 1 to 64
    /// (default 1: one lease at a time); each tenant maps the whole pool.
    #[arg(long, value_name = "N", requires = "name")]
    pub tenants: Option<u32>,
    /// With --name and --content keep: keep the pool's files in this
    /// directory (a hugetlbfs or tmpfs mount that outlives the keeper), so
    /// that a keeper started again maps them: bytes and index (`persist =
    /// "DIR"` in a keeper's config). `hostpool keep forget` removes them.
    #[arg(long, value_name = "DIR", requires = "name")]
    pub persist: Option<std::path::PathBuf>,
    /// With --name and --content keep: when no pool comes back from systemd
    /// or --persist, wait up to SECS for an engine that lived through the
    /// keeper before to hand the pool's files back, before building one
    /// (`adopt_within_secs` in a keeper's config; default 0: build at once).
    #[arg(long, value_name = "SECS", requires = "name")]
    pub adopt_within: Option<f64>,
    /// Print one JSON line per pool when it is ready (and when it is released).
    #[arg(long)]
    pub json: bool,
    /// Serve Prometheus metrics at /metrics on this loopback HOST:PORT
    /// (127.0.0.1:9464) or unix:PATH (`metrics = "..."` in a keeper's
    /// config).
    #[arg(long, value_name = "ADDR")]
    pub metrics: Option<String>,
    /// Seconds a stop request (SIGTERM) waits for leases to end before the
    /// keeper tears down anyway (a second SIGTERM ends it at once).
    #[arg(
        long,
        value_name = "SECS",
        default_value_t = 60.0,
        allow_negative_numbers = true
    )]
    pub drain_timeout: f64,
    /// The pool (with --name), or --config, the keeper's config.
    #[command(flatten)]
    pub pool: PoolArgs,
}

/// `hostpool keep` subcommands.
#[derive(Debug, Subcommand)]
pub enum KeepCommand {
    /// List kept pools: size, page size, backing, NUMA node, lease, generations.
    Status(StatusArgs),
    /// Throw a persisted pool away: remove its files from its persist
    /// directory (the one explicit way; `gc` never removes them).
    Forget(ForgetArgs),
}

/// `hostpool keep forget`.
#[derive(Debug, Args)]
pub struct ForgetArgs {
    /// The kept pool whose persisted files go.
    #[arg(long, value_name = "NAME")]
    pub name: String,
    /// Its persist directory.
    #[arg(long, value_name = "DIR")]
    pub persist: std::path::PathBuf,
    /// Print as JSON on stdout.
    #[arg(long)]
    pub json: bool,
}

/// `hostpool keep status`.
#[derive(Debug, Args)]
pub struct StatusArgs {
    /// Only this kept pool.
    #[arg(long, value_name = "NAME")]
    pub name: Option<String>,
    /// Print as JSON on stdout.
    #[arg(long)]
    pub json: bool,
}

/// Stop requests: SIGINT, SIGTERM, SIGHUP or SIGQUIT, counted.
static STOPS: StopRequests = StopRequests::new(0);

/// Run `hostpool keep`.
pub(super) fn run(args: KeepArgs) -> Result<i32, Error> {
    match args.command {
        Some(KeepCommand::Status(s)) => return status(&s),
        Some(KeepCommand::Forget(f)) => return forget(&f),
        None => {}
    }
    let most = pool_core::MAX_ATTACH_TIMEOUT_SECS;
    if !(args.drain_timeout.is_finite() && (0.0..=most).contains(&args.drain_timeout)) {
        return Err(Error::config(format!(
            "--drain-timeout {} must be a number of seconds from 0 to one day ({most})",
            args.drain_timeout
        )));
    }
    let cancel = forward_signals("keep", count_stop)?;
    let (configs, endpoint) = configs(&args)?;
    // Bound before anything is built: a taken address fails at once.
    let metrics = endpoint.map(Metrics::bind).transpose()?;
    let observer = progress::Bars::new(false);
    // What systemd's file descriptor store handed back: the pools of the
    // keeper that ran before, adopted rather than built.
    let mut passed = fdstore::Passed::take();
    let mut keepers: Vec<(Keeper, f64)> = Vec::new();
    for c in configs {
        let t = Instant::now();
        let adopt = match passed.files(&c.name) {
            Some(Ok(files)) => Some((files, CameBack::FdStore)),
            Some(Err(why)) => {
                tracing::warn!(
                    "kept pool `{}`: the files systemd handed back cannot be adopted ({why}); \
                     building it afresh",
                    c.name
                );
                None
            }
            None => None,
        };
        // An error drops the keepers built so far, which tears them down:
        // none was said to be ready, since none served yet.
        let keeper = Keeper::start_from(c, &observer, &cancel, adopt)?;
        keepers.push((keeper, t.elapsed().as_secs_f64()));
    }
    for name in passed.names() {
        tracing::warn!(
            "systemd handed back the files of kept pool `{name}`, which this keeper's config \
             does not name: they are closed (their memory is freed once nothing maps it)"
        );
    }
    drop(passed);
    for (keeper, seconds) in &keepers {
        // Under systemd with FileDescriptorStoreMax=: the pool's files are
        // kept there, so that a keeper started again adopts them.
        if let Err(e) = fdstore::store(keeper.name(), &keeper.files()) {
            tracing::warn!(
                "kept pool `{}`: its files could not be stored with systemd ({e}): a restart \
                 builds it afresh (is FileDescriptorStoreMax= set in the unit?)",
                keeper.name()
            );
        }
        ready(keeper, *seconds, args.json)?;
    }
    let mut keepers: Vec<Keeper> = keepers.into_iter().map(|(k, _)| k).collect();
    let names: Vec<String> = keepers.iter().map(|k| k.name().to_string()).collect();
    if let Some(m) = &metrics {
        say(format_args!("hostpool: metrics at {}", m.endpoint()));
    }
    let drain = Duration::from_secs_f64(args.drain_timeout);
    let served = AtomicBool::new(false);
    std::thread::scope(|s| {
        let serving: Vec<_> = keepers
            .iter_mut()
            .map(|k| s.spawn(|| k.serve(&STOPS, drain)))
            .collect();
        if let Some(m) = &metrics {
            s.spawn(|| m.serve(&names, &served));
        }
        // Under systemd (Type=notify): every pool is built and served.
        notify::tell(&format!(
            "READY=1\nSTATUS=keeping {}",
            names
                .iter()
                .map(|n| format!("`{n}`"))
                .collect::<Vec<_>>()
                .join(", ")
        ));
        for h in serving {
            let _ = h.join();
        }
        served.store(true, Ordering::SeqCst);
    });
    drop(metrics);
    let mut code = 0;
    for k in keepers {
        let name = k.name().to_string();
        let report = k.teardown();
        if !report.teardown_issues.is_empty() {
            code = 1;
        }
        if args.json {
            write_stdout(
                &serde_json::to_string(&serde_json::json!({
                    "name": name,
                    "released": true,
                    "teardown_seconds": report.phases.teardown,
                    "teardown_issues": report.teardown_issues,
                }))
                .unwrap_or_default(),
            )?;
        } else {
            say(format_args!(
                "hostpool: kept pool `{name}` released in {:.3} s",
                report.phases.teardown.unwrap_or(0.0)
            ));
        }
    }
    Ok(code)
}

/// The kept pools asked for (one from the pool flags, `--name`, or each
/// [[pool]] of the keeper's config), and where to serve the metrics
/// (`--metrics`, else the config's `metrics`).
fn configs(args: &KeepArgs) -> Result<(Vec<KeptPoolConfig>, Option<Endpoint>), Error> {
    let flag = args.metrics.as_deref().map(Endpoint::parse).transpose()?;
    let (pools, from_config) = pools(args)?;
    Ok((pools, flag.or(from_config)))
}

/// The kept pools asked for, and the config's `metrics`.
fn pools(args: &KeepArgs) -> Result<(Vec<KeptPoolConfig>, Option<Endpoint>), Error> {
    if let Some(name) = &args.name {
        let pool = resolve_config(&args.pool)?;
        let kept = KeptPoolConfig {
            name: name.clone(),
            content: args.content.unwrap_or_default(),
            allow_uids: args.allow_uids.clone(),
            tenants: args.tenants.unwrap_or(1),
            persist: args.persist.clone(),
            adopt_within_secs: args.adopt_within.unwrap_or(0.0),
            pool,
        };
        kept.validate()?;
        return Ok((vec![kept], None));
    }
    let Some(path) = &args.pool.config else {
        return Err(Error::config(
            "hostpool keep needs --name NAME (one pool from the pool flags) or --config \
             keep.toml (one [[pool]] table per kept pool)",
        ));
    };
    if args.pool.flags_given() {
        return Err(Error::config(format!(
            "pool flags go with --name; in {} each [[pool]] table has its own keys",
            path.display()
        )));
    }
    let settings = hostpool_keeper::read_settings(path)?;
    Ok((settings.pools, settings.metrics))
}

/// `hostpool keep forget`: a persisted pool's files removed, unless a
/// keeper of that name runs (it maps them).
fn forget(args: &ForgetArgs) -> Result<i32, Error> {
    if hostpool_keeper::list().contains(&args.name) {
        return Err(Error::Conflict {
            path: args.persist.clone(),
            message: format!(
                "a keeper of `{}` runs and maps its persisted files: stop it first (SIGTERM), \
                 then forget them",
                args.name
            ),
        });
    }
    let removed = hostpool_keeper::persist::forget(&args.persist, &args.name)?;
    if args.json {
        let paths: Vec<String> = removed.iter().map(|p| p.display().to_string()).collect();
        return write_stdout(&serde_json::json!({"name": args.name, "removed": paths}).to_string())
            .map(|()| 0);
    }
    say(format_args!(
        "hostpool: kept pool `{}`: {} persisted file(s) removed from {}",
        args.name,
        removed.len(),
        args.persist.display()
    ));
    Ok(0)
}

/// Say that a kept pool is ready.
fn ready(keeper: &Keeper, seconds: f64, json: bool) -> Result<(), Error> {
    let typed = keeper.status();
    let mut status = super::to_json_value(&typed)?;
    let report = keeper.report();
    if let Value::Object(m) = &mut status {
        m.insert("ready_seconds".into(), seconds.into());
        m.insert("prefault".into(), super::to_json_value(&report.prefault)?);
        m.insert("phases".into(), super::to_json_value(&report.phases)?);
        m.insert("capacity".into(), super::to_json_value(&report.capacity)?);
    }
    if json {
        return write_stdout(&serde_json::to_string(&status).unwrap_or_default());
    }
    let came = match keeper.came_back() {
        CameBack::Built => String::new(),
        from => format!(", adopted from {} with its bytes", from.name()),
    };
    say(format_args!(
        "hostpool: keeping `{}`: {} ({} pages, {}) on {}, content {}{came}; ready in {seconds:.2} s; \
         serving until SIGTERM",
        keeper.name(),
        format_bytes(report.logical_bytes),
        format_bytes(report.page_size),
        report.backing,
        typed.socket,
        typed.content,
    ));
    Ok(())
}

/// `hostpool keep status`.
fn status(args: &StatusArgs) -> Result<i32, Error> {
    let names = match &args.name {
        Some(n) => vec![n.clone()],
        None => hostpool_keeper::list(),
    };
    // Each keeper's status as it sent it, or why it did not.
    let mut all = Vec::new();
    for n in &names {
        match hostpool_keeper::status(n) {
            Ok(v) => all.push((n, Ok(v))),
            // Asked for by name: that it does not answer is the answer.
            Err(e) if args.name.is_some() => return Err(e),
            Err(e) => all.push((n, Err(e.chain_message()))),
        }
    }
    if args.json {
        // What each keeper sent, as it sent it (a keeper of another
        // version included).
        let json: Vec<Value> = all
            .into_iter()
            .map(|(n, said)| said.unwrap_or_else(|e| serde_json::json!({"name": n, "error": e})))
            .collect();
        write_stdout(&to_json(&json)?)?;
        return Ok(0);
    }
    if all.is_empty() {
        write_stdout("no keeper serves a pool in this network namespace")?;
        return Ok(0);
    }
    let mut text = String::new();
    for (n, said) in all {
        let typed = match said.map(|v| KeeperStatus::from_value(n, v, None)) {
            Ok(Ok(s)) => Ok(s),
            // Asked for by name: that its status cannot be read is the answer.
            Ok(Err(e)) if args.name.is_some() => return Err(e),
            Ok(Err(e)) => Err(e.chain_message()),
            Err(e) => Err(e),
        };
        match typed {
            Ok(s) => text.push_str(&human_status(&s)),
            Err(e) => text.push_str(&format!("{n}: {e}\n")),
        }
    }
    write_stdout(text.trim_end())?;
    Ok(0)
}

/// A keeper's status, as `keep status` says it.
fn human_status(s: &KeeperStatus) -> String {
    use std::fmt::Write;
    let mut t = String::new();
    let _ = writeln!(
        t,
        "{}: {} ({} pages, {}{}) on {}, keeper pid {} (instance {}), {}",
        s.name,
        format_bytes(s.size),
        format_bytes(s.page_size),
        s.backing,
        s.numa_node
            .map(|n| format!(", NUMA node {n}"))
            .unwrap_or_default(),
        s.socket,
        s.pid,
        s.instance,
        s.state,
    );
    let max_tenants = s.max_tenants;
    let _ = writeln!(
        t,
        "  content {}, generation {}, allow_uids [{}]{}",
        s.content,
        s.generation,
        s.allow_uids
            .iter()
            .map(u32::to_string)
            .collect::<Vec<_>>()
            .join(","),
        if max_tenants > 1 {
            format!(", {} of at most {max_tenants} tenants", s.tenants.len())
        } else {
            String::new()
        }
    );
    if max_tenants > 1 {
        for l in &s.tenants {
            let _ = writeln!(t, "{}", human_tenant(l));
        }
    }
    match &s.lease {
        Some(_) if max_tenants > 1 => {}
        Some(l) => {
            let _ = writeln!(t, "{}", human_lease(l));
        }
        None => {
            let _ = writeln!(t, "  not leased");
        }
    }
    if let Some(p) = &s.previous {
        let how = match p.how {
            LeaseEnd::Closed => "closed",
            LeaseEnd::Died => "died",
        };
        let _ = writeln!(t, "  last lease: pid {} {how} at {}", p.pid, p.ended_at);
    }
    if let Some(i) = &s.index {
        let _ = writeln!(
            t,
            "  index: {} of {} slots recorded, model {}, fingerprint {}",
            i.records,
            i.slots,
            i.model.as_deref().unwrap_or("(none)"),
            i.digest
        );
    }
    if let Some(b) = &s.broken {
        let _ = writeln!(t, "  broken: {b}");
    }
    t
}

/// The one lease of a kept pool of one tenant, as `keep status` says it.
fn human_lease(l: &LeaseStatus) -> String {
    let or_unknown = |v: Option<u32>| v.map_or_else(|| "?".to_string(), |v| v.to_string());
    format!(
        "  leased by pid {} (uid {}) since {}, {} rank(s) of world {}",
        or_unknown(l.pid),
        or_unknown(l.uid),
        l.since,
        l.ranks.len(),
        l.world
    )
}

/// One tenant of a kept pool of several, as `keep status` lists it, with
/// what it did in the keeper's CPU tier.
fn human_tenant(l: &TenantStatus) -> String {
    format!(
        "  tenant of generation {}: pid(s) {}{}, since {}, {} rank(s) of world {}, {} \
         companion(s), {}, tier: {} stored, {} hit(s) ({} stored by others)",
        l.generation,
        l.pids
            .iter()
            .map(u32::to_string)
            .collect::<Vec<_>>()
            .join(" "),
        if l.engine.is_empty() {
            String::new()
        } else {
            format!(", engine `{}`", l.engine)
        },
        l.since,
        l.ranks.len(),
        l.world,
        l.companions.len(),
        if l.live { "live" } else { "attaching" },
        l.stored,
        l.hits,
        l.hits_from_others,
    )
}

/// Count a stop request; the first is said (SIGTERM drains, a second
/// ends the keeper at once).
fn count_stop(sig: i32) {
    if STOPS.fetch_add(1, Ordering::SeqCst) == 0 {
        // Under systemd: the drain starts.
        notify::tell(
            "STOPPING=1\nSTATUS=draining: taking no new leases, waiting for leases to end",
        );
        say(format_args!(
            "hostpool: signal {sig}: taking no new leases, waiting for leases to end (again to \
             stop at once)"
        ));
    }
}
