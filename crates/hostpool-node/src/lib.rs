//! Facts about this node, each read in one place, for every reader: the
//! core's plan and build, and the plugins (through `pool_core::host`, which
//! re-exports them beside the checks it makes of them). Filesystems, their
//! space and the mount table ([`fs`]), the cgroup walk that finds the limits
//! binding this process ([`cgroup`]), memory and its cgroup limit
//! ([`memory`]), what a process is doing and holds ([`process`]),
//! transparent huge pages ([`thp`]), the NUMA topology ([`numa`]), and what
//! a Python interpreter answers about its packages ([`python`]: the one way
//! `hostpool doctor` asks the engine's Python).
//!
//! It reads the node and decides nothing: no error of the pool's, no
//! remedy, no memory mapped. So it depends on no crate of the workspace,
//! and the core depends on it.

pub mod cgroup;
pub mod fs;
pub mod memory;
pub mod numa;
pub mod process;
pub mod python;
pub mod thp;

/// The variable that moves the root of sysfs, in a build with the feature:
/// a test lays out `bus/pci/devices/<id>/numa_node` and
/// `devices/system/node/...` of a machine it imitates (two NUMA nodes, GPUs
/// on each) there.
#[cfg(feature = "failpoints")]
pub const SYSFS_ROOT_ENV: &str = "HOSTPOOL_TEST_SYSFS_ROOT";

/// Where sysfs is: `/sys`, or in a build with the feature the directory
/// `HOSTPOOL_TEST_SYSFS_ROOT` names.
#[cfg(feature = "failpoints")]
pub fn sysfs_root() -> std::path::PathBuf {
    std::env::var_os(SYSFS_ROOT_ENV)
        .filter(|v| !v.is_empty())
        .map_or_else(|| "/sys".into(), std::path::PathBuf::from)
}

/// Where sysfs is: `/sys`, always, in a build without the feature.
#[cfg(not(feature = "failpoints"))]
#[inline(always)]
pub fn sysfs_root() -> std::path::PathBuf {
    "/sys".into()
}
