//! A build on a thread of its own, while the calling thread waits without
//! the GIL: other Python threads run, the `progress` callable is called in
//! the caller's thread, logs reach `logging`, and Ctrl-C (or an exception
//! from `progress`) stops the build the way a signal stops `hostpool alloc`:
//! through the build's own [`pool_core::interrupt::Cancel`], tearing down
//! what exists; a build in another thread, with its own token, goes on.

use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Arc, Mutex, mpsc};
use std::time::Duration;

use pool_core::interrupt::Cancel;
use pool_core::{BuildOptions, Error, Observer, Phase, Pool, PoolPlan};
use pyo3::prelude::*;

use crate::{errors, logs};

/// How often the waiting thread wakes to deliver progress and logs and to
/// check for Ctrl-C.
const POLL: Duration = Duration::from_millis(50);

#[derive(Debug, Clone, Copy)]
enum Event {
    Start(Phase, u64),
    Progress(Phase, u64),
    End(Phase),
}

/// The build's observer: events queued for the waiting thread, and the last
/// phase started (to name a failure's phase).
#[derive(Default)]
struct Watch {
    events: Mutex<Vec<Event>>,
    phase: AtomicU8,
}

const PHASES: [Phase; 6] = [
    Phase::Map,
    Phase::Prefault,
    Phase::Attach,
    Phase::Pin,
    Phase::Register,
    Phase::Teardown,
];

impl Watch {
    fn push(&self, e: Event) {
        self.events
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(e);
    }
    fn take(&self) -> Vec<Event> {
        std::mem::take(&mut *self.events.lock().unwrap_or_else(|p| p.into_inner()))
    }
    fn phase(&self) -> Option<Phase> {
        match self.phase.load(Ordering::SeqCst) {
            0 => None,
            n => PHASES.get(usize::from(n) - 1).copied(),
        }
    }
}

impl Observer for Watch {
    fn start(&self, phase: Phase, total: u64) {
        let index = PHASES.iter().position(|p| *p == phase).unwrap_or(0);
        self.phase
            .store(u8::try_from(index + 1).unwrap_or(0), Ordering::SeqCst);
        self.push(Event::Start(phase, total));
    }
    fn progress(&self, phase: Phase, done: u64) {
        self.push(Event::Progress(phase, done));
    }
    fn end(&self, phase: Phase, _seconds: f64) {
        self.push(Event::End(phase));
    }
}

/// Calls `progress(phase, done_bytes, total_bytes)` for what happened since
/// the last call: each phase's start and end, and its latest progress.
struct Delivery<'py> {
    callback: Option<Bound<'py, PyAny>>,
    totals: [u64; 6],
}

impl<'py> Delivery<'py> {
    fn deliver(&mut self, events: Vec<Event>) -> PyResult<()> {
        let Some(cb) = &self.callback else {
            return Ok(());
        };
        let slot = |p: Phase| PHASES.iter().position(|q| *q == p).unwrap_or(0);
        let mut pending: Option<(Phase, u64)> = None;
        let mut calls = Vec::new();
        for e in events {
            match e {
                Event::Progress(p, done) => pending = Some((p, done)),
                other => {
                    if let Some((p, done)) = pending.take() {
                        calls.push((p, done, self.totals[slot(p)]));
                    }
                    match other {
                        Event::Start(p, total) => {
                            self.totals[slot(p)] = total;
                            calls.push((p, 0, total));
                        }
                        Event::End(p) => {
                            let total = self.totals[slot(p)];
                            calls.push((p, total, total));
                        }
                        Event::Progress(..) => {}
                    }
                }
            }
        }
        if let Some((p, done)) = pending {
            calls.push((p, done, self.totals[slot(p)]));
        }
        for (p, done, total) in calls {
            cb.call1((p.name(), done, total))?;
        }
        Ok(())
    }
}

/// What a build ended with, the phase it was in, and the Python error that
/// stopped it, if one did.
pub struct Built {
    pub pool: Result<Pool, Error>,
    pub phase: Option<Phase>,
}

/// Build the pool `plan` describes (see the module docs). `Err` is the
/// Python exception to raise: the build's error as its `hostpool` class,
/// or the `KeyboardInterrupt` (or `progress` exception) that stopped it,
/// after everything built was torn down.
pub fn build(py: Python<'_>, plan: PoolPlan, progress: Option<Bound<'_, PyAny>>) -> PyResult<Pool> {
    let built = run(py, plan, progress)?;
    built.pool.map_err(|e| errors::to_py(py, &e, built.phase))
}

fn run(py: Python<'_>, plan: PoolPlan, progress: Option<Bound<'_, PyAny>>) -> PyResult<Built> {
    let watch = Arc::new(Watch::default());
    // This build's own token: Ctrl-C in the thread that waits for it
    // cancels it, and no other build of the process.
    let cancel = Cancel::new();
    let (tx, rx) = mpsc::channel();
    // `detach` needs what it borrows to be `Sync`.
    let rx = Mutex::new(rx);
    let thread = {
        let watch = Arc::clone(&watch);
        let cancel = cancel.clone();
        std::thread::Builder::new()
            .name("hostpool-build".into())
            .spawn(move || {
                let pool = Pool::build_with_options(
                    &plan,
                    &*watch,
                    &BuildOptions::new()
                        .cancel(&cancel)
                        .handoff(hostpool::hostpool_handoff::HANDOFF),
                );
                let _ = tx.send(pool);
            })
            .map_err(|e| {
                errors::to_py(
                    py,
                    &Error::Plugin {
                        what: "hostpool".into(),
                        message: "cannot start the build thread".into(),
                        source: Some(Box::new(e)),
                    },
                    None,
                )
            })?
    };
    let mut delivery = Delivery {
        callback: progress,
        totals: [0; 6],
    };
    let mut stopped: Option<PyErr> = None;
    let outcome = loop {
        let received = py.detach(|| {
            rx.lock()
                .unwrap_or_else(|p| p.into_inner())
                .recv_timeout(POLL)
        });
        logs::flush(py);
        if stopped.is_none() {
            let step = delivery
                .deliver(watch.take())
                .and_then(|()| py.check_signals());
            if let Err(e) = step {
                // Stop the build as SIGINT stops `hostpool alloc`.
                cancel.cancel(libc::SIGINT);
                stopped = Some(e);
            }
        }
        match received {
            Ok(pool) => break Some(pool),
            Err(mpsc::RecvTimeoutError::Timeout) => {}
            Err(mpsc::RecvTimeoutError::Disconnected) => break None,
        }
    };
    let _ = py.detach(|| thread.join());
    logs::flush(py);
    if stopped.is_none() {
        delivery.deliver(watch.take())?;
    }
    let phase = watch.phase();
    let pool = match outcome {
        Some(pool) => pool,
        None => Err(Error::Plugin {
            what: "hostpool".into(),
            message: "the build thread panicked; what it built was torn down as it unwound".into(),
            source: None,
        }),
    };
    if let Some(e) = stopped {
        // The build may have finished before it saw the request.
        if let Ok(pool) = pool {
            let report = py.detach(|| pool.teardown());
            drop(report);
        }
        logs::flush(py);
        return Err(e);
    }
    Ok(Built { pool, phase })
}
