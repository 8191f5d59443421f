//! Facts about this node that several plugins read, each read in one
//! place: filesystems, their space and the mount table ([`fs`]), memory,
//! cgroup limits and the capacity checks made of them ([`capacity`]), the
//! memlock bound ([`memlock`]), NUMA topology and placement ([`numa`]),
//! and what a peer process is doing ([`process`]).

pub mod capacity;
pub mod fs;
pub mod memlock;
pub mod numa;
pub mod process;
