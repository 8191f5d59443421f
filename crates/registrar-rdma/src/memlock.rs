//! The memlock part: the pool checked against the memlock bound once per
//! device (each registration counts it again), and the soft
//! `RLIMIT_MEMLOCK` raised to the hard one while the pool is registered.

use pool_core::host::memlock::{self, MemlockPolicy};
use pool_core::host::process;
use pool_core::{Error, Result};
use rustix::process::Rlimit;

use crate::NAME;

/// Bytes this process has pinned (`VmPin`): what `ib_umem_get` has counted.
pub(crate) fn pinned_bytes() -> Option<u64> {
    process::status_field("VmPin")
}

/// Raise the soft `RLIMIT_MEMLOCK` to the hard one when pinning `need` more
/// bytes would pass the soft one (the limit `ib_umem_get` checks) and the hard
/// one is higher. Returns the limits to restore.
pub(crate) fn raise_soft_limit(limits: &memlock::MemlockState, need: u64) -> Option<Rlimit> {
    use rustix::process::{Resource, getrlimit, setrlimit};
    if limits.cap_ipc_lock {
        return None;
    }
    let old = getrlimit(Resource::Memlock);
    let soft = old.current?;
    let wanted = pinned_bytes().unwrap_or(0).saturating_add(need);
    if soft >= wanted || old.maximum.is_some_and(|hard| hard <= soft) {
        return None;
    }
    let new = Rlimit {
        current: old.maximum,
        maximum: old.maximum,
    };
    match setrlimit(Resource::Memlock, new) {
        Ok(()) => Some(old),
        Err(e) => {
            tracing::warn!("cannot raise the soft RLIMIT_MEMLOCK to the hard one: {e}");
            None
        }
    }
}

/// Put the soft limit back, unless someone changed it since.
pub(crate) fn restore_soft_limit(old: Rlimit) {
    use rustix::process::{Resource, getrlimit, setrlimit};
    let now = getrlimit(Resource::Memlock);
    if now.current == old.maximum
        && now.maximum == old.maximum
        && let Err(e) = setrlimit(Resource::Memlock, old)
    {
        tracing::warn!("cannot restore the soft RLIMIT_MEMLOCK: {e}");
    }
}

/// The memlock bound for `copies` registrations of `len` bytes.
pub(crate) fn memlock_check(
    state: &memlock::MemlockState,
    len: u64,
    copies: usize,
    hugetlb: bool,
    policy: MemlockPolicy,
) -> Result<String> {
    let copies_u64 = u64::try_from(copies).unwrap_or(u64::MAX);
    let who = if copies > 1 {
        format!("rdma on {copies} devices (each registration counts the pool again)")
    } else {
        NAME.to_string()
    };
    memlock::check_with(state, len.saturating_mul(copies_u64), &who, hugetlb, policy).map_err(|e| {
        match e {
            Error::NotAvailable { what, reason } => Error::NotAvailable {
                what,
                reason: format!(
                    "ibv_reg_mr counts the pages it registers against RLIMIT_MEMLOCK unless the \
                 process has CAP_IPC_LOCK, and {reason}"
                ),
            },
            other => other,
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_memlock_error_says_ibv_reg_mr_counts_against_rlimit_memlock() {
        let st = memlock::MemlockState {
            soft: Some(8 << 20),
            hard: Some(8 << 20),
            cap_ipc_lock: false,
            ram: 64 << 30,
        };
        assert!(memlock_check(&st, 4 << 20, 2, false, MemlockPolicy::Check).is_ok());
        let e = memlock_check(&st, 4 << 20, 3, false, MemlockPolicy::Check).unwrap_err();
        let msg = e.to_string();
        assert!(e.is_not_available(), "{e:?}");
        for want in ["RLIMIT_MEMLOCK", "CAP_IPC_LOCK", "3 devices", "ulimit -l"] {
            assert!(msg.contains(want), "missing {want:?}: {msg}");
        }
        assert!(memlock_check(&st, u64::MAX, 2, false, MemlockPolicy::Ignore).is_ok());
    }
}
