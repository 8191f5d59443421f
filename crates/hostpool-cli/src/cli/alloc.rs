//! `hostpool alloc`: build the pool, prefault, pin and register it, print
//! the report, then tear it down (or hold it until a signal).

use std::io::IsTerminal;

use clap::Args;
use pool_core::shared::Refusals;
use pool_core::{BuildOptions, Error, Pool, PoolPlan};

use super::args::{PoolArgs, resolve_config};
use super::{forward_signals, output, progress, write_stdout};

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
    /// With --register nixl: write the agent's metadata (base64) to FILE, for
    /// a peer to load; removed when the pool is released.
    #[arg(long, value_name = "FILE")]
    pub nixl_metadata_out: Option<std::path::PathBuf>,
}

/// Run `hostpool alloc`.
pub(super) fn run(args: AllocArgs) -> Result<i32, Error> {
    // Block SIGINT, SIGTERM, SIGHUP and SIGQUIT before any thread exists, so
    // that every thread inherits the mask, and hand them to one thread that
    // asks the build to stop: a signal ends the build within a fraction of a
    // second at any phase (prefault, the shared pool's waits and barrier),
    // tearing down what exists (exit 128 + signal), or releases a held pool.
    let cancel = forward_signals("alloc", |_| {})?;
    let mut config = resolve_config(&args.pool)?;
    if args.hold {
        quiet_nixl_progress(&mut config);
    }
    let plan = PoolPlan::new(config)?;
    let show_progress = !args.json && std::io::stderr().is_terminal();
    let observer = progress::Bars::new(show_progress);
    if args.verify_copy && plan.config().pin.kind.as_deref() != Some("cuda") {
        return Err(Error::config(
            "--verify-copy needs --pin cuda: it copies through the GPU from the pinned pool",
        ));
    }
    if args.nixl_metadata_out.is_some()
        && !plan
            .config()
            .register
            .iter()
            .any(|r| r == registrar_nixl::NAME)
    {
        return Err(Error::config(
            "--nixl-metadata-out needs --register nixl: it writes the NIXL agent's metadata",
        ));
    }
    if let Some(path) = &args.nixl_metadata_out {
        check_metadata_out(path)?;
    }
    // From here on an early return drops `pool`, which tears it down.
    let options = BuildOptions::new()
        .handoff(hostpool::hostpool_handoff::HANDOFF)
        .cancel(&cancel)
        .refusals(Refusals::Hand(super::refuse::hand_over));
    let mut pool = Pool::build_with_options(&plan, &observer, &options)?;
    // Only a background pin is still pinning once the build returns.
    let background = pool.report().pin.status == pool_core::PinStatus::Pinning;
    if background && (!args.hold || args.verify_copy) {
        // Without --hold the report waits for the pin (and so does the copy check).
        pool.wait_pinned_or_cancelled(None, Some(&cancel))?;
        cancel.check()?;
    }
    // Removed when this function returns, after the teardown.
    let _metadata_file = match &args.nixl_metadata_out {
        Some(path) => {
            write_nixl_metadata(pool.report(), path)?;
            Some(MetadataFile(path.clone()))
        }
        None => None,
    };
    let mut extra = serde_json::Map::new();
    let mut copy_ok = true;
    if args.verify_copy {
        let value = match verify_copy(&mut pool)? {
            Some(report) => {
                copy_ok = report.verified;
                super::to_json_value(&report)?
            }
            None => serde_json::json!({
                "bytes": 0,
                "skipped": "this rank's shard is empty (more ranks than pages): nothing to copy",
            }),
        };
        extra.insert("verify_copy".into(), value);
    }
    if args.hold {
        print_report(
            pool.report(),
            &extra,
            args.json,
            "ready; holding until SIGINT or SIGTERM",
        )?;
        let agent = nixl_agent(pool.report());
        let mut pinning = background && !args.verify_copy;
        let sig = loop {
            if let Some(sig) = cancel.requested() {
                break sig;
            }
            if pinning {
                let progress = pool.pin_status();
                if progress.status != pool_core::PinStatus::Pinning {
                    pinning = false;
                    print_pin_end(&progress, args.json)?;
                }
            }
            if let Some(agent) = &agent {
                for (peer, msg) in agent.notifications().unwrap_or_default() {
                    super::say(format_args!(
                        "hostpool: nixl: notification from `{peer}`: {}",
                        String::from_utf8_lossy(&msg)
                    ));
                }
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        };
        drop(agent);
        let report = pool.teardown_observed(&observer);
        super::say(format_args!(
            "hostpool: signal {sig} received; pool released in {:.3} s{}",
            report.phases.teardown.unwrap_or(0.0),
            teardown_note(&report)
        ));
        Ok(i32::from(!report.teardown_issues.is_empty() || !copy_ok))
    } else {
        let report = pool.teardown_observed(&observer);
        print_report(&report, &extra, args.json, "built, prefaulted and released")?;
        Ok(i32::from(!report.teardown_issues.is_empty() || !copy_ok))
    }
}

/// `--hold` with a background pin: the second report, when pinning ends.
fn print_pin_end(progress: &pool_core::PinProgress, json: bool) -> Result<(), Error> {
    let text = if json {
        // One line, so that scripts read the two reports line by line.
        // `pin.status`, as the ready report has it (and `pin.state`, as
        // earlier releases wrote it).
        serde_json::to_string(&serde_json::json!({ "pin": progress })).map_err(|e| {
            Error::Plugin {
                what: "the pin report".into(),
                message: "could not be written as JSON".into(),
                source: Some(Box::new(e)),
            }
        })?
    } else {
        format!(
            "hostpool: background pin {}: {} of {} in {} chunk(s), {:.3} s{}",
            serde_json::to_value(progress.status)
                .ok()
                .and_then(|v| v.as_str().map(str::to_string))
                .unwrap_or_default(),
            pool_core::format_bytes(progress.pinned_bytes),
            pool_core::format_bytes(progress.total_bytes),
            progress.chunks,
            progress.seconds,
            progress
                .error
                .as_ref()
                .map(|e| format!("; {e}"))
                .unwrap_or_default()
        )
    };
    write_stdout(&text)
}

/// A held pool's NIXL agent progresses on the hold loop's poll (every
/// 20 ms) instead of NIXL's progress thread, which would spin a core for as
/// long as the pool is held; `[nixl] progress_thread` set either way wins.
fn quiet_nixl_progress(config: &mut pool_core::PoolConfig) {
    if !config.register.iter().any(|r| r == registrar_nixl::NAME) {
        return;
    }
    let table = config
        .plugins
        .entry(registrar_nixl::NAME.to_string())
        .or_insert_with(|| serde_json::json!({}));
    if let Some(t) = table.as_object_mut() {
        t.entry("progress_thread")
            .or_insert(serde_json::Value::Bool(false));
    }
}

/// The NIXL agent of the pool's `nixl` registration, if it has one.
fn nixl_agent(report: &pool_core::PoolReport) -> Option<std::sync::Arc<registrar_nixl::Agent>> {
    let reg = report
        .registrations
        .iter()
        .find(|r| r.kind == registrar_nixl::NAME)?;
    registrar_nixl::agent(reg.details["agent"].as_str()?)
}

/// A `--nixl-metadata-out` that can never be written is bad input, said
/// before a pool of hundreds of GiB is built and registered for nothing.
fn check_metadata_out(path: &std::path::Path) -> Result<(), Error> {
    if path.is_dir() {
        return Err(Error::config(format!(
            "--nixl-metadata-out {} is a directory; give the path of a file to write, such as {}",
            path.display(),
            path.join("agent.meta").display()
        )));
    }
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => std::path::Path::new("."),
    };
    if !dir.is_dir() {
        return Err(Error::config(format!(
            "the directory of --nixl-metadata-out {} ({}) does not exist or is not a directory; \
             create it, or write the metadata elsewhere",
            path.display(),
            dir.display()
        )));
    }
    Ok(())
}

/// `--nixl-metadata-out`: the agent's metadata, base64, written whole
/// (a temporary file renamed over FILE) so a peer never reads half of it.
fn write_nixl_metadata(
    report: &pool_core::PoolReport,
    path: &std::path::Path,
) -> Result<(), Error> {
    let reg = report
        .registrations
        .iter()
        .find(|r| r.kind == registrar_nixl::NAME);
    let Some(text) = reg.and_then(|r| r.details["metadata"]["base64"].as_str()) else {
        return Err(Error::Plugin {
            what: "--nixl-metadata-out".into(),
            message: "the nixl registration was skipped ([nixl] required = false): there is no \
                      metadata to write"
                .into(),
            source: None,
        });
    };
    let tmp = path.with_extension(format!("tmp-{}", std::process::id()));
    std::fs::write(&tmp, format!("{text}\n"))
        .and_then(|()| std::fs::rename(&tmp, path))
        .map_err(|e| {
            let _ = std::fs::remove_file(&tmp);
            Error::os(
                "write",
                e,
                pool_core::Context::file(path).remedy(
                    "check that the directory of --nixl-metadata-out exists and is writable",
                ),
            )
        })
}

/// The metadata file, removed when the pool goes.
struct MetadataFile(std::path::PathBuf);

impl Drop for MetadataFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
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
        let mut v = super::to_json_value(report)?;
        if let Some(obj) = v.as_object_mut() {
            obj.extend(extra.clone());
        }
        super::to_json(&v)?
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
fn verify_copy(pool: &mut Pool) -> Result<Option<pinner_cuda::CopyReport>, Error> {
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
    // A shared pool's rank (or a lease's) copies only through its own shard.
    let extent = r.sharing.as_ref().map_or(
        pool_core::Extent {
            offset: 0,
            len: r.mapped_bytes,
        },
        |s| pool_core::Extent {
            offset: s.shard.offset,
            len: s.shard.len,
        },
    );
    if extent.len == 0 {
        return Ok(None);
    }
    let bytes = extent.len.min(1 << 30);
    pinner_cuda::verify_copy(pool, extent, device, bytes).map(Some)
}
