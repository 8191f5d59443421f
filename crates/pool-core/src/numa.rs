//! NUMA placement (being written).
