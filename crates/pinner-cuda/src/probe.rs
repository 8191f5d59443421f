//! The driver: loading it, and what `hostpool doctor` asks of it.

use pool_core::{Error, Result};
use serde::Serialize;

use crate::sys::{self, Api, Load, Status};

/// The driver, or why it is not available.
pub(crate) fn driver(what: &str) -> Result<&'static Api> {
    sys::load().map_err(|e| Error::NotAvailable {
        what: what.to_string(),
        reason: match e {
            Load::NoLibrary => "no CUDA driver (libcuda.so.1) on this host; install the NVIDIA \
                driver, or put the directory that holds libcuda.so.1 on LD_LIBRARY_PATH (in a \
                container: the NVIDIA container toolkit and `--gpus`)"
                .to_string(),
            Load::MissingSymbols(missing) => format!(
                "the CUDA driver library lacks {}: it is older than the CUDA 12 driver API this \
                 build calls; update the NVIDIA driver",
                missing.join(", ")
            ),
            Load::Panicked(msg) => format!("opening the CUDA driver library failed: {msg}"),
        },
    })
}

/// Whether the CUDA driver library is on this host and exports every symbol
/// this crate calls. Opens the library (through cudarc) and looks symbols
/// up; calls none of them, so it needs no device. For `hostpool doctor`.
///
/// # Errors
/// [`Error::NotAvailable`] saying what is missing, as pinning would.
pub fn probe_driver() -> Result<()> {
    driver("cuda pinner").map(|_| ())
}

/// The CUDA driver and its devices, as [`probe_devices`] finds them.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct DriverInfo {
    /// `cuDriverGetVersion`, e.g. 12080 for CUDA 12.8; `None` when the
    /// driver would not say.
    pub version: Option<i32>,
    /// The device names by ordinal (`cuDeviceGetName`); a device whose name
    /// cannot be read is listed as `device N`.
    pub devices: Vec<String>,
    /// Why there is no device, when `cuInit` said `CUDA_ERROR_NO_DEVICE`.
    pub no_device: Option<String>,
}

impl DriverInfo {
    /// The version as `major.minor`, e.g. `12.8`.
    pub fn version_text(&self) -> Option<String> {
        self.version
            .map(|v| format!("{}.{}", v / 1000, (v % 1000) / 10))
    }
}

/// The driver version and the devices with their names, without pinning:
/// `cuDriverGetVersion`, `cuInit`, `cuDeviceGetCount`, `cuDeviceGet` and
/// `cuDeviceGetName` only. No context is created and no memory is touched.
/// For `hostpool doctor`.
///
/// # Errors
/// [`Error::NotAvailable`] when there is no usable driver (as for
/// [`probe_driver`]) or `cuInit` fails other than with "no device";
/// [`Error::Plugin`] when `cuDeviceGetCount` fails. No device at all is
/// `Ok` with an empty list and [`DriverInfo::no_device`] set.
pub fn probe_devices() -> Result<DriverInfo> {
    const WHAT: &str = "CUDA driver";
    let api = driver(WHAT)?;
    sys::guarded(|| {
        let version = api.driver_version().ok();
        match api.init() {
            Ok(()) => {}
            Err(s) if s == sys::NO_DEVICE => {
                return Ok(DriverInfo {
                    version,
                    devices: Vec::new(),
                    no_device: Some(format!("cuInit returned {}", describe(api, s))),
                });
            }
            Err(s) => {
                return Err(Error::NotAvailable {
                    what: WHAT.into(),
                    reason: format!(
                        "the CUDA driver did not initialise: cuInit returned {}",
                        describe(api, s)
                    ),
                });
            }
        }
        let count = api.device_count().map_err(|s| Error::Plugin {
            what: WHAT.into(),
            message: format!("cuDeviceGetCount failed: {}", describe(api, s)),
            source: None,
        })?;
        let devices = (0..count.max(0))
            .map(|i| {
                api.device(i)
                    .and_then(|d| api.device_name(d))
                    .ok()
                    .filter(|n| !n.is_empty())
                    .unwrap_or_else(|| format!("device {i}"))
            })
            .collect();
        Ok(DriverInfo {
            version,
            devices,
            no_device: None,
        })
    })
    .unwrap_or_else(|msg| Err(panicked(WHAT, &msg)))
}

/// `NAME (description)` of a driver status.
pub(crate) fn describe(api: &Api, status: Status) -> String {
    match api.error_string(status) {
        Some(s) => format!("{} ({s})", api.error_name(status)),
        None => api.error_name(status),
    }
}

pub(crate) fn panicked(what: &str, msg: &str) -> Error {
    Error::Plugin {
        what: what.to_string(),
        message: format!(
            "the CUDA driver binding panicked ({msg}); this is a bug in hostpool, please report it"
        ),
        source: None,
    }
}
