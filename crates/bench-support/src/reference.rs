//! The plain-C prefault reference, used by the benches and `hostpool bench`.
//!
//! `benches/c/raw_populate.c` (compiled by `build.rs`) is the kernel's path
//! with nothing around it: the range is cut into page-aligned contiguous
//! slices, as even as pages allow, one pthread per slice, and each thread makes
//! a single `madvise(MADV_POPULATE_WRITE)` over its whole slice. The prefault
//! engine ([`pool_core::prefault::run`]) must reach 0.9 of its throughput.
//! [`raw_memset`] writes every byte with the same split: the memory-bandwidth
//! limit that faulting (which zeroes every page) cannot beat.
//!
//! The functions are defined, next to their C declarations, in the crate's
//! `sys` module.

pub use crate::sys::{raw_memset, raw_populate};
