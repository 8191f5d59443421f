//! Where a pool's pin stands, and pausing a background pin.

use super::Pool;
use crate::background::PinStatus;
use crate::error::Result;

impl Pool {
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
        self.wait_pinned_or_cancelled(timeout, None)
    }

    /// As [`Pool::wait_pinned`], returning early (with the progress then)
    /// once `cancel` is cancelled: the CLI's wait, which its signals end.
    ///
    /// # Errors
    /// As for [`Pool::wait_pinned`].
    pub fn wait_pinned_or_cancelled(
        &self,
        timeout: Option<std::time::Duration>,
        cancel: Option<&crate::interrupt::Cancel>,
    ) -> Result<crate::PinProgress> {
        let progress = match &self.background {
            // A forked child has no pinning thread to wait for.
            Some(bg) if self.inherited_from().is_none() => bg.wait(timeout, cancel),
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
}
