//! A device with its primary context retained and current on this thread.

use pool_core::{Error, Result};

use crate::probe::describe;
use cudarc::driver::sys as cu;

use crate::sys::{self, Api, Context, Status};

/// A driver call that failed, as [`Error::Plugin`]: `{step} failed: NAME
/// (description)`.
pub(crate) fn failed(api: &Api, what: &str, step: &str, s: Status) -> Error {
    Error::Plugin {
        what: what.to_string(),
        message: format!("{step} failed: {}", describe(api, s)),
        source: None,
    }
}

/// `cuInit`, then the device of ordinal `index` (`cuDeviceGetCount`,
/// `cuDeviceGet`); no context is touched. What pinning and locating a GPU
/// share, so that both say the same when the device is not there.
///
/// # Errors
/// [`Error::NotAvailable`] when `cuInit` fails (no device, or a driver that
/// does not initialise) or the ordinal is at or past the device count (the
/// message names the count and `[cuda] device`); [`Error::Plugin`] when
/// `cuDeviceGetCount` or `cuDeviceGet` fails otherwise.
pub(crate) fn device_by_index(api: &Api, what: &str, index: u32) -> Result<cu::CUdevice> {
    let na = |reason: String| Error::NotAvailable {
        what: what.to_string(),
        reason,
    };
    match api.init() {
        Ok(()) => {}
        Err(s) if s == sys::NO_DEVICE => {
            return Err(na(format!(
                "no CUDA device: cuInit returned {}",
                describe(api, s)
            )));
        }
        Err(s) => {
            return Err(na(format!(
                "the CUDA driver did not initialise: cuInit returned {}",
                describe(api, s)
            )));
        }
    }
    let count = api
        .device_count()
        .map_err(|s| failed(api, what, "cuDeviceGetCount", s))?;
    let ordinal = i32::try_from(index).unwrap_or(i32::MAX);
    if ordinal >= count {
        return Err(na(format!(
            "CUDA device {index} does not exist: this host has {count} CUDA device{}{}; set \
             [cuda] device",
            if count == 1 { "" } else { "s" },
            if count > 0 {
                format!(" (0 to {})", count - 1)
            } else {
                String::new()
            }
        )));
    }
    api.device(ordinal)
        .map_err(|s| failed(api, what, &format!("cuDeviceGet({index})"), s))
}

/// A device with its primary context retained and current on this thread.
#[derive(Debug)]
pub(crate) struct Session {
    pub(crate) api: &'static Api,
    pub(crate) index: u32,
    pub(crate) device: i32,
    pub(crate) ctx: Context,
    /// The thread's context before `open`, put back by `restore` (`None`
    /// when the driver would not say).
    pub(crate) previous: Option<Context>,
    pub(crate) name: String,
    pub(crate) driver_version: i32,
}

impl Session {
    pub(crate) fn open(api: &'static Api, what: &str, index: u32) -> Result<Session> {
        let failed = |step: &str, s: Status| failed(api, what, step, s);
        let device = device_by_index(api, what, index)?;
        let name = api.device_name(device).unwrap_or_default();
        let driver_version = api.driver_version().unwrap_or(0);
        let ctx = api
            .retain_primary(device)
            .map_err(|s| failed(&format!("cuDevicePrimaryCtxRetain of device {index}"), s))?;
        let previous = api.current().ok();
        let session = Session {
            api,
            index,
            device,
            ctx,
            previous,
            name,
            driver_version,
        };
        if let Err(s) = api.set_current(ctx) {
            let e = failed(&format!("cuCtxSetCurrent of device {index}"), s);
            let _ = session.close();
            return Err(e);
        }
        Ok(session)
    }

    /// Make the thread's previous context current again (a warning when
    /// the driver refuses: the thread keeps ours, which stays valid).
    pub(crate) fn restore(&self) {
        if let Some(previous) = self.previous
            && let Err(s) = self.api.set_current(previous)
        {
            tracing::warn!(
                "cuda pinner could not restore the thread's CUDA context: {}",
                describe(self.api, s)
            );
        }
    }

    /// Release the primary context.
    pub(crate) fn close(&self) -> Result<(), String> {
        self.api.release_primary(self.device).map_err(|s| {
            format!(
                "cuDevicePrimaryCtxRelease of device {}: {}",
                self.index,
                describe(self.api, s)
            )
        })
    }
}
