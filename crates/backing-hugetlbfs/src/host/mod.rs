//! Huge page pools, hugetlbfs and hugetlb cgroup limits, and the capacity
//! checks built from them: what this backing reads of the host.
//!
//! A hugetlb pool can fail in four places, and each has its own counter:
//!
//! - the system pool (`/sys/kernel/mm/hugepages/hugepages-<kB>kB`): a
//!   `MAP_SHARED` mapping reserves its pages at `mmap` time and fails with
//!   `ENOMEM` when too few are available;
//! - the pool of one NUMA node (`/sys/devices/system/node/node<N>/hugepages`),
//!   when the pool is bound to that node;
//! - the `size=` limit of the hugetlbfs mount (`statfs`), also `ENOMEM` at
//!   `mmap`;
//! - the hugetlb cgroup: `hugetlb.<size>.rsvd.max` is enforced at `mmap`,
//!   `hugetlb.<size>.max` only when a page is faulted in, as `SIGBUS` (even
//!   with `MAP_POPULATE`), which is why it is checked up front.
//!
//! Huge page pools are never checked against `MemAvailable`: reserved huge
//! pages are not counted there (SGLang rejected valid pools for this).
//!
//! Nothing here panics on a missing or malformed sysfs file: the public
//! readers return an error or `None`, and a capacity check whose figure
//! cannot be read has no `free` figure (verdict
//! [`Unknown`](pool_core::host::capacity::Verdict::Unknown)).
//!
//! Only the creator of a shared pool should run these checks: once it has
//! reserved its pages, the counts look too low to the ranks that join it.
//!
//! Each concern has its own private submodule: the sysfs pools per size and
//! node, the mount's `size=`, the hugetlb cgroup limits, the Kubernetes
//! names, and the capacity checks over them; everything public is
//! re-exported here.

mod cgroup;
mod checks;
mod kubernetes;
mod mount;
mod pools;

pub use cgroup::{HugetlbCgroup, cgroup_limit, cgroup_size_name, hugetlb_controller};
pub use checks::capacity_checks;
pub use kubernetes::k8s_size_name;
pub use mount::{MountLimit, mount_limit};
pub use pools::{HugePagePool, default_size, node_pool, pool, supported_sizes, sysfs_dir};

/// One kibibyte.
const KIB: u64 = 1 << 10;
/// One mebibyte.
const MIB: u64 = 1 << 20;
/// One gibibyte.
const GIB: u64 = 1 << 30;

#[cfg(test)]
mod testing;
