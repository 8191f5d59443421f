//! The `[rdma]` table: which devices to register with, and which library
//! to load.

use pool_core::{Error, Result};
use serde::{Deserialize, Serialize};

/// The library loaded when `[rdma] library` is not set.
pub const DEFAULT_LIBRARY: &str = "libibverbs.so.1";

/// The `[rdma]` table.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RdmaOptions {
    /// Device names (`ibv_devices`), e.g. `mlx5_0`; every device when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub devices: Option<Vec<String>>,
    /// The library to load instead of `libibverbs.so.1`: a bare name goes
    /// through the dynamic loader's search path, a name with a `/` is a file.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub library: Option<String>,
}

impl RdmaOptions {
    pub(crate) fn validate(&self) -> Result<()> {
        if let Some(devices) = &self.devices {
            if devices.is_empty() {
                return Err(Error::config(
                    "[rdma] devices is empty; name at least one device (see `ibv_devices`), or leave \
                     the key out to register with every device",
                ));
            }
            for (i, d) in devices.iter().enumerate() {
                if d.is_empty() {
                    return Err(Error::config("[rdma] devices holds an empty name"));
                }
                if devices[..i].contains(d) {
                    return Err(Error::config(format!(
                        "[rdma] devices names `{d}` twice; name each device once"
                    )));
                }
            }
        }
        if self.library.as_deref() == Some("") {
            return Err(Error::config(
                "[rdma] library is empty; give a path or leave the key out for libibverbs.so.1",
            ));
        }
        Ok(())
    }

    /// The library to load.
    pub fn library(&self) -> &str {
        self.library.as_deref().unwrap_or(DEFAULT_LIBRARY)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{RdmaRegistrar, build};
    use serde_json::json;

    #[test]
    fn the_table_rejects_unknown_keys_and_bad_values() {
        let e = build(Some(&json!({"device": ["mlx5_0"]}))).unwrap_err();
        assert!(
            e.to_string().contains("[rdma]") && e.to_string().contains("device"),
            "{e}"
        );
        assert_eq!(e.exit_code(), 2);
        for (table, want) in [
            (json!({"devices": []}), "devices is empty"),
            (json!({"devices": ["a", "b", "a"]}), "names `a` twice"),
            (json!({"devices": [""]}), "empty name"),
            (json!({"library": ""}), "library is empty"),
        ] {
            let e = build(Some(&table)).unwrap_err();
            assert!(e.to_string().contains(want), "{table}: {e}");
            assert_eq!(e.exit_code(), 2);
        }
        let ok = build(Some(
            &json!({"devices": ["mlx5_0", "mlx5_1"], "library": "/x/libibverbs.so.1"}),
        ))
        .unwrap();
        assert_eq!(ok.name(), "rdma");
        assert_eq!(
            RdmaRegistrar::new(RdmaOptions::default())
                .unwrap()
                .options()
                .library(),
            "libibverbs.so.1"
        );
    }
}
