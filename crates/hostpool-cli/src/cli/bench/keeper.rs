//! The `keeper` section: time to usable for a restarting engine, with and
//! without a keeper, and the keeper's clearing between leases.
//!
//! - `build`: plan and build the pool (map, populate-write prefault on every
//!   core), as an engine without a keeper does at every start;
//! - `attach`: plan and build the same pool leased from a keeper (in this
//!   process, serving from a thread), which maps it resident and skips the
//!   prefault; `x build` is the build's seconds over the attach's;
//! - `clear`: the keeper's zeroing between two leases (`content = "zero"`:
//!   zeroed in place on the prefault threads), as its status reports it,
//!   with its ratio to memset of the same size on as many threads.
//!
//! The three run in one rotation per repeat, so load that comes and goes
//! hits them alike.

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use bench_support::benchkit::Memory;
use hostpool_keeper::{Content, Keeper, KeptPoolConfig, StopRequests};
use pool_core::{Error, Pool, PoolConfig, PoolPlan, PrefaultChoice, Quiet};

use super::rows::{Row, Status};
use super::{Bench, error_text, mib, progress};

impl Bench<'_> {
    /// The keeper's rows for `memory`, at the size and every core.
    pub(super) fn keeper(&mut self, memory: &Memory) {
        let size = memory.round(self.keeper_size);
        let cores = bench_support::benchkit::cores();
        let build = self.push(Row::new("keeper", "build", memory, cores, size));
        let attach = self.push(Row::new("keeper", "attach", memory, cores, size));
        let clear = self.push(Row::new("keeper", "clear", memory, cores, size));
        let rows = [build, attach, clear];
        if !self.available(memory, size, &rows) {
            return;
        }
        if memory.page.get() == pool_core::PageSize::BASE_4K.get() && size > self.half_available {
            let reason = format!(
                "{} is more than half of MemAvailable ({}); give a smaller --keeper-size",
                mib(size),
                mib(self.half_available)
            );
            progress(&format!(
                "skipping keeper {}: {reason}",
                Self::label(memory)
            ));
            for i in rows {
                self.rows[i].set(Status::Skipped, reason.clone());
            }
            return;
        }
        progress(&format!(
            "keeper: build, attach and clear of {} {}",
            mib(size),
            Self::label(memory)
        ));
        let config = PoolConfig {
            prefault: PrefaultChoice::Auto,
            ..memory.config(size)
        };
        if let Err(e) = self.keeper_runs(&config, build, attach, clear) {
            for i in rows {
                self.rows[i].set(Status::Failed, error_text(&e));
            }
        }
        for i in rows {
            self.rows[i].finish();
        }
        if let (Some(b), Some(a)) = (self.rows[build].seconds, self.rows[attach].seconds) {
            self.rows[attach].speedup_over_build = Some(b / a);
            self.rows[attach].note(format!(
                "time to usable {:.0} x faster than the build ({:.3} s against {:.3} s)",
                b / a,
                a,
                b
            ));
        }
    }

    fn keeper_runs(
        &mut self,
        config: &PoolConfig,
        build: usize,
        attach: usize,
        clear: usize,
    ) -> Result<(), Error> {
        // Warm up: one build, so the first timed one is not the first touch.
        timed_build(config)?;
        for _ in 0..self.repeat {
            self.rows[build]
                .seconds_each
                .push(timed_build(config)?.as_secs_f64());
        }
        let name = format!("bench-{}", std::process::id());
        let kept = KeptPoolConfig {
            name: name.clone(),
            content: Content::Zero,
            allow_uids: Vec::new(),
            tenants: 1,
            persist: None,
            adopt_within_secs: 0.0,
            pool: config.clone(),
        };
        let mut keeper = Keeper::start(kept, &Quiet, &pool_core::interrupt::Cancel::new())?;
        let threads = keeper.report().prefault.as_ref().map(|p| p.threads);
        self.rows[clear].threads_used = threads;
        let stops = StopRequests::new(0);
        let lease = PoolConfig {
            lease: Some(pool_core::LeaseConfig::of(name.clone())),
            ..PoolConfig::default()
        };
        let result = std::thread::scope(|s| {
            s.spawn(|| keeper.serve(&stops, Duration::ZERO));
            let mut run = || -> Result<(), Error> {
                for _ in 0..self.repeat {
                    let took = timed_build(&lease)?;
                    self.rows[attach].seconds_each.push(took.as_secs_f64());
                    self.rows[clear].seconds_each.push(cleared(&name)?);
                }
                Ok(())
            };
            let r = run();
            stops.store(2, Ordering::SeqCst);
            r
        });
        let report = keeper.teardown();
        if !report.teardown_issues.is_empty() {
            self.rows[attach].note(format!("teardown: {:?}", report.teardown_issues));
        }
        result
    }
}

/// Plan and build `config`'s pool, then tear it down; the plan and build's
/// wall time.
fn timed_build(config: &PoolConfig) -> Result<Duration, Error> {
    let t = Instant::now();
    let plan = PoolPlan::new(config.clone())?;
    let options = pool_core::BuildOptions::new().handoff(hostpool::hostpool_handoff::HANDOFF);
    let pool = Pool::build_with_options(&plan, &Quiet, &options)?;
    let took = t.elapsed();
    let report = pool.teardown();
    if let Some(issue) = report.teardown_issues.first() {
        return Err(Error::Plugin {
            what: "bench teardown".into(),
            message: format!("{}: {}", issue.step, issue.detail),
            source: None,
        });
    }
    Ok(took)
}

/// Wait for the keeper of `name` to clear the pool after a lease; the
/// seconds its status says the clearing took.
fn cleared(name: &str) -> Result<f64, Error> {
    let end = Instant::now() + Duration::from_secs(600);
    loop {
        let s = hostpool_keeper::status(name)?;
        if s["state"] == "idle"
            && s["lease"].is_null()
            && let Some(secs) = s["last_clear_seconds"].as_f64()
        {
            return Ok(secs);
        }
        if s["state"] == "broken" || Instant::now() > end {
            return Err(Error::Plugin {
                what: "bench keeper".into(),
                message: format!("the pool was not cleared: {s}"),
                source: None,
            });
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}
