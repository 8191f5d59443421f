//! Facts about this node that several plugins read, each read in one
//! place: filesystems, their space and the mount table ([`fs`]), the cgroup
//! walk that finds the limits binding this process ([`cgroup`]), memory and
//! the capacity checks made of it and of the cgroup limits ([`capacity`]),
//! the memlock bound ([`memlock`]), NUMA topology and placement ([`numa`]),
//! transparent huge pages ([`thp`]), and what a process is doing and holds
//! ([`process`]).

pub mod capacity;
pub mod cgroup;
pub mod fs;
pub mod memlock;
pub mod numa;
pub mod process;
pub mod thp;
