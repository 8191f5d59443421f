//! `hostpool doctor`'s `nixl` area: whether the C API loads, which
//! backends it finds, and whether the pool's backend is among them.

use pool_core::plugin::{DoctorContext, Finding};

use crate::{NAME, NixlOptions, load};

pub(crate) fn findings(ctx: &DoctorContext<'_>) -> Vec<Finding> {
    let options: NixlOptions = ctx
        .config()
        .and_then(|c| c.plugin_table(NAME))
        .and_then(|t| serde_json::from_value(t.clone()).ok())
        .unwrap_or_default();
    let (lib, source) = crate::library(&options);
    let api = match load(&options) {
        Ok((api, _)) => api,
        Err(e) => {
            let f = Finding::new(
                NAME,
                "library",
                format!("{lib} (from {source}) does not load"),
            );
            let reason = e.to_string();
            return vec![if ctx.registers_with(NAME) {
                f.fail(reason)
            } else {
                f.info(reason)
            }];
        }
    };
    let version = crate::version(&lib);
    let mut out = vec![
        Finding::new(
            NAME,
            "library",
            format!(
                "{lib} (from {source}) loads: NIXL 1.5 C API, {}",
                version
                    .as_deref()
                    .unwrap_or("version unknown (not a wheel)")
            ),
        )
        .details(serde_json::json!({ "library": lib, "version": version })),
    ];
    let name = format!("hostpool-doctor-{}", std::process::id());
    let backend = options.backend();
    match crate::Agent::new(api, &name, None, false, backend, &[]) {
        Ok(agent) => {
            let plugins = agent.plugins().unwrap_or_default();
            out.push(
                Finding::new(NAME, "backends", format!("{} found; {backend} loads", plugins.join(", ")))
                    .details(serde_json::json!({ "plugins": plugins })),
            );
        }
        Err(f) => out.push(Finding::new(NAME, format!("backend {backend}"), format!("does not load: {f}")).fail(
            "check NIXL_PLUGIN_DIR (the plugins/ directory next to libnixl.so) and the backend's parameters",
        )),
    }
    out
}
