//! `hostpool plugins`: the registered backings, pinners, registrars and
//! adapters.

use clap::Args;
use pool_core::Error;
use pool_core::plugin::{self, PluginRecord};
use pool_core::plugin::{AdapterPlugin, BackingPlugin, PinnerPlugin, RegistrarPlugin};

use super::write_stdout;

/// `hostpool plugins`.
#[derive(Debug, Args)]
pub struct PluginsArgs {
    /// Print as JSON on stdout.
    #[arg(long)]
    pub json: bool,
}

#[derive(serde::Serialize)]
struct PluginEntry {
    name: &'static str,
    summary: &'static str,
    origin: &'static str,
}

fn entries<T: PluginRecord>() -> Result<Vec<PluginEntry>, Error> {
    Ok(plugin::registry::<T>()?
        .into_values()
        .map(|r| PluginEntry {
            name: r.name(),
            summary: r.summary(),
            origin: r.origin(),
        })
        .collect())
}

/// Run `hostpool plugins`.
pub(super) fn run(args: PluginsArgs) -> Result<i32, Error> {
    let kinds = [
        ("backings", entries::<BackingPlugin>()?),
        ("pinners", entries::<PinnerPlugin>()?),
        ("registrars", entries::<RegistrarPlugin>()?),
        ("adapters", entries::<AdapterPlugin>()?),
    ];
    let text = if args.json {
        let map: serde_json::Map<String, serde_json::Value> = kinds
            .iter()
            .map(|(k, v)| (k.to_string(), serde_json::to_value(v).unwrap_or_default()))
            .collect();
        super::to_json(&map)?
    } else {
        let mut s = String::new();
        for (kind, list) in &kinds {
            s.push_str(&format!("{kind}:\n"));
            if list.is_empty() {
                s.push_str("  (none)\n");
            }
            for p in list {
                s.push_str(&format!("  {:<16} {}  [{}]\n", p.name, p.summary, p.origin));
            }
        }
        s.trim_end().to_string()
    };
    write_stdout(&text)?;
    Ok(0)
}
