//! A kept pool's names: the abstract socket its keeper serves it on, the
//! error that names it, and how to start its keeper. Beneath the one join
//! (`join.rs`, whose keeper errors they word) and the lease (`lease/`,
//! which re-exports them), so neither imports the other for them.

use pool_core::{Error, Result};

/// The prefix of every keeper's abstract socket name.
pub const SOCKET_PREFIX: &str = "hostpool-keep/";

/// The abstract socket a kept pool is served on, as `ss -x` and
/// `/proc/net/unix` show it: `@hostpool-keep/<name>`.
pub fn socket_name(name: &str) -> String {
    format!("@{SOCKET_PREFIX}{name}")
}

pub fn address(name: &str) -> Result<rustix::net::SocketAddrUnix> {
    rustix::net::SocketAddrUnix::new_abstract_name(format!("{SOCKET_PREFIX}{name}").as_bytes())
        .map_err(|e| {
            crate::wire::os(
                "socket address",
                e,
                "the kept pool's name is too long for a socket name",
            )
        })
}

/// The keeper error for `name`: `message`, blaming `pid` when known.
pub fn keeper_error(name: &str, message: String, pid: Option<u32>, absent: bool) -> Error {
    Error::Keeper {
        name: name.to_string(),
        message,
        pid,
        absent,
    }
}

/// Where a kept pool's socket is, for messages.
pub fn how_to_start(name: &str) -> String {
    format!(
        "start it (`hostpool keep --name {name} --size SIZE`, or `systemctl start \
         hostpool-keep@{name}`) in this network namespace (a Kubernetes pod shares one), or set \
         fallback = \"build\" in the [lease] table (--keeper-fallback build, Python \
         keeper_fallback=\"build\") to build a pool of this process's own"
    )
}
