//! [`Handoff`]: what hands memory between processes, given to a build
//! that shares or leases a pool ([`crate::BuildOptions::handoff`]).

use std::fmt;

/// Memory handed from one process to another: the rendezvous of a shared
/// pool's ranks and an engine's lease of a keeper's pool. The core names no
/// implementation and looks none up: a build that shares or leases a pool
/// is given one ([`crate::BuildOptions::handoff`]; `hostpool-handoff`'s,
/// which the `hostpool` library, its CLI and its Python package pass); a
/// private pool needs none.
pub trait Handoff: Sync + fmt::Debug {
    /// Create or join the shared pool `spec` describes and map all of it.
    ///
    /// # Errors
    /// Capacity, mapping, mismatch or peer errors; on error the peers are
    /// told and no file is left behind.
    fn share(
        &self,
        spec: crate::shared::SharedPoolSpec<'_>,
    ) -> crate::Result<Box<dyn crate::shared::Attachment>>;

    /// Lease the kept pool `lease` names and map it, waiting at most its
    /// attach timeout (`cancel` ends every wait).
    ///
    /// # Errors
    /// [`crate::Error::Keeper`] (with `absent` when no keeper answers), a usage
    /// error when the keeper's pool is not the one asked for, mapping errors.
    fn lease(
        &self,
        lease: &super::LeasePlan,
        cancel: &crate::interrupt::Cancel,
    ) -> crate::Result<Box<dyn crate::shared::Attachment>>;
}

/// The error of a build that shares or leases memory (`what`) without a
/// handoff.
pub(crate) fn no_handoff(what: &str) -> crate::Error {
    crate::Error::config(format!(
        "{what} needs memory handed between processes, and this build was given no handoff: \
         pass one in BuildOptions::handoff (hostpool_handoff::HANDOFF), as the hostpool \
         library, its CLI and its Python package do"
    ))
}
