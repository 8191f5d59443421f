//! `bench-support`: what `hostpool bench` (the CLI) and the criterion benches
//! (`benches/`) share, kept out of the `hostpool` facade's public API.
//!
//! * [`benchkit`]: the kinds of memory measured, fresh unfaulted pools, one
//!   timed prefault with the engine or the C reference, `mmap(MAP_POPULATE)`
//!   of the same kind of memory, warm-up, and the small helpers around them.
//! * [`reference`](mod@reference): the plain-C prefault reference
//!   (`benches/c/raw_populate.c`, compiled by `build.rs`).
//!
//! Pools are planned through pool-core's plugin registry, so the program
//! that uses this crate must link the backings it measures (the `hostpool`
//! crate names every built-in one).
//!
//! All `unsafe` code lives in the private `sys` module: the C functions'
//! declarations and calls, and the one `mmap` that
//! [`benchkit::map_populate_once`] times.

#![deny(unsafe_code)]

pub mod benchkit;
pub mod reference;
mod sys;

pub use sys::{SharedMap, memset_mmap};
