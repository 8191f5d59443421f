//! Error construction: loading libibverbs, listing, opening and querying
//! the devices, splitting the pool into regions and registering them, each
//! error with the operator's remedy.

use pool_core::host::memlock;
use pool_core::{Context, Error, Extent, LayoutError, PageSize, Region, format_bytes};

use crate::memlock::pinned_bytes;
use crate::sys::{LoadError, OpenFailure};

/// How to install libibverbs, for error messages.
const INSTALL: &str = "install the RDMA user-space library from rdma-core (Debian/Ubuntu: \
    `apt-get install libibverbs1 ibverbs-providers`; RHEL/Fedora: `dnf install libibverbs`), \
    or point `[rdma] library` at it";

pub(crate) fn load_error(library: &str, e: LoadError) -> Error {
    match e {
        LoadError::Open(e) => Error::NotAvailable {
            what: "RDMA registration".into(),
            reason: format!("cannot load {library} ({}); {INSTALL}", chain(&e)),
        },
        LoadError::Symbol(symbol, e) => Error::NotAvailable {
            what: "RDMA registration".into(),
            reason: format!(
                "{library} has no `{symbol}` ({}): it is not libibverbs, or far too old; {INSTALL}",
                chain(&e)
            ),
        },
    }
}

/// An error and all its sources, `: `-separated.
fn chain(e: &dyn std::error::Error) -> String {
    let mut out = e.to_string();
    let mut next = e.source();
    while let Some(s) = next {
        out.push_str(": ");
        out.push_str(&s.to_string());
        next = s.source();
    }
    out
}

pub(crate) fn list_error(e: std::io::Error) -> Error {
    if e.raw_os_error() == Some(libc::ENOSYS) {
        Error::NotAvailable {
            what: "RDMA registration".into(),
            reason: "kernel without RDMA: ibv_get_device_list failed with ENOSYS (there is no \
                     /sys/class/infiniband_verbs); load the RDMA modules (`modprobe ib_uverbs` and \
                     the NIC's RDMA driver, e.g. `mlx5_ib`), or in a container pass /dev/infiniband \
                     and /sys/class/infiniband_verbs through"
                .into(),
        }
    } else {
        Error::Plugin {
            what: "rdma registrar: ibv_get_device_list".into(),
            message: "cannot list the RDMA devices".into(),
            source: Some(Box::new(e)),
        }
    }
}

pub(crate) fn open_error(device: &str, f: OpenFailure) -> Error {
    let message = match f.step {
        "ibv_open_device" => {
            "cannot open the device; check access to /dev/infiniband/uverbs* and that the NIC's \
             RDMA driver is loaded"
        }
        _ => "cannot allocate a protection domain on the device",
    };
    device_error_with(device, f.step, message, f.error)
}

pub(crate) fn device_error(device: &str, step: &str, e: std::io::Error) -> Error {
    device_error_with(device, step, "the device refused the call", e)
}

fn device_error_with(device: &str, step: &str, message: &str, e: std::io::Error) -> Error {
    Error::Plugin {
        what: format!("rdma registrar: {step} on RDMA device {device}"),
        message: message.to_string(),
        source: Some(Box::new(e)),
    }
}

pub(crate) fn layout_error(
    device: &str,
    max: u64,
    page: PageSize,
    block: u64,
    e: LayoutError,
) -> Error {
    let message = match &e {
        LayoutError::UnitExceedsLimit { unit, .. } => format!(
            "its max_mr_size of {} is smaller than one registration unit of {} (the least common \
             multiple of the {page} page and the {} block), so no region could hold a whole \
             block; use a smaller block_size",
            format_bytes(max),
            format_bytes(*unit),
            format_bytes(block)
        ),
        _ => format!(
            "cannot split the pool at its max_mr_size of {}",
            format_bytes(max)
        ),
    };
    Error::Plugin {
        what: format!("rdma registrar on RDMA device {device}"),
        message,
        source: Some(Box::new(e)),
    }
}

pub(crate) fn reg_error(
    device: &str,
    region: &Region<'_>,
    (index, count): (usize, usize),
    extent: Extent,
    max: u64,
    e: std::io::Error,
) -> Error {
    let advice = match e.raw_os_error() {
        Some(libc::ENOMEM) => {
            let st = memlock::state();
            let limit = |l: Option<u64>| l.map_or("unlimited".to_string(), format_bytes);
            let why = if st.cap_ipc_lock {
                "this process has CAP_IPC_LOCK, so the limit is not the cause here: the NIC or the \
                 kernel ran out of memory for the translation tables (see the kernel log, dmesg)"
                    .to_string()
            } else {
                format!(
                    "this process has no CAP_IPC_LOCK, a soft limit of {}, a hard limit of {}, \
                     and {} already pinned (VmPin); raise the limit (`ulimit -l unlimited`, \
                     Docker `--ulimit memlock=-1`, systemd or containerd \
                     `LimitMEMLOCK=infinity`) or grant CAP_IPC_LOCK. ENOMEM can also mean the \
                     NIC ran out of translation resources: see the kernel log (dmesg)",
                    limit(st.soft),
                    limit(st.hard),
                    pinned_bytes().map_or("an unknown amount".to_string(), format_bytes)
                )
            };
            format!(
                "ibv_reg_mr pins the pages and counts them against RLIMIT_MEMLOCK unless the \
                 process has CAP_IPC_LOCK; {why}"
            )
        }
        Some(libc::EINVAL) => format!(
            "the device refused the range or the access flags (local write, remote write, remote \
             read): a region must not exceed its max_mr_size of {} and must cover whole pages",
            format_bytes(max)
        ),
        Some(libc::EFAULT) => {
            "the range is not mapped or not accessible; the pool must stay mapped while it is \
             registered"
                .to_string()
        }
        Some(libc::EPERM | libc::EACCES) => {
            "permission denied: check access to /dev/infiniband/uverbs* (and CAP_IPC_LOCK)"
                .to_string()
        }
        _ => "see the kernel log (dmesg) for the driver's reason".to_string(),
    };
    let mut context = Context::new(extent.len, region.page()).remedy(format!(
        "region {} of {count} at offset {:#x} ({}) of the pool, on RDMA device {device}; {advice}",
        index + 1,
        extent.offset,
        format_bytes(extent.offset)
    ));
    if let Some(p) = region.at(extent.offset) {
        context = context.addr(p as usize);
    }
    Error::os("ibv_reg_mr", e, context)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn enosys_is_not_available_kernel_without_rdma_and_other_errnos_are_failures() {
        let e = list_error(std::io::Error::from_raw_os_error(libc::ENOSYS));
        assert!(e.is_not_available());
        assert!(e.to_string().contains("kernel without RDMA"), "{e}");
        let e = list_error(std::io::Error::from_raw_os_error(libc::EACCES));
        assert!(!e.is_not_available());
        assert!(std::error::Error::source(&e).is_some());
    }
}
