//! Facts about this node that several plugins read, and the checks made of
//! them. The facts are `hostpool-node`'s, re-exported here: filesystems,
//! their space and the mount table ([`fs`]), the cgroup walk that finds the
//! limits binding this process ([`cgroup`]), what a process is doing and
//! holds ([`process`]), transparent huge pages ([`thp`]), what a Python
//! interpreter answers about its packages ([`python`]). The checks and
//! actions are the core's: capacity checks of memory and cgroup limits
//! ([`capacity`], with the memory facts), the memlock bound ([`memlock`]),
//! NUMA placement and its verification ([`numa`], with the topology).

pub mod capacity;
pub mod memlock;
pub mod numa;

pub use hostpool_node::{cgroup, fs, process, python, thp};
