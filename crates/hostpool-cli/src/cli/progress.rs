//! One progress bar per phase on stderr, hidden when stderr is not a
//! terminal or the report is JSON.

use std::sync::Mutex;

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use pool_core::{Observer, Phase};

/// The observer `alloc` builds with.
#[derive(Debug)]
pub struct Bars {
    visible: bool,
    current: Mutex<Option<ProgressBar>>,
}

impl Bars {
    /// Bars drawn on stderr when `visible`.
    pub fn new(visible: bool) -> Bars {
        Bars {
            visible,
            current: Mutex::new(None),
        }
    }
}

impl Observer for Bars {
    fn start(&self, phase: Phase, total: u64) {
        failpoint(phase);
        if !self.visible {
            return;
        }
        let bar = ProgressBar::with_draw_target(Some(total), ProgressDrawTarget::stderr());
        let style = ProgressStyle::with_template("{prefix:>9} [{bar:40}] {binary_bytes}/{binary_total_bytes} {binary_bytes_per_sec} {elapsed}")
            .map(|s| s.progress_chars("=> "))
            .unwrap_or_else(|_| ProgressStyle::default_bar());
        bar.set_style(style);
        bar.set_prefix(phase.name());
        *self.current.lock().unwrap_or_else(|p| p.into_inner()) = Some(bar);
    }

    fn progress(&self, _phase: Phase, done: u64) {
        if let Some(bar) = &*self.current.lock().unwrap_or_else(|p| p.into_inner()) {
            bar.set_position(done);
        }
    }

    fn end(&self, _phase: Phase, _seconds: f64) {
        if let Some(bar) = self
            .current
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take()
        {
            if let Some(total) = bar.length() {
                bar.set_position(total);
            }
            bar.finish();
        }
    }
}

/// Test hook: `HOSTPOOL_FAILPOINT_STALL_PREFAULT_MS=N` makes this process
/// sleep N ms as prefault starts, so that tests can kill a rank while it is
/// provably mid-prefault. Only in builds with pool-core's `failpoints`.
fn failpoint(phase: Phase) {
    if phase == Phase::Prefault {
        pool_core::failpoint::delay("HOSTPOOL_FAILPOINT_STALL_PREFAULT_MS");
    }
}
