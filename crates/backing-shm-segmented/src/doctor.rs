//! `hostpool doctor`'s findings for this backing: `/dev/shm`, the tmpfs
//! its pools live in.

use std::path::Path;

use pool_core::format_bytes;
use pool_core::host::fs::{self as hostfs, FsKind, filesystem_kind};
use pool_core::plugin::{DoctorContext, Finding};
use serde_json::json;

const GIB: u64 = 1 << 30;

/// The hook in this backing's record.
pub(crate) fn findings(_: &DoctorContext<'_>) -> Vec<Finding> {
    shm()
}

const SHM: &str = "/dev/shm";

/// `/dev/shm`: a tmpfs, and big enough for shared-memory pools.
fn shm() -> Vec<Finding> {
    let dir = Path::new(SHM);
    let grow = "docker run --shm-size=<N>g (or --ipc=host); Kubernetes: mount an emptyDir \
                {medium: Memory, sizeLimit: <N>Gi} at /dev/shm";
    let f = Finding::new("shm", SHM, "");
    // `statvfs`: size 0 means no limit.
    let space = hostfs::space(dir).map(|s| (s.total_bytes(), s.free_bytes()));
    let finding = match (filesystem_kind(dir), space) {
        (Err(e), _) | (_, Err(e)) => f.with_value(format!("cannot be examined: {e}")).warn(
            format!(
                "shared pools keep their control files in /dev/shm: mount a tmpfs there (`mount -t \
             tmpfs -o size=<N>G tmpfs /dev/shm`), or {grow}"
            ),
        ),
        (Ok(FsKind::Tmpfs), Ok((0, _))) => f
            .with_value("tmpfs without a size limit (bounded by memory)")
            .details(json!({ "size": 0, "free": null })),
        (Ok(FsKind::Tmpfs), Ok((size, free))) => {
            let f = f
                .with_value(format!(
                    "tmpfs, {}, {} free",
                    format_bytes(size),
                    format_bytes(free)
                ))
                .details(json!({ "size": size, "free": free }));
            if size < GIB {
                f.warn(format!(
                    "smaller than 1 GiB (Docker's default is 64 MiB), too small for a \
                     shared-memory pool: {grow}"
                ))
            } else {
                f
            }
        }
        (Ok(kind), Ok((size, free))) => f
            .with_value(format!(
                "not tmpfs ({kind:?}), {}, {} free",
                format_bytes(size),
                format_bytes(free)
            ))
            .warn(format!(
                "shared-memory pools need a tmpfs: `mount -t tmpfs -o size=<N>G tmpfs /dev/shm`, \
             or {grow}"
            )),
    };
    vec![finding]
}
