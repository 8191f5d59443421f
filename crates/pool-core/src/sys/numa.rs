//! Raw NUMA system calls (being written).
