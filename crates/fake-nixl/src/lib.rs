//! A test double of NIXL 1.5's C API, built as `libnixl_capi.so` (a
//! `cdylib`) and loaded by path through `[nixl] lib` or
//! `HOSTPOOL_NIXL_LIB`, so `registrar-nixl` is tested through its real FFI
//! path without NIXL.
//!
//! It exports every function the registrar resolves. Agents, backends and
//! lists are heap objects; registrations are kept per agent, and the double
//! is stricter than NIXL where that catches bugs: deregistering memory it
//! does not hold fails with `NIXL_CAPI_ERROR_INVALID_PARAM`, destroying an
//! agent that still holds registrations fails with
//! `NIXL_CAPI_ERROR_INVALID_STATE` (and is logged).
//!
//! | variable | meaning |
//! |---|---|
//! | `FAKE_NIXL_STUB` | `1`: `nixl_capi_is_stub()` returns true |
//! | `FAKE_NIXL_FAIL_REGISTER_AT` | `N`: the Nth `nixl_capi_register_mem` of the process fails with `NIXL_CAPI_ERROR_BACKEND` |
//! | `FAKE_NIXL_MAX_REGION` | a descriptor longer than this many bytes fails registration with `NIXL_CAPI_ERROR_INVALID_PARAM` |
//! | `FAKE_NIXL_NO_BACKEND` | `1`: `nixl_capi_create_backend` fails with `NIXL_CAPI_ERROR_NOT_FOUND` |
//! | `FAKE_NIXL_LOG` | append one line per call to this file: `CALL key=value ... result=N` |
//!
//! Everything here is the C ABI, so all of it is in `sys`.

mod sys;
