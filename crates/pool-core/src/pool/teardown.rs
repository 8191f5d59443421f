//! Teardown, in reverse: stop a background pin, deregister, unpin,
//! unmap/close/unlink; and the teardown of a copy inherited through `fork`
//! (the fork detection is [`Pool::inherited_from`]).

use std::time::Instant;

use super::{Observer, Phase, Pool, PoolReport, Quiet, timed};
use crate::background::PinStatus;
use crate::sys::Placeholder;

impl Pool {
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

    /// As [`Pool::teardown`], but the pool's address range stays reserved
    /// until the returned [`Placeholder`] is dropped: private zero pages
    /// (no memory until written) in place of the pool, so that an address
    /// a caller kept past the pool (a `torch.frombuffer` tensor keeps the
    /// pointer, not the buffer) never reaches memory mapped there later.
    /// The pool's memory, files, pins and registrations are given back as
    /// always. `None` when the backing cannot keep its range (its
    /// [`crate::plugin::Mapping::teardown_keeping_range`] is the default),
    /// the replacement failed (an issue in the report), or the pool came
    /// through `fork`.
    pub fn teardown_keeping_range(mut self) -> (PoolReport, Option<Placeholder>) {
        let kept = self.release_with(&Quiet, true);
        (self.report.clone(), kept)
    }

    fn release(&mut self, observer: &dyn Observer) {
        let _ = self.release_with(observer, false);
    }

    fn release_with(&mut self, observer: &dyn Observer, keep_range: bool) -> Option<Placeholder> {
        self.mapping.as_ref()?;
        if let Some(owner) = self.inherited_from() {
            self.release_inherited(owner);
            return None;
        }
        let mut kept = None;
        let (issues, secs) = timed(observer, Phase::Teardown, self.report.mapped_bytes, || {
            let mut issues = Vec::new();
            // A background pin stops after its current chunk and unpins, so
            // nothing is unmapped under a pinning call.
            if let (Some(bg), Some(owner)) = (self.background.take(), self.mapping.as_mut()) {
                let (progress, undone) = bg.stop(owner);
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
            if let Some(owner) = self.mapping.take() {
                let mapping = owner.into_mapping();
                if keep_range {
                    let (undone, placeholder) = mapping.teardown_keeping_range();
                    issues.extend(undone);
                    kept = placeholder;
                } else {
                    issues.extend(mapping.teardown());
                }
            }
            issues
        });
        self.report.phases.teardown = Some(secs);
        self.report.teardown_issues.extend(issues);
        kept
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
        if let Some(mapping) = self.mapping.as_mut() {
            mapping.forget_worker_after_fork();
        }
        std::mem::forget(self.background.take());
        std::mem::forget(std::mem::take(&mut self.registrations));
        std::mem::forget(self.pin.take());
        let issues = self
            .mapping
            .take()
            .map(|owner| owner.into_mapping().teardown())
            .unwrap_or_default();
        if self.report.pin.status != PinStatus::Off {
            self.report.pin.status = PinStatus::Skipped;
            self.report.pin.reason = Some(format!("inherited from pid {owner} through fork"));
        }
        self.report.phases.teardown = Some(t.elapsed().as_secs_f64());
        self.report.teardown_issues.extend(issues);
    }
}

impl Drop for Pool {
    fn drop(&mut self) {
        self.release(&Quiet);
    }
}
