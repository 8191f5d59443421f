//! A test double of `libibverbs.so.1`, built as `libibverbs.so` (a `cdylib`)
//! and loaded by path through `[rdma] library`, so `registrar-rdma` is tested
//! through its real FFI path on hosts without RDMA.
//!
//! It exports the entry points the registrar uses with the ABI of rdma-core's
//! `infiniband/verbs.h`: `ibv_get_device_list`, `ibv_free_device_list`,
//! `ibv_get_device_name`, `ibv_open_device`, `ibv_close_device`,
//! `ibv_alloc_pd`, `ibv_dealloc_pd`, `ibv_query_device`, `ibv_reg_mr`,
//! `ibv_dereg_mr`. Failures follow the real conventions: NULL with `errno` for
//! pointer returns, the errno value for `ibv_dereg_mr`, `ibv_dealloc_pd` and
//! `ibv_query_device`, `-1` with `errno` for `ibv_close_device`.
//!
//! Behaviour is set by environment variables, read at every call:
//!
//! | variable | meaning |
//! |---|---|
//! | `FAKE_IBV_DEVICES` | comma-separated device names (default `mlx5_0`); empty: no devices; `ENOSYS`: `ibv_get_device_list` returns NULL with `ENOSYS`, as the real library does on a kernel without RDMA |
//! | `FAKE_IBV_MAX_MR_SIZE` | `max_mr_size` in bytes (default 1 TiB); a longer `ibv_reg_mr` fails with `EINVAL` |
//! | `FAKE_IBV_FAIL_REG_AT` | `N`: the Nth `ibv_reg_mr` of the process fails; `DEV:N`: the Nth on device `DEV` |
//! | `FAKE_IBV_FAIL_REG_ERRNO` | the errno of that failure: a number or `ENOMEM` (default), `EINVAL`, `EFAULT`, `EIO`, `EPERM`, `EACCES` |
//! | `FAKE_IBV_FAIL_DEREG_AT` | the Nth `ibv_dereg_mr` fails with `EBUSY` (the region stays registered) |
//! | `FAKE_IBV_REG_RENDEZVOUS` | `N`: the first `ibv_reg_mr` on each device waits until N devices are inside `ibv_reg_mr` (logged `rendezvous result=ok`), or `FAKE_IBV_RENDEZVOUS_MS` (default 10000) passes (`result=timeout`): proves registration runs in parallel |
//! | `FAKE_IBV_LOG` | append one line per call to this file |
//!
//! Log lines are `CALL key=value ...`, always ending in `result=ok` or
//! `result=ERRNO`, for example
//! `ibv_reg_mr dev=mlx5_0 addr=0x7f0000000000 len=1048576 access=7 n=1 tid=42 lkey=4097 rkey=536875009 result=ok`.
//!
//! The double is stricter than the real library where that catches bugs:
//! `ibv_dereg_mr` of a region it does not know fails with `EINVAL`,
//! `ibv_dealloc_pd` with live regions and `ibv_close_device` with live
//! protection domains fail with `EBUSY`, and `ibv_reg_mr` checks that the
//! first and last page of the range are mapped (`EFAULT`).
//!
//! Everything the double does is the C ABI of the real library, so all of
//! it is in `sys`, the one module allowed `unsafe`.

mod sys;

pub use sys::*;
