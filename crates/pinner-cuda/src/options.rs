//! The `[cuda]` table: device, chunk size and registration flags.

use pool_core::format_bytes;
use pool_core::plugin::parse_table;
use pool_core::{ByteSize, Error, Result};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::sys::{self};
use crate::{DEFAULT_CHUNK_SIZE, DRIVER_CHUNK_LIMIT, NAME};

/// A `cuMemHostRegister` flag.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum RegisterFlag {
    /// `CU_MEMHOSTREGISTER_PORTABLE`: pinned for every CUDA context, not
    /// only the one that registered it.
    Portable,
    /// `CU_MEMHOSTREGISTER_DEVICEMAP`: also mapped into the device's address
    /// space (`cuMemHostGetDevicePointer`).
    Devicemap,
}

impl RegisterFlag {
    pub(crate) fn bits(self) -> u32 {
        match self {
            RegisterFlag::Portable => sys::REGISTER_PORTABLE,
            RegisterFlag::Devicemap => sys::REGISTER_DEVICEMAP,
        }
    }
}

pub(crate) fn default_chunk_size() -> ByteSize {
    DEFAULT_CHUNK_SIZE
}

pub(crate) fn default_flags() -> Vec<RegisterFlag> {
    vec![RegisterFlag::Portable]
}

/// The `[cuda]` table.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CudaOptions {
    /// Device index (CUDA ordinal), default 0.
    #[serde(default)]
    pub device: u32,
    /// Most bytes per `cuMemHostRegister` call (bytes or an IEC size),
    /// default 64 GiB; below 512 GiB.
    #[serde(default = "default_chunk_size")]
    pub chunk_size: ByteSize,
    /// Registration flags, default `["portable"]`; `[]` registers for the
    /// primary context only.
    #[serde(default = "default_flags")]
    pub flags: Vec<RegisterFlag>,
}

impl Default for CudaOptions {
    fn default() -> Self {
        CudaOptions {
            device: 0,
            chunk_size: DEFAULT_CHUNK_SIZE,
            flags: default_flags(),
        }
    }
}

impl CudaOptions {
    /// Parse and check a `[cuda]` table (`None`: the defaults).
    ///
    /// # Errors
    /// [`Error::Config`] for an unknown key, a zero `chunk_size`, one of
    /// 512 GiB or more, or a device index beyond `i32`.
    pub fn from_table(table: Option<&Value>) -> Result<CudaOptions> {
        let o: CudaOptions = parse_table(NAME, table)?;
        if o.chunk_size.get() == 0 {
            return Err(Error::config(
                "in table [cuda]: chunk_size must be more than 0 bytes (default 64GiB)",
            ));
        }
        if o.chunk_size.get() >= DRIVER_CHUNK_LIMIT {
            return Err(Error::config(format!(
                "in table [cuda]: chunk_size {} is 512 GiB or more, which NVIDIA drivers from R580 \
                 reject in one cuMemHostRegister call; use 256GiB or less (default 64GiB)",
                format_bytes(o.chunk_size.get())
            )));
        }
        if i32::try_from(o.device).is_err() {
            return Err(Error::config(format!(
                "in table [cuda]: device {} is not a CUDA device index",
                o.device
            )));
        }
        Ok(o)
    }

    /// The flags as the driver takes them.
    pub fn flag_bits(&self) -> u32 {
        self.flags.iter().fold(0, |acc, f| acc | f.bits())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn the_table_defaults_to_device_0_64_gib_chunks_portable() {
        let o = CudaOptions::from_table(None).unwrap();
        assert_eq!(o, CudaOptions::default());
        assert_eq!(o.chunk_size, ByteSize::gib(64));
        assert_eq!(o.flag_bits(), 1);
    }

    #[test]
    fn the_table_takes_iec_sizes_and_both_flags() {
        let o = CudaOptions::from_table(Some(&json!({
            "device": 3, "chunk_size": "256GiB", "flags": ["portable", "devicemap"]
        })))
        .unwrap();
        assert_eq!(o.device, 3);
        assert_eq!(o.chunk_size.get(), 256 << 30);
        assert_eq!(o.flag_bits(), 3);
        let o = CudaOptions::from_table(Some(&json!({"chunk_size": 4096, "flags": []}))).unwrap();
        assert_eq!((o.chunk_size.get(), o.flag_bits()), (4096, 0));
    }

    #[test]
    fn the_table_rejects_unknown_keys_flags_and_sizes_the_driver_refuses() {
        for (table, want) in [
            (json!({"chunksize": "1GiB"}), "chunksize"),
            (json!({"flags": ["iomemory"]}), "iomemory"),
            (json!({"chunk_size": "64G"}), "GiB"),
            (json!({"chunk_size": 0}), "more than 0"),
            (json!({"chunk_size": "512GiB"}), "R580"),
            (
                json!({"device": 4_000_000_000u64}),
                "not a CUDA device index",
            ),
        ] {
            let e = CudaOptions::from_table(Some(&table)).unwrap_err();
            let msg = e.to_string();
            assert!(e.is_usage(), "{e:?}");
            assert!(
                msg.contains(want) && msg.contains("[cuda]"),
                "{table}: missing {want:?} in {msg}"
            );
        }
        assert!(CudaOptions::from_table(Some(&json!({"chunk_size": "511GiB"}))).is_ok());
    }
}
