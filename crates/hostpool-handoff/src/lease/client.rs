//! An engine's side of a lease: attach to a keeper, map what it hands over,
//! meet the other ranks at its barrier, release at teardown.

use std::os::fd::{AsFd, OwnedFd};
use std::time::{Duration, Instant};

use serde_json::Value;

use super::{LeaseInfo, address, how_to_start, keeper_error, socket_name};
use crate::join::{self, Holder, Joining, Offer};
use crate::message::Message;
use crate::wire::{self, Received};
use pool_core::file::Attachment;
use pool_core::file::{FileMapping, MapContext};
use pool_core::interrupt::Cancel;
use pool_core::plugin::RankBarrier;
use pool_core::{Error, Extent, Result, TeardownIssue};
use pool_core::{Placeholder, Region};

/// Connect to the keeper of `name`.
fn connect(name: &str) -> Result<OwnedFd> {
    let addr = address(name)?;
    let sock = wire::seqpacket()?;
    pool_core::failpoint::stall("keeper-before-connect");
    if let Err(e) = rustix::net::connect(&sock, &addr) {
        return Err(keeper_error(
            name,
            format!(
                "no keeper answers for kept pool `{name}` on {} ({}); {}",
                socket_name(name),
                std::io::Error::from(e),
                how_to_start(name)
            ),
            None,
            true,
        ));
    }
    Ok(sock)
}

/// The status of the keeper of `name`.
pub(super) fn status(name: &str) -> Result<Value> {
    let sock = connect(name)?;
    let pid = join::holder_pid(&sock, &keeper(name, 0.0, 0.0))?;
    wire::send(&sock, &Message::Status, &[])
        .map_err(|e| wire::os("sendmsg", e, "asking the keeper failed"))?;
    match wire::recv::<Message>(
        &sock,
        Instant::now() + Duration::from_secs(5),
        &mut Vec::new(),
        None,
    )? {
        Received::Msg(Message::StatusOf(v)) => Ok(v),
        Received::Msg(Message::Refused { message, .. }) => {
            Err(keeper_error(name, message, Some(pid), false))
        }
        Received::TimedOut => Err(keeper_error(
            name,
            format!(
                "the keeper of `{name}` (pid {pid}: {}) did not answer a status request within 5 s",
                pool_core::host::process::why_late(pid)
            ),
            Some(pid),
            false,
        )),
        Received::Msg(_) | Received::Gone => Err(keeper_error(
            name,
            format!(
                "the keeper of `{name}` (pid {pid}) closed the connection without answering a \
                 status request; {}",
                how_to_start(name)
            ),
            Some(pid),
            false,
        )),
    }
}

/// Lease the pool `config.keeper` names and map it.
///
/// # Errors
/// [`Error::Keeper`] (with `absent` when no keeper answers), a usage error
/// when the keeper's pool is not the one asked for, mapping errors.
pub fn attach(config: &pool_core::PoolConfig, cancel: &Cancel) -> Result<Box<dyn Attachment>> {
    let Some(name) = config.keeper.as_deref() else {
        return Err(Error::config("no keeper named"));
    };
    let started = Instant::now();
    let sharing = config.sharing.clone();
    let companion = config.keeper_companion_of.clone();
    let (world, rank, engine) = match (&sharing, &companion) {
        (Some(s), _) => (s.world, s.rank, s.name.clone()),
        (None, Some(engine)) => (1, 0, engine.clone()),
        (None, None) => (1, 0, String::new()),
    };
    let attach_timeout = config.keeper_attach_timeout();
    let barrier_timeout = sharing
        .as_ref()
        .map_or(pool_core::DEFAULT_BARRIER_TIMEOUT_SECS, |s| {
            s.barrier_timeout_secs
        });
    let sock = connect(name)?;
    let hello = Message::Hello {
        protocol: crate::message::PROTOCOL,
        world,
        rank,
        engine,
        companion: companion.is_some(),
        size: config.size_given.then_some(config.size.get()),
        page: config.page_size.map(|p| p.get()),
        tag: config.keeper_tag.clone(),
        attach_timeout_secs: attach_timeout,
        barrier_timeout_secs: barrier_timeout,
    };
    let joined = join::join(Joining {
        conn: sock,
        holder: keeper(name, attach_timeout, barrier_timeout),
        request: hello,
        deadline: started + Duration::from_secs_f64(attach_timeout) + Duration::from_secs(1),
        cancel,
        planned: None,
        map: MapContext {
            enomem_remedy: "mapping the kept pool failed: raise the address-space limit \
                            (ulimit -v)"
                .into(),
            truncated_remedy: "restart the keeper".into(),
        },
        stall: "keeper-passing-fds",
    })?;
    pool_core::failpoint::stall("keeper-attached");
    // The join maps a welcome only against a plan, which a lease has not.
    let Offer::Lease { info, backing } = joined.offer else {
        return Err(keeper_error(
            name,
            format!(
                "the process on {} (pid {}) answered as a shared pool's creator, not a keeper",
                socket_name(name),
                joined.pid
            ),
            Some(joined.pid),
            false,
        ));
    };
    let shard = match &sharing {
        Some(s) => pool_core::shared::shard(joined.size, s)?,
        None => Extent {
            offset: 0,
            len: joined.size.mapped(),
        },
    };
    Ok(Box::new(LeasedMapping {
        inner: joined.mapping,
        conn: Some(joined.conn),
        info,
        backing,
        attach_seconds: started.elapsed().as_secs_f64(),
        keeper_pid: joined.pid,
        holder: joined.holder,
        sharing,
        shard,
        cancel: cancel.clone(),
        companion,
    }))
}

/// The keeper of `name`, as a holder the one join names.
fn keeper(name: &str, attach_timeout_secs: f64, barrier_timeout_secs: f64) -> Holder {
    Holder::Keeper {
        name: name.to_string(),
        attach_timeout_secs,
        barrier_timeout_secs,
    }
}

/// The mapping of a leased pool.
#[derive(Debug)]
struct LeasedMapping {
    inner: FileMapping,
    /// The lease: its end is this connection's end.
    conn: Option<OwnedFd>,
    info: LeaseInfo,
    backing: String,
    attach_seconds: f64,
    keeper_pid: u32,
    /// The keeper, as the barrier's errors name it.
    holder: Holder,
    sharing: Option<pool_core::SharingConfig>,
    shard: Extent,
    /// The build's token, which the barrier's wait checks.
    cancel: Cancel,
    /// The engine whose lease this companion maps (`keeper_companion_of`).
    companion: Option<String>,
}

impl LeasedMapping {
    fn barrier(&mut self, outcome: std::result::Result<(), String>) -> Result<()> {
        let Some(conn) = &self.conn else {
            return outcome.map_err(Error::config);
        };
        let rank = self.sharing.as_ref().map_or(0, |s| s.rank);
        join::arrive(
            conn.as_fd(),
            &self.holder,
            self.keeper_pid,
            rank,
            outcome,
            &self.cancel,
        )
    }
}

impl Attachment for LeasedMapping {
    fn region(&self) -> Region<'_> {
        self.inner.region()
    }

    fn pool_files(&self) -> &[pool_core::file::PoolFile] {
        pool_core::file::Attachment::pool_files(&self.inner)
    }

    fn checked_capacity(&self) -> bool {
        false
    }

    fn sharing(&self) -> Option<Value> {
        let s = self.sharing.as_ref()?;
        pool_core::shared::SharingReport::of_lease(s, self.shard)
    }

    fn leased(&self) -> Option<Value> {
        let mut v = serde_json::to_value(&self.info).ok()?;
        if let Value::Object(m) = &mut v {
            m.insert("attach_seconds".into(), self.attach_seconds.into());
            m.insert("backing".into(), self.backing.clone().into());
            if let Some(engine) = &self.companion {
                m.insert("companion_of".into(), engine.clone().into());
            }
        }
        Some(v)
    }

    fn reserve_for_touch(&self, _extent: Extent) -> Result<()> {
        Ok(())
    }

    fn rendezvous(
        &mut self,
        outcome: std::result::Result<(), String>,
        _barrier: Option<&dyn RankBarrier>,
    ) -> Result<()> {
        if self.sharing.as_ref().is_none_or(|s| s.world == 1) {
            return outcome.map_err(Error::config);
        }
        self.barrier(outcome)
    }

    fn teardown(self: Box<Self>) -> Vec<TeardownIssue> {
        self.release(false).0
    }

    fn teardown_keeping_range(self: Box<Self>) -> (Vec<TeardownIssue>, Option<Placeholder>) {
        self.release(true)
    }
}

impl LeasedMapping {
    /// Unmap (keeping the range if asked), then release the lease.
    fn release(self, keep_range: bool) -> (Vec<TeardownIssue>, Option<Placeholder>) {
        let LeasedMapping { inner, conn, .. } = self;
        let released = inner.release_with(keep_range);
        pool_core::failpoint::stall("keeper-release");
        if let Some(conn) = conn {
            // Unmapped first: the keeper may clear the pool once it reads this.
            let _ = wire::send(&conn, &Message::Release, &[]);
        }
        released
    }
}
