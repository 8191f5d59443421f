//! The `rdma` registrar: registers a pool with RDMA NICs through libibverbs,
//! so that NIXL, UCX or Mooncake can move KV-cache blocks to and from it.
//!
//! libibverbs is loaded at run time (`libloading`), so nothing RDMA is needed
//! to build, and a host without it gets a clear "not available" error rather
//! than a missing-library failure at start-up.
//!
//! ```toml
//! register = ["rdma"]
//! block_size = "2MiB"          # regions never split a block
//!
//! [rdma]
//! devices = ["mlx5_0", "mlx5_1"]   # default: every device present
//! library = "libibverbs.so.1"      # default; a path with a `/` names a file
//! ```
//!
//! For each selected device, in parallel (a thread per device): open it,
//! allocate a protection domain, query `max_mr_size`, and register the whole
//! aligned mapping in regions of at most `max_mr_size` bytes whose boundaries
//! fall on `lcm(page, block)` ([`pool_core::mr_regions`]), with local
//! write, remote write and remote read access. All or nothing: when any
//! region on any device fails, every device stops and every region
//! registered so far is deregistered, last-first on each device, before the
//! error is returned.
//!
//! Before anything is loaded, the pool is checked against the memlock bound
//! ([`pool_core::host::memlock::check`]): `ibv_reg_mr` counts the pages it pins
//! against `RLIMIT_MEMLOCK` unless the process has `CAP_IPC_LOCK`, once per
//! registration, so a pool registered on N devices counts N times. The
//! kernel (`ib_umem_get`) compares the pinned total with the *soft* limit,
//! while the bound is the hard one; so when the soft limit is too low and the
//! hard one allows more, the soft limit is raised to the hard one for as long
//! as the pool is registered, and restored on deregistration (the report says
//! so under `memlock_soft_limit`).
//!
//! The report (`details`) lists, per device, its name, `max_mr_size`, the time
//! taken and the regions as `{offset, addr, addr_u64, len, lkey, rkey}` (the
//! address as a hex string and as an integer).

mod doctor;
mod error;
mod memlock;
mod options;
mod probe;
mod register;
mod sys;

use pool_core::Result;
use pool_core::plugin::PinCost;
use pool_core::plugin::{Registrar, RegistrarPlugin};
use serde_json::Value;

pub use options::{DEFAULT_LIBRARY, RdmaOptions};
pub use probe::{DeviceProbe, probe};
pub use register::{RdmaRegistrar, RdmaRegistration};

/// The plugin name, and the name of its config table.
pub const NAME: &str = "rdma";

fn build(table: Option<&Value>) -> Result<Box<dyn Registrar>> {
    Ok(Box::new(RdmaRegistrar::new(
        pool_core::plugin::parse_table(NAME, table)?,
    )?))
}

inventory::submit! {
    RegistrarPlugin::new(
        NAME,
        "RDMA NICs through libibverbs (loaded at run time): ibv_reg_mr on every device in \
         parallel, regions split at max_mr_size on block boundaries; [rdma] devices, library",
        env!("CARGO_PKG_NAME"),
        build,
    )
    .with_cost(PinCost::new(pool_core::plugin::REGISTER_SECONDS_PER_PAGE, false))
    .with_doctor(doctor::findings)
}
