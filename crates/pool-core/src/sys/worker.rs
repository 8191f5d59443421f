//! A mapping together with the one thread that may work on its memory after
//! the build (the background pin).
//!
//! The thread holds a `Region<'static>` of the mapping's memory. That is
//! sound because [`Owner`] owns both: it joins the thread before it lets
//! the mapping go (in [`Owner::into_mapping`] and in its `Drop`), and hands
//! out no `&mut` of the mapping while the thread lives. No caller has to
//! promise anything, so spawning is a safe method of the owner, never a free
//! function that turns a borrowed region into a `'static` one.

use std::io;
use std::ptr::NonNull;
use std::thread::JoinHandle;

use super::Region;

/// What an [`Owner`] can own: something that keeps a region mapped for as
/// long as it lives (a pool's mapping).
pub(crate) trait Holds: Send + Sync {
    /// The memory it keeps mapped.
    fn held(&self) -> Region<'_>;
}

/// A mapping `M` and at most one worker thread returning `W`, joined before
/// the mapping goes.
pub(crate) struct Owner<M: Holds, W: Send + 'static> {
    /// `None` only once handed back by [`Owner::into_mapping`].
    mapping: Option<M>,
    worker: Option<JoinHandle<W>>,
}

impl<M: Holds, W: Send + 'static> std::fmt::Debug for Owner<M, W> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Owner")
            .field("worker", &self.worker.is_some())
            .finish_non_exhaustive()
    }
}

impl<M: Holds, W: Send + 'static> Owner<M, W> {
    /// Own `mapping`, with no worker yet.
    pub(crate) fn new(mapping: M) -> Owner<M, W> {
        Owner {
            mapping: Some(mapping),
            worker: None,
        }
    }

    /// The mapping.
    pub(crate) fn get(&self) -> &M {
        self.mapping
            .as_ref()
            .expect("an Owner holds its mapping until into_mapping consumes it")
    }

    /// The mapping to change, only while no worker runs on its memory.
    pub(crate) fn get_mut(&mut self) -> Option<&mut M> {
        if self.worker.is_some() {
            return None;
        }
        self.mapping.as_mut()
    }

    /// Start the worker: `f` runs on a thread named `name` with the
    /// mapping's whole region, which stays mapped until the thread is
    /// joined.
    ///
    /// # Errors
    /// `EBUSY` when a worker already runs; the error of `pthread_create`.
    pub(crate) fn spawn(
        &mut self,
        name: String,
        f: impl FnOnce(Region<'static>) -> W + Send + 'static,
    ) -> io::Result<()> {
        if self.worker.is_some() {
            return Err(io::Error::from_raw_os_error(libc::EBUSY));
        }
        let region = self.get().held();
        let base = NonNull::new(region.addr())
            .ok_or_else(|| io::Error::from_raw_os_error(libc::EFAULT))?;
        // SAFETY: `self` owns the mapping that keeps this memory mapped, and
        // joins the thread before the mapping can go (`into_mapping`, `Drop`;
        // `get_mut` is refused meanwhile); the region gives only atomic and
        // kernel accesses.
        let region: Region<'static> = unsafe { Region::new(base, region.size()) };
        let handle = std::thread::Builder::new()
            .name(name)
            .spawn(move || f(region))?;
        self.worker = Some(handle);
        Ok(())
    }

    /// Join the worker, if there is one: its result, or `Err` when it
    /// panicked.
    pub(crate) fn join(&mut self) -> Option<std::thread::Result<W>> {
        self.worker.take().map(JoinHandle::join)
    }

    /// Forget the worker without joining it: only in a child that inherited
    /// the memory through `fork`, where the thread does not exist (joining
    /// it would fail) and so cannot touch this process's copy.
    pub(crate) fn forget_worker_after_fork(&mut self) {
        std::mem::forget(self.worker.take());
    }

    /// The mapping back, once the worker (if any) is joined.
    pub(crate) fn into_mapping(mut self) -> M {
        let _ = self.join();
        self.mapping
            .take()
            .expect("an Owner holds its mapping until into_mapping consumes it")
    }
}

impl<M: Holds, W: Send + 'static> Drop for Owner<M, W> {
    /// Never let the mapping go under a running worker.
    fn drop(&mut self) {
        let _ = self.join();
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::time::Duration;

    use super::*;
    use crate::layout::{PageSize, round_to_page};
    use crate::sys::{AnonMapOptions, Mmap};

    struct Held(Mmap);

    impl Holds for Held {
        fn held(&self) -> Region<'_> {
            self.0.region()
        }
    }

    fn held() -> Held {
        let size = round_to_page(1 << 20, PageSize::BASE_4K).unwrap();
        Held(
            Mmap::anonymous(
                size,
                AnonMapOptions {
                    shared: false,
                    align: 4096,
                },
            )
            .unwrap(),
        )
    }

    #[test]
    fn the_mapping_outlives_its_worker_and_is_not_changed_under_it() {
        let go = Arc::new(AtomicBool::new(false));
        let mut owner: Owner<Held, u8> = Owner::new(held());
        assert!(owner.get_mut().is_some());
        let wait = Arc::clone(&go);
        owner
            .spawn("test-worker".into(), move |region| {
                while !wait.load(Ordering::SeqCst) {
                    std::thread::sleep(Duration::from_millis(1));
                }
                // The memory is still mapped: the owner has not let it go.
                region.write_byte(4096, 7);
                region.read_byte(4096).unwrap()
            })
            .unwrap();
        assert!(owner.get_mut().is_none(), "no &mut under a running worker");
        let again = owner.spawn("second".into(), |_| 0).unwrap_err();
        assert_eq!(again.raw_os_error(), Some(libc::EBUSY));
        let releaser = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(20));
            go.store(true, Ordering::SeqCst);
        });
        // Handing the mapping back waits for the worker, which then reads
        // its own write.
        let mapping = owner.into_mapping();
        assert_eq!(mapping.held().read_byte(4096), Some(7));
        releaser.join().unwrap();
    }

    #[test]
    fn dropping_the_owner_joins_its_worker_first() {
        let done = Arc::new(AtomicBool::new(false));
        let mut owner: Owner<Held, ()> = Owner::new(held());
        let flag = Arc::clone(&done);
        owner
            .spawn("test-worker".into(), move |region| {
                std::thread::sleep(Duration::from_millis(20));
                region.write_byte(0, 1);
                flag.store(true, Ordering::SeqCst);
            })
            .unwrap();
        drop(owner);
        assert!(
            done.load(Ordering::SeqCst),
            "the worker ran to its end before the unmap"
        );
    }
}
