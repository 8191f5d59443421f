//! The RDMA devices: what `hostpool doctor` and the plan learn of them
//! without registering anything ([`probe()`]), and which of them a
//! registration uses.

use std::sync::Arc;

use pool_core::{Error, Result};
use serde::Serialize;

use crate::error::{list_error, load_error};
use crate::options::RdmaOptions;
use crate::sys::{Device, Session, Verbs};

/// One RDMA device as [`probe`] finds it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct DeviceProbe {
    /// The kernel device name (`ibv_get_device_name`), e.g. `mlx5_0`.
    pub name: String,
    /// `ibv_query_device(...).max_mr_size`, when the device could be opened
    /// and queried.
    pub max_mr_size: Option<u64>,
    /// What failed, when something did (open, protection domain, query or
    /// close), with the errno.
    pub error: Option<String>,
}

/// The RDMA devices the registrar would use, without registering anything:
/// loads the library of `options`, lists the devices (all of them, not only
/// `[rdma] devices`), and opens each one to read its `max_mr_size`, then
/// closes it again. For `hostpool doctor`.
///
/// # Errors
/// [`Error::NotAvailable`] when the library cannot be loaded (naming it and
/// the package to install) or the kernel has no RDMA (`ENOSYS` from
/// `ibv_get_device_list`), as registration would say; [`Error::Plugin`] for
/// another failure to list the devices. No device is `Ok` with an empty list.
pub fn probe(options: &RdmaOptions) -> Result<Vec<DeviceProbe>> {
    options.validate()?;
    let library = options.library();
    let verbs = Arc::new(Verbs::load(library).map_err(|e| load_error(library, e))?);
    let list = verbs.device_list().map_err(list_error)?;
    Ok(list
        .devices()
        .iter()
        .map(|device| {
            let name = device.name().to_string();
            let session = match Session::open(&verbs, device) {
                Ok(s) => s,
                Err(f) => {
                    return DeviceProbe {
                        name,
                        max_mr_size: None,
                        error: Some(format!("{}: {}", f.step, f.error)),
                    };
                }
            };
            let queried = session.max_mr_size();
            let closed = session.close();
            let mut errors: Vec<String> = closed
                .iter()
                .map(|c| format!("{}: {}", c.step, c.error))
                .collect();
            if let Err(e) = &queried {
                errors.insert(0, format!("ibv_query_device: {e}"));
            }
            DeviceProbe {
                name,
                max_mr_size: queried.ok(),
                error: (!errors.is_empty()).then(|| errors.join("; ")),
            }
        })
        .collect())
}

/// The devices the options select, in the order asked for (or the library's).
pub(crate) fn select<'a>(
    present: &'a [Device],
    wanted: Option<&[String]>,
) -> Result<Vec<&'a Device>> {
    if present.is_empty() {
        return Err(Error::NotAvailable {
            what: "RDMA registration".into(),
            reason:
                "no RDMA devices found (ibv_get_device_list returned none): check `ibv_devices` \
                     or `rdma link`, that the NIC's RDMA driver (e.g. mlx5_ib) and the user-space \
                     providers (ibverbs-providers) are installed, and in a container that \
                     /dev/infiniband is passed through"
                    .into(),
        });
    }
    let Some(wanted) = wanted else {
        return Ok(present.iter().collect());
    };
    wanted
        .iter()
        .map(|w| {
            present
                .iter()
                .find(|d| d.name() == w)
                .ok_or_else(|| Error::NotAvailable {
                    what: format!("RDMA device `{w}`"),
                    reason: format!(
                        "no such device; devices present: {}. Set [rdma] devices to some of them, \
                         or leave the key out to register with all",
                        present
                            .iter()
                            .map(Device::name)
                            .collect::<Vec<_>>()
                            .join(", ")
                    ),
                })
        })
        .collect()
}
