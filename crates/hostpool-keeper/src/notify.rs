//! systemd's readiness protocol (`sd_notify(3)`), for a keeper run as a
//! `Type=notify` service: `READY=1` once every kept pool is built and
//! served, `STOPPING=1` when a stop request starts the drain, each with a
//! `STATUS=` line for `systemctl status`.
//!
//! The protocol is one datagram of `KEY=VALUE` lines sent to the unix socket
//! that `$NOTIFY_SOCKET` names (a path, or `@name` for an abstract socket).
//! Without the variable (not under systemd) nothing is sent. A failure to
//! send is logged, never fatal: the pool serves whether or not systemd
//! heard.

use rustix::net::{AddressFamily, SendFlags, SocketAddrUnix, SocketFlags, SocketType};

/// Send `state` (newline-separated `KEY=VALUE` lines) to `$NOTIFY_SOCKET`.
/// `Ok(false)` when the variable is not set.
///
/// # Errors
/// The socket's address is not usable, or the send failed (the errno).
pub fn notify(state: &str) -> std::io::Result<bool> {
    match std::env::var_os("NOTIFY_SOCKET") {
        Some(target) => send(&target.to_string_lossy(), state).map(|()| true),
        None => Ok(false),
    }
}

/// The address of the notify socket `target` (a path, or `@name`).
///
/// # Errors
/// `target` is neither, or too long.
pub(crate) fn address(target: &str) -> std::io::Result<SocketAddrUnix> {
    Ok(match target.strip_prefix('@') {
        Some(name) => SocketAddrUnix::new_abstract_name(name.as_bytes())?,
        None if target.starts_with('/') => SocketAddrUnix::new(std::path::Path::new(target))?,
        None => {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                format!("NOTIFY_SOCKET={target} is neither a path nor @name"),
            ));
        }
    })
}

/// Send `state` to the notify socket `target` (a path, or `@name`).
fn send(target: &str, state: &str) -> std::io::Result<()> {
    let addr = address(target)?;
    let fd = rustix::net::socket_with(
        AddressFamily::UNIX,
        SocketType::DGRAM,
        SocketFlags::CLOEXEC,
        None,
    )?;
    rustix::net::sendto(&fd, state.as_bytes(), SendFlags::NOSIGNAL, &addr)?;
    Ok(())
}

/// [`notify`], with a failure logged: what a keeper says to systemd.
pub fn tell(state: &str) {
    if let Err(e) = notify(state) {
        tracing::warn!(
            "could not tell systemd `{}` on NOTIFY_SOCKET: {e}",
            state.lines().next().unwrap_or("")
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A datagram socket stands in for systemd: a path, and an abstract
    /// name; a target that is neither is an error.
    #[test]
    fn a_state_reaches_the_socket_notify_socket_names() {
        let dir = std::env::temp_dir().join(format!("hostpool-notify-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("notify.sock");
        let _ = std::fs::remove_file(&path);
        let sock = std::os::unix::net::UnixDatagram::bind(&path).unwrap();
        send(path.to_str().unwrap(), "READY=1\nSTATUS=keeping kv0").unwrap();
        let mut buf = [0u8; 256];
        let n = sock.recv(&mut buf).unwrap();
        assert_eq!(&buf[..n], b"READY=1\nSTATUS=keeping kv0");
        std::fs::remove_dir_all(&dir).unwrap();

        use std::os::linux::net::SocketAddrExt;
        let name = format!("hostpool-notify-test-{}", std::process::id());
        let addr = std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes()).unwrap();
        let sock = std::os::unix::net::UnixDatagram::bind_addr(&addr).unwrap();
        send(&format!("@{name}"), "STOPPING=1").unwrap();
        let n = sock.recv(&mut buf).unwrap();
        assert_eq!(&buf[..n], b"STOPPING=1");

        let e = send("relative", "READY=1").unwrap_err();
        assert!(e.to_string().contains("neither a path nor @name"), "{e}");
    }
}
