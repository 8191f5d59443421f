//! An engine's side of a lease: attach to a keeper, map what it hands over,
//! meet the other ranks at its barrier, release at teardown.

use std::os::fd::{AsFd, OwnedFd};
use std::time::{Duration, Instant};

use super::{address, how_to_start, keeper_error, socket_name};
use crate::join::{self, Holder, Joining, Offer};
use crate::message::Message;
use crate::wire;
use pool_core::file::{FileMapping, MapContext};
use pool_core::interrupt::Cancel;
use pool_core::lease::LeaseReport;
use pool_core::plugin::Mapping;
use pool_core::plugin::RankBarrier;
use pool_core::shared::SharingReport;
use pool_core::shared::{Attached, Attachment};
use pool_core::{Error, LeasePlan, Result, TeardownIssue};
use pool_core::{Placeholder, Region};

/// Connect to the keeper of `name`.
pub(super) fn connect(name: &str) -> Result<OwnedFd> {
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

/// Lease the kept pool the plan's `lease` names and map it.
///
/// # Errors
/// [`Error::Keeper`] (with `absent` when no keeper answers), a usage error
/// when the keeper's pool is not the one asked for, mapping errors.
pub fn attach(lease: &LeasePlan, cancel: &Cancel) -> Result<Box<dyn Attachment>> {
    let name = lease.keeper.as_str();
    let started = Instant::now();
    let (world, rank) = lease.ranks.as_ref().map_or((1, 0), |s| (s.world, s.rank));
    let sock = connect(name)?;
    let hello = Message::Hello {
        protocol: crate::message::PROTOCOL,
        world,
        rank,
        engine: lease.engine().to_string(),
        companion: lease.companion_of.is_some(),
        size: lease.size,
        page: lease.page,
        tag: lease.tag.clone(),
        attach_timeout_secs: lease.attach_timeout_secs,
        barrier_timeout_secs: lease.barrier_timeout_secs,
    };
    let holder = keeper(name, lease.attach_timeout_secs, lease.barrier_timeout_secs);
    let joined = join::join(Joining {
        conn: sock,
        holder,
        request: hello,
        deadline: started
            + Duration::from_secs_f64(lease.attach_timeout_secs)
            + Duration::from_secs(1),
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
    let ranks = match &lease.ranks {
        Some(s) => Some(SharingReport::of_lease(
            s,
            pool_core::shared::shard(joined.size, s)?,
        )),
        None => None,
    };
    Ok(Box::new(LeasedMapping {
        inner: joined.mapping,
        conn: Some(joined.conn),
        report: LeaseReport {
            info,
            attach_seconds: started.elapsed().as_secs_f64(),
            backing,
            companion_of: lease.companion_of.clone(),
        },
        keeper_pid: joined.pid,
        holder: joined.holder,
        ranks,
        cancel: cancel.clone(),
    }))
}

/// The keeper of `name`, as a holder the one join names.
pub(super) fn keeper(name: &str, attach_timeout_secs: f64, barrier_timeout_secs: f64) -> Holder {
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
    /// What the keeper told, for the report.
    report: LeaseReport,
    keeper_pid: u32,
    /// The keeper, as the barrier's errors name it.
    holder: Holder,
    /// This rank, when the engine's ranks share the lease.
    ranks: Option<SharingReport>,
    /// The build's token, which the barrier's wait checks.
    cancel: Cancel,
}

impl Mapping for LeasedMapping {
    fn region(&self) -> Region<'_> {
        self.inner.region()
    }

    fn teardown(self: Box<Self>) -> Vec<TeardownIssue> {
        self.release(false).0
    }

    fn teardown_keeping_range(self: Box<Self>) -> (Vec<TeardownIssue>, Option<Placeholder>) {
        self.release(true)
    }
}

impl Attachment for LeasedMapping {
    fn keeper_conn(&self) -> Option<std::os::fd::BorrowedFd<'_>> {
        self.conn.as_ref().map(AsFd::as_fd)
    }

    fn pool_files(&self) -> &[pool_core::file::PoolFile] {
        self.inner.pool_files()
    }

    fn attached(&self) -> Attached {
        Attached::Leased {
            lease: self.report.clone(),
            ranks: self.ranks.clone(),
        }
    }

    fn rendezvous(
        &mut self,
        outcome: std::result::Result<(), String>,
        _barrier: Option<&dyn RankBarrier>,
    ) -> Result<()> {
        let (Some(conn), Some(ranks)) = (&self.conn, &self.ranks) else {
            return outcome.map_err(Error::config);
        };
        if ranks.world == 1 {
            return outcome.map_err(Error::config);
        }
        join::arrive(
            conn.as_fd(),
            &self.holder,
            self.keeper_pid,
            ranks.rank,
            outcome,
            &self.cancel,
        )
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
