//! `plugins`: the backings, pinners, registrars and adapters this binary
//! has linked.

use pool_core::plugin::{self, PluginRecord};
use pool_core::plugin::{AdapterPlugin, BackingPlugin, PinnerPlugin, RegistrarPlugin};
use serde_json::{Value, json};

use super::Finding;

/// The registered plugins of one kind.
fn plugin_kind<T: PluginRecord>(item: &str) -> Finding {
    match plugin::registry::<T>() {
        Ok(map) => {
            let names: Vec<&str> = map.keys().copied().collect();
            let details: Vec<Value> = map
                .values()
                .map(|r| json!({"name": r.name(), "origin": r.origin(), "summary": r.summary()}))
                .collect();
            let f = Finding::new(
                "plugins",
                item,
                if names.is_empty() {
                    "none".to_string()
                } else {
                    names.join(", ")
                },
            )
            .details(Value::Array(details));
            if names.is_empty() && T::KIND == "backing" {
                f.fail(
                    "no backing is linked: the binary must name the backing crates \
                     (`use backing_anon as _;`)",
                )
            } else {
                f
            }
        }
        Err(e) => Finding::new("plugins", item, e.to_string())
            .fail("every plan fails until one of the two plugins is renamed or unlinked"),
    }
}

/// The backings, pinners, registrars and adapters linked into this binary.
pub(super) fn findings() -> Vec<Finding> {
    vec![
        plugin_kind::<BackingPlugin>("backings"),
        plugin_kind::<PinnerPlugin>("pinners"),
        plugin_kind::<RegistrarPlugin>("registrars"),
        plugin_kind::<AdapterPlugin>("adapters"),
    ]
}
