//! The `mooncake` adapter: the pool config's `[mooncake]` table, and
//! `hostpool doctor`'s probe of the Mooncake wheel.
//!
//! Mooncake (the distributed KV cache behind SGLang's HiCache, vLLM's
//! `MooncakeConnector` and LMCache's Mooncake store) has no C API: its
//! wheel (`mooncake-transfer-engine`, or `mooncake-transfer-engine-non-cuda`)
//! is a set of Python objects. So Mooncake is no registrar: the embedder
//! registers a pool with the engine's own `TransferEngine` or
//! `MooncakeDistributedStore` (`hostpool.mooncake.register` in the Python
//! package), and reads its settings from the pool's config:
//!
//! ```toml
//! [mooncake]
//! max_region = "2GiB"   # the largest region registered at once; default: one region
//! ```
//!
//! This crate submits an [`AdapterPlugin`] record, so the table is checked
//! with every other plugin table when a pool is planned (a typo is an error
//! naming `[mooncake]`), `hostpool plugins` lists it, and `hostpool doctor`
//! says whether a Python interpreter (`$HOSTPOOL_PYTHON`, else `python3` on
//! the `PATH`) imports `mooncake.engine`, from which distribution and
//! version, and with which transports.

mod doctor;
mod probe;

use pool_core::plugin::AdapterPlugin;
use pool_core::{ByteSize, Error, PoolConfig, Result};
use serde_json::Value;

/// The adapter's name, and the name of its config table.
pub const NAME: &str = "mooncake";

/// The `[mooncake]` table of a pool's config.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Options {
    /// The largest region registered with Mooncake at once (regions never
    /// split a block or a page); default: the whole pool (this rank's shard
    /// of a shared one) as one region.
    pub max_region: Option<ByteSize>,
}

impl Options {
    /// The options of a pool's config: its `[mooncake]` table, or the
    /// defaults when it has none.
    ///
    /// # Errors
    /// [`Error::Config`] naming `[mooncake]` and the key at fault: an
    /// unknown key, a size that does not parse, or a `max_region` of 0.
    pub fn from_config(config: &PoolConfig) -> Result<Options> {
        Options::from_table(config.plugin_table(NAME))
    }

    /// The options of a `[mooncake]` table as given (`None`: the defaults).
    ///
    /// # Errors
    /// As for [`Options::from_config`].
    pub fn from_table(table: Option<&Value>) -> Result<Options> {
        let options: Options = pool_core::plugin::parse_table(NAME, table)?;
        if options.max_region.is_some_and(|m| m.get() == 0) {
            return Err(Error::config(
                "[mooncake] max_region is 0; give a size such as \"2GiB\" (at least one block \
                 and page), or leave it out for one region",
            ));
        }
        Ok(options)
    }
}

fn validate(table: Option<&Value>) -> Result<()> {
    Options::from_table(table).map(drop)
}

pool_core::inventory::submit! {
    AdapterPlugin::new(
        NAME,
        "Mooncake (its Python TransferEngine or store registers the pool; no C API): \
         [mooncake] max_region, the largest region registered at once; doctor probes the wheel",
        env!("CARGO_PKG_NAME"),
        validate,
    )
    .with_doctor(doctor::findings)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn config(table: Value) -> PoolConfig {
        let mut c = PoolConfig::default();
        c.plugins.insert(NAME.into(), table);
        c
    }

    #[test]
    fn no_table_is_the_defaults() {
        assert_eq!(
            Options::from_config(&PoolConfig::default()).unwrap(),
            Options::default()
        );
        assert_eq!(Options::from_table(None).unwrap().max_region, None);
    }

    #[test]
    fn max_region_is_parsed_from_a_size_or_bytes() {
        let o = Options::from_config(&config(json!({"max_region": "2GiB"}))).unwrap();
        assert_eq!(o.max_region, Some(ByteSize::gib(2)));
        let o = Options::from_config(&config(json!({"max_region": 4096}))).unwrap();
        assert_eq!(o.max_region, Some(ByteSize(4096)));
        let o = Options::from_config(&config(json!({}))).unwrap();
        assert_eq!(o.max_region, None);
    }

    #[test]
    fn an_unknown_key_is_rejected_naming_the_table_and_the_key() {
        let e = Options::from_config(&config(json!({"max_regon": 1}))).unwrap_err();
        let msg = e.to_string();
        assert!(
            msg.contains("[mooncake]") && msg.contains("max_regon"),
            "{msg}"
        );
        assert_eq!(e.exit_code(), 2);
    }

    #[test]
    fn a_size_that_does_not_parse_is_rejected_naming_the_table() {
        let e = Options::from_config(&config(json!({"max_region": "2GB"}))).unwrap_err();
        assert!(e.to_string().contains("[mooncake]"), "{e}");
        assert_eq!(e.exit_code(), 2);
    }

    #[test]
    fn a_max_region_of_0_says_what_to_give() {
        for zero in [json!(0), json!("0")] {
            let e = Options::from_config(&config(json!({ "max_region": zero }))).unwrap_err();
            let msg = e.to_string();
            assert!(
                msg.contains("[mooncake] max_region is 0") && msg.contains("\"2GiB\""),
                "{msg}"
            );
            assert_eq!(e.exit_code(), 2);
        }
    }

    #[test]
    fn the_record_validates_through_the_core() {
        let plugin = pool_core::plugin::lookup::<AdapterPlugin>(NAME).unwrap();
        assert_eq!(plugin.origin, "adapter-mooncake");
        assert!(plugin.summary.contains("[mooncake] max_region"));
        assert!(plugin.doctor.is_some());
        pool_core::plugin::validate_plugin_tables(&config(json!({"max_region": "1GiB"}))).unwrap();
        let e = pool_core::plugin::validate_plugin_tables(&config(json!({"max_regon": 1})))
            .unwrap_err();
        assert!(e.to_string().contains("max_regon"), "{e}");
    }
}
