//! `mlock` of resident memory through the mlock pinner, per page size; on
//! hugetlb a no-op, reported as such.

use pool_core::{Error, PinStatus, Pool, PrefaultChoice, Quiet};
use serde_json::Value;

use super::{Bench, Row, Status, error_text, mib, progress};
use bench_support::benchkit::{self, Memory};

impl Bench<'_> {
    /// `mlock` of a resident pool through the mlock pinner, per repeat on a
    /// fresh pool.
    pub(super) fn mlock(&mut self, memory: &Memory) {
        let size = memory.round(self.size);
        let i = self.push(Row::new("mlock", "mlock", memory, 1, size));
        if !self.available(memory, size, &[i]) {
            return;
        }
        // Anonymous 4 KiB memory was warmed up by memset already.
        if memory.thp && !self.warm_up(memory, size, &[i]) {
            return;
        }
        progress(&format!("mlock of {} {}", mib(size), Self::label(memory)));
        for _ in 0..self.repeat {
            match mlock_once(memory, size) {
                Ok(Mlocked::Took(secs, thp)) => {
                    let row = &mut self.rows[i];
                    row.seconds_each.push(secs);
                    row.threads_used = Some(1);
                    if let Some(thp) = thp {
                        row.note(format!(
                            "AnonHugePages {} of {} (transparent huge pages are best effort)",
                            mib(thp),
                            mib(size)
                        ));
                    }
                }
                Ok(Mlocked::Skipped(reason)) => {
                    self.rows[i].set(Status::Skipped, reason);
                    break;
                }
                Ok(Mlocked::NoOp(reason)) => {
                    self.rows[i].set(Status::NoOp, reason);
                    break;
                }
                Err(e) => {
                    self.rows[i].set(Status::Failed, error_text(&e));
                    break;
                }
            }
        }
        self.rows[i].finish();
    }

    /// `mlock` on hugetlb: a no-op, confirmed with the pinner when the pages
    /// are free.
    pub(super) fn mlock_hugetlb(&mut self, memory: &Memory) {
        let size = memory.round(self.size);
        let i = self.push(Row::new("mlock", "mlock", memory, 1, size));
        let generic = format!(
            "{} pages are reserved huge pages, which are never swapped: mlock succeeds and does \
             nothing (VmLck stays 0)",
            benchkit::page_label(memory.page)
        );
        let reason = match memory.unavailable(size) {
            Some(why) => format!("{generic}; not built here: {why}"),
            None => match mlock_once(memory, size) {
                Ok(Mlocked::NoOp(note)) => note,
                Ok(Mlocked::Took(..)) => {
                    format!("{generic}; the mlock pinner called mlock anyway, which it should not")
                }
                Ok(Mlocked::Skipped(why)) => format!("{generic}; the pinner skipped: {why}"),
                Err(e) => format!("{generic}; building the pool failed: {}", error_text(&e)),
            },
        };
        self.rows[i].set(Status::NoOp, reason);
    }
}

/// What one mlock run found.
enum Mlocked {
    /// `mlock` took this many seconds; AnonHugePages of the pool for THP.
    Took(f64, Option<u64>),
    /// The pinner did not call `mlock`, and says why.
    NoOp(String),
    /// Pinning was skipped (for example `RLIMIT_MEMLOCK`), with the reason.
    Skipped(String),
}

/// Build a prefaulted pool of `memory` pinned with the mlock pinner, read the
/// pinner's own timing of the `mlock` call, and tear the pool down.
fn mlock_once(memory: &Memory, size: u64) -> Result<Mlocked, Error> {
    let mut config = memory.config(size);
    config.prefault = PrefaultChoice::PopulateWrite;
    config.pin.kind = Some("mlock".into());
    config.pin.required = false;
    let plan = pool_core::PoolPlan::new(config)?;
    let pool = Pool::build(&plan, &Quiet)?;
    let report = pool.report();
    let thp = if memory.thp {
        pool.region()
            .and_then(|r| benchkit::smaps_bytes(r.addr() as usize, &["AnonHugePages"]))
    } else {
        None
    };
    let details = &report.pin.details;
    let outcome = match report.pin.status {
        PinStatus::Pinned if details["mlock_called"] == Value::Bool(false) => Mlocked::NoOp(
            details["note"]
                .as_str()
                .unwrap_or("the pinner did not call mlock")
                .to_string(),
        ),
        PinStatus::Pinned => match details["seconds"].as_f64() {
            Some(s) => Mlocked::Took(s, thp),
            None => Mlocked::Skipped("the mlock pinner reported no time".into()),
        },
        PinStatus::Skipped | PinStatus::Off | PinStatus::Pinning | PinStatus::Failed => {
            Mlocked::Skipped(
                report
                    .pin
                    .reason
                    .clone()
                    .unwrap_or_else(|| "pinning was skipped".into()),
            )
        }
    };
    let report = pool.teardown();
    if !report.teardown_issues.is_empty() {
        return Err(Error::Plugin {
            what: "teardown".into(),
            message: format!("{:?}", report.teardown_issues),
            source: None,
        });
    }
    Ok(outcome)
}
