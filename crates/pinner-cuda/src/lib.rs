//! `cuda`: pins a pool for GPU DMA with `cuMemHostRegister`, the driver
//! loaded at run time.
//!
//! ```toml
//! pin = { kind = "cuda", required = false }
//! block_size = "2MiB"      # chunk boundaries never split a block
//!
//! [cuda]
//! device = 0               # device index (default 0)
//! chunk_size = "64GiB"     # most bytes per cuMemHostRegister call (default 64 GiB)
//! flags = ["portable"]     # "portable", "devicemap" (default ["portable"])
//! ```
//!
//! What [`Pinner::pin`] does, in order:
//!
//! 1. Finds the driver library through cudarc (`is_culib_present`) and
//!    resolves every driver symbol this crate calls. No driver, or one that
//!    lacks a symbol, is [`Error::NotAvailable`](pool_core::Error::NotAvailable); nothing panics and no panic
//!    message is printed (cudarc's own wrappers panic on both, so they are
//!    not used: see the `sys` module).
//! 2. Checks the memlock bound ([`pool_core::host::memlock::check`]) before any
//!    driver call, so a pool the process may not pin is skipped (best
//!    effort) or refused (required) without touching the GPU (seed 004: a
//!    failed registration can leave the CUDA context broken).
//! 3. `cuInit`, the device by index, its primary context retained (for as
//!    long as the pin lives: registrations die with their context) and made
//!    current on the calling thread while registering; the thread's previous
//!    context is current again afterwards.
//! 4. `cuMemHostRegister_v2` over
//!    [`registration_chunks`](pool_core::registration_chunks):
//!    chunks of at most `chunk_size` (NVIDIA drivers from R580 reject one
//!    call of 512 GiB or more), page-aligned and never splitting a block of
//!    `block_size` (default: the page size). All or nothing: when a chunk
//!    fails, the chunks before it are unregistered in reverse and the error
//!    names the chunk, its offset and size, and the driver's error name.
//!
//! The [`Pin`](pool_core::plugin::Pin) reports the device, the flags, each chunk's offset, length
//! and seconds, the total and per-GiB seconds and the memlock verdict.
//! Unpinning unregisters in reverse, then releases the primary context; a
//! step that fails is a [`TeardownIssue`](pool_core::TeardownIssue), never a panic.
//!
//! [`verify_copy`] copies a buffer host → device → host from the pinned pool
//! and checks it (`hostpool alloc --pin cuda --verify-copy`).
//!
//! The crate also submits the GPU plugin record `cuda`
//! ([`GpuPlugin`]) that `numa_node = "gpu"`
//! asks: [`locate_gpu`] gives the PCI address (`cuDeviceGetPCIBusId`) of
//! the `[cuda] device`, [`list_gpus`] that of every device, and `hostpool
//! doctor` maps each to its NUMA node and CPUs (item "GPU NUMA placement")
//! and checks a pool's numeric `numa_node` against its device's node.
//!
//! The driver is the real `libcuda.so.1`, or in tests the `fake-cuda` test
//! double loaded in its place through `LD_LIBRARY_PATH`.

mod doctor;

use pool_core::plugin::PinCost;
use pool_core::plugin::{GpuPlugin, Pinner, PinnerPlugin};
use pool_core::{ByteSize, Result};
use serde_json::Value;

mod copy;
mod gpu;
mod options;
mod pin;
mod probe;
mod session;
mod sys;

pub use copy::{CopyReport, verify_copy};
pub use doctor::{PLACEMENT_ITEM, POOL_NODE_ITEM};
pub use gpu::{GIVE_NODE_NUMBER, list_gpus, locate_gpu};
pub use options::{CudaOptions, RegisterFlag};
pub use pin::{ChunkReport, CudaPin};
pub use probe::{DriverInfo, probe_devices, probe_driver};

/// The plugin name.
pub const NAME: &str = "cuda";

/// The default chunk size: 64 GiB, as vLLM registers.
pub const DEFAULT_CHUNK_SIZE: ByteSize = ByteSize::gib(64);

/// The smallest single registration NVIDIA drivers from R580 refuse
/// ("failed to allocate page table"); `chunk_size` must stay below it.
pub const DRIVER_CHUNK_LIMIT: u64 = 512 << 30;

/// Every driver symbol this crate resolves (all of them before the first
/// call), as the driver library exports them.
pub const DRIVER_SYMBOLS: &[&str] = sys::SYMBOLS;

/// The configured pinner.
#[derive(Debug, Clone)]
pub struct CudaPinner {
    pub(crate) options: CudaOptions,
}

impl CudaPinner {
    /// A pinner with these options.
    pub fn new(options: CudaOptions) -> CudaPinner {
        CudaPinner { options }
    }

    /// Its options.
    pub fn options(&self) -> &CudaOptions {
        &self.options
    }
}

fn build(table: Option<&Value>) -> Result<Box<dyn Pinner>> {
    Ok(Box::new(CudaPinner::new(CudaOptions::from_table(table)?)))
}

inventory::submit! {
    PinnerPlugin::new(
        NAME,
        "cuMemHostRegister of the pool in chunks (driver loaded at run time; [cuda] device, chunk_size, flags)",
        env!("CARGO_PKG_NAME"),
        build,
    )
    .with_cost(PinCost::new(pool_core::plugin::REGISTER_SECONDS_PER_PAGE, false))
    .with_doctor(doctor::findings)
}

inventory::submit! {
    GpuPlugin::new(
        NAME,
        "the PCI address of the [cuda] device (cuDeviceGetPCIBusId), for numa_node = \"gpu\"",
        env!("CARGO_PKG_NAME"),
        locate_gpu,
        list_gpus,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_plugin_is_registered_under_its_name() {
        let p = pool_core::plugin::lookup::<PinnerPlugin>(NAME).unwrap();
        assert_eq!(p.origin, "pinner-cuda");
        let pinner = (p.build)(None).unwrap();
        assert_eq!(pinner.name(), NAME);
    }

    #[test]
    fn the_gpu_plugin_is_registered_under_the_pinners_name() {
        let p = pool_core::plugin::lookup::<GpuPlugin>(NAME).unwrap();
        assert_eq!((p.name, p.origin), (NAME, "pinner-cuda"));
        assert!(std::ptr::fn_addr_eq(
            p.locate,
            locate_gpu as pool_core::plugin::LocateFn
        ));
        assert!(std::ptr::fn_addr_eq(
            p.list,
            list_gpus as pool_core::plugin::ListGpusFn
        ));
        // A pool that pins with cuda finds it by name.
        let mut config = pool_core::PoolConfig::default();
        config.pin.kind = Some(NAME.to_string());
        assert_eq!(pool_core::plugin::gpu_plugin(&config).unwrap().name, NAME);
    }

    #[test]
    fn the_symbol_list_has_every_call_once() {
        let mut s = DRIVER_SYMBOLS.to_vec();
        s.sort_unstable();
        s.dedup();
        assert_eq!(s.len(), DRIVER_SYMBOLS.len());
        for want in [
            "cuMemHostRegister_v2",
            "cuMemHostUnregister",
            "cuGetErrorName",
            "cuDeviceGetPCIBusId",
        ] {
            assert!(DRIVER_SYMBOLS.contains(&want));
        }
    }
}
