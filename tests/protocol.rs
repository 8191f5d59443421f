//! The lease protocol is versioned, both ways: a real keeper refuses an
//! engine of another version (one that sends none: protocol 1), and a real
//! engine (`hostpool alloc --keeper`) refuses a keeper of another version,
//! each naming both versions; a newer keeper that still speaks the engine's
//! version serves it (the rule of `docs/design.md`).

use std::io::{BufRead, BufReader};
use std::os::fd::{AsFd, OwnedFd};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use hostpool::hostpool_handoff::wire::{self, Received};
use hostpool::hostpool_handoff::{Message, PROTOCOL, Protocol, hand_over};
use pool_core::Extent;
use pool_core::lease::LeaseInfo;
use serde_json::Value;

const MIB: u64 = 1 << 20;

fn address(name: &str) -> rustix::net::SocketAddrUnix {
    rustix::net::SocketAddrUnix::new_abstract_name(format!("hostpool-keep/{name}").as_bytes())
        .unwrap()
}

/// A real keeper of `name`, once it said it is ready.
fn keeper(name: &str) -> Child {
    let mut child = Command::new(env!("CARGO_BIN_EXE_hostpool"))
        .args(["keep", "--name", name, "--size", "4MiB", "--json"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.as_mut().unwrap())
        .read_line(&mut line)
        .unwrap();
    let ready: Value = serde_json::from_str(&line).unwrap_or(Value::Null);
    assert_eq!(ready["name"], name, "the keeper did not start: {line}");
    child
}

fn stop(mut child: Child) {
    let pid = rustix::process::Pid::from_child(&child);
    let _ = rustix::process::kill_process(pid, rustix::process::Signal::TERM);
    assert!(child.wait().unwrap().success());
}

/// An engine of hostpool before the protocol was versioned sends a hello
/// without one: the keeper refuses it, naming both versions and which side
/// to upgrade, and counts no lease.
#[test]
fn a_keeper_refuses_an_engine_of_another_protocol_naming_both() {
    let name = format!("proto-old-engine-{}", std::process::id());
    let k = keeper(&name);
    let sock = wire::seqpacket().unwrap();
    rustix::net::connect(&sock, &address(&name)).unwrap();
    // Exactly what protocol 1 sent.
    let old = br#"{"Hello":{"world":1,"rank":0,"engine":"","companion":false,"size":null,"page":null,"tag":null,"attach_timeout_secs":5.0,"barrier_timeout_secs":5.0}}"#;
    rustix::net::send(&sock, old, rustix::net::SendFlags::empty()).unwrap();
    let got = wire::recv::<Value>(
        &sock,
        Instant::now() + Duration::from_secs(30),
        &mut Vec::new(),
        None,
    )
    .unwrap();
    let Received::Msg(answer) = got else {
        panic!("the keeper answered nothing");
    };
    let message = answer["Refused"]["message"].as_str().unwrap_or_default();
    assert!(
        message.contains(&format!(
            "the keeper of `{name}` speaks lease protocol {} (down to {}) and this engine speaks \
             1 (down to 1)",
            PROTOCOL.version, PROTOCOL.oldest
        )) && message.contains("this engine is older: run it with hostpool"),
        "{answer}"
    );
    drop(sock);
    let status = Command::new(env!("CARGO_BIN_EXE_hostpool"))
        .args(["keep", "status", "--name", &name, "--json"])
        .output()
        .unwrap();
    let status: Value = serde_json::from_slice(&status.stdout).unwrap();
    let status = &status[0];
    assert_eq!(status["generation"], 0, "a refusal is no lease: {status}");
    assert_eq!(status["protocol"]["version"], PROTOCOL.version);
    stop(k);
}

/// A stand-in keeper of `name` that answers the first hello with a lease of
/// a 4 MiB memfd in `protocol`; what the engine sent after, on its thread.
fn fake_keeper(
    name: &str,
    protocol: Protocol,
) -> std::thread::JoinHandle<(Message, Option<Message>)> {
    let listener = wire::seqpacket().unwrap();
    rustix::net::bind(&listener, &address(name)).unwrap();
    rustix::net::listen(&listener, 4).unwrap();
    let name = name.to_string();
    std::thread::spawn(move || {
        let conn: OwnedFd = rustix::net::accept(&listener).unwrap();
        let deadline = Instant::now() + Duration::from_secs(60);
        let Received::Msg(hello) =
            wire::recv::<Message>(&conn, deadline, &mut Vec::new(), None).unwrap()
        else {
            panic!("no hello");
        };
        let fd = rustix::fs::memfd_create("proto-test", rustix::fs::MemfdFlags::CLOEXEC).unwrap();
        rustix::fs::ftruncate(&fd, 4 * MIB).unwrap();
        let whole = Extent {
            offset: 0,
            len: 4 * MIB,
        };
        hand_over(
            conn.as_fd(),
            |extents, files| Message::Lease {
                protocol,
                info: LeaseInfo {
                    name: name.clone(),
                    instance: "fake".into(),
                    generation: 1,
                    content: "zero".into(),
                    previous: None,
                    tag: None,
                    keeper_pid: std::process::id(),
                    tenants: 1,
                },
                logical: 4 * MIB,
                mapped: 4 * MIB,
                page: 4096,
                backing: "shm-segmented".into(),
                extents,
                files,
            },
            &[(fd.as_fd(), whole)],
        )
        .unwrap();
        let after = match wire::recv::<Message>(&conn, deadline, &mut Vec::new(), None) {
            Ok(Received::Msg(m)) => Some(m),
            _ => None,
        };
        (hello, after)
    })
}

fn alloc(name: &str) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_hostpool"))
        .args(["alloc", "--keeper", name, "--json"])
        .output()
        .unwrap()
}

/// An engine refuses a keeper with no version in common before it maps
/// anything, naming both versions (exit 1, a runtime error), and releases
/// the lease cleanly; a newer keeper that still speaks this version serves
/// it. Either way the engine sent its own version.
#[test]
fn an_engine_refuses_a_keeper_of_another_protocol_and_takes_a_compatible_one() {
    let name = format!("proto-new-keeper-{}", std::process::id());
    let newer = Protocol {
        version: PROTOCOL.version + 7,
        oldest: PROTOCOL.version + 7,
    };
    let served = fake_keeper(&name, newer);
    let out = alloc(&name);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains(&format!(
            "this engine speaks lease protocol {} (down to {}) and the keeper of `{name}` (pid \
             {}) speaks {} (down to {})",
            PROTOCOL.version,
            PROTOCOL.oldest,
            std::process::id(),
            newer.version,
            newer.oldest
        )) && stderr.contains("this engine is older"),
        "{stderr}"
    );
    let (hello, after) = served.join().unwrap();
    assert!(
        matches!(hello, Message::Hello { protocol, .. } if protocol == PROTOCOL),
        "{hello:?}"
    );
    assert!(matches!(after, Some(Message::Release)), "{after:?}");

    let name = format!("proto-compatible-{}", std::process::id());
    let compatible = Protocol {
        version: PROTOCOL.version + 1,
        oldest: PROTOCOL.version,
    };
    let served = fake_keeper(&name, compatible);
    let out = alloc(&name);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["keeper"]["name"], name.as_str(), "{report}");
    assert_eq!(report["mapped_bytes"], 4 * MIB);
    let (_, after) = served.join().unwrap();
    assert!(matches!(after, Some(Message::Release)), "{after:?}");
}
