//! The linking pitfall, shown where it bites: this test target never names
//! `hostpool_example_backing_file`. Cargo passes the library to it all the
//! same, but rustc links only the crates the code names, so the `file`
//! record is not in this binary and the registry does not know it. Compare
//! `tests/conformance.rs` and `src/main.rs`, which name the crate
//! (`use hostpool_example_backing_file as _;`) and see it.

use pool_core::Error;
use pool_core::plugin::BackingPlugin;
use pool_core::plugin::{lookup, names};

#[test]
fn a_plugin_crate_that_is_never_named_registers_nothing() {
    assert_eq!(
        names::<BackingPlugin>().unwrap(),
        Vec::<&str>::new(),
        "this target does not name the plugin crate, so its record must be missing; if a \
         toolchain ever links unnamed crates this demonstration no longer holds (the fix, \
         naming the crate, stays correct)"
    );
    let e = lookup::<BackingPlugin>("file").unwrap_err();
    assert!(matches!(e, Error::UnknownPlugin { .. }), "{e:?}");
    let msg = e.to_string();
    assert!(
        msg.contains("unknown backing `file`; available: none registered")
            && msg.contains("use the_crate as _;"),
        "{msg}"
    );
}
