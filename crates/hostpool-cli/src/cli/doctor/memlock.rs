//! `memlock`: `RLIMIT_MEMLOCK`, `CAP_IPC_LOCK` and the bound they put on
//! pinning and RDMA registration.

use pool_core::format_bytes;
use pool_core::host::memlock;
use serde_json::json;

use super::Finding;

/// A limit, or `unlimited`.
fn limit_text(l: Option<u64>) -> String {
    l.map_or("unlimited".to_string(), format_bytes)
}

/// `RLIMIT_MEMLOCK`, `CAP_IPC_LOCK` and the pin bound they make.
pub(super) fn findings() -> Vec<Finding> {
    let st = memlock::state();
    let rl = Finding::new(
        "memlock",
        "RLIMIT_MEMLOCK",
        format!("soft {}, hard {}", limit_text(st.soft), limit_text(st.hard)),
    )
    .details(json!({"soft": st.soft, "hard": st.hard}));
    let rl = match st.hard {
        Some(hard) if !st.cap_ipc_lock && hard < st.ram / 2 => rl.warn(format!(
            "pinning (cuda, mlock) and RDMA registration are bounded to {} without \
             CAP_IPC_LOCK; {}",
            format_bytes(hard),
            memlock::REMEDY
        )),
        _ => rl,
    };
    let cap = Finding::new(
        "memlock",
        "CAP_IPC_LOCK",
        if st.cap_ipc_lock {
            "yes: RLIMIT_MEMLOCK does not bind this process"
        } else {
            "no"
        },
    );
    let cap = if st.cap_ipc_lock || st.hard.is_none() {
        cap
    } else {
        cap.info(
            "grant it to lift the memlock bound: docker --cap-add IPC_LOCK; Kubernetes \
             securityContext.capabilities.add: [\"IPC_LOCK\"]; systemd \
             AmbientCapabilities=CAP_IPC_LOCK",
        )
    };
    let ordinary = memlock::bound(&st, false);
    let huge = memlock::bound(&st, true);
    let value = if ordinary == huge {
        format!("{} for every page size", ordinary.describe())
    } else {
        format!(
            "ordinary pages {}; huge pages {}",
            ordinary.describe(),
            huge.describe()
        )
    };
    let bound = Finding::new("memlock", "pin bound", value)
        .details(json!({"ordinary": ordinary, "huge": huge, "cap_ipc_lock": st.cap_ipc_lock}));
    vec![rl, cap, bound]
}
