//! The measured jobs: `memset` over resident memory (the limit), and per kind
//! of memory the C reference, the engine's methods and `mmap(MAP_POPULATE)`.

use pool_core::PrefaultChoice;

use super::{Bench, Row, Status, error_text, mib, progress};
use bench_support::benchkit::{self, ANON_4K, FreshPool, Memory, Populate};

/// One kind of timed run of a prefault group.
#[derive(Debug, Clone, Copy)]
enum Job {
    Prefault(Populate, usize),
    MapPopulate,
    /// `hostpool alloc` in its own process: its `phases.prefault`.
    Alloc(usize),
}

impl Bench<'_> {
    /// `memset` over resident anonymous memory, per thread count.
    pub(super) fn memset(&mut self) {
        let memory = ANON_4K;
        let size = self.size;
        let rows: Vec<usize> = self
            .threads
            .clone()
            .into_iter()
            .map(|t| self.push(Row::new("limit", "memset", &memory, t, size)))
            .collect();
        if !self.available(&memory, size, &rows) || !self.warm_up(&memory, size, &rows) {
            return;
        }
        progress(&format!("memset over {} resident", mib(size)));
        let pool = memory.plan(size).and_then(|plan| FreshPool::build(&plan));
        let mut pool = match pool {
            Ok(p) => p,
            Err(e) => {
                for &i in &rows {
                    self.rows[i].set(Status::Failed, error_text(&e));
                }
                return;
            }
        };
        // Fault it in first: memset is timed over resident memory.
        if let Err(e) = pool.memset(benchkit::cores()) {
            for &i in &rows {
                self.rows[i].set(Status::Failed, format!("memset: {e}"));
            }
        }
        for r in 0..self.repeat {
            for k in 0..rows.len() {
                let i = rows[(k + r) % rows.len()];
                if !self.rows[i].open() {
                    continue;
                }
                let t = self.rows[i].threads;
                match pool.memset(t) {
                    Ok(took) => {
                        self.rows[i].seconds_each.push(took.as_secs_f64());
                        self.rows[i].threads_used = Some(t);
                    }
                    Err(e) => self.rows[i].set(Status::Failed, format!("memset: {e}")),
                }
            }
        }
        if let Err(e) = pool.teardown() {
            for &i in &rows {
                self.rows[i].note(format!("teardown: {}", error_text(&e)));
            }
        }
        for &i in &rows {
            self.rows[i].finish();
        }
    }

    /// raw-c, populate-write, touch per thread count, and map-populate, on
    /// one kind of memory.
    pub(super) fn prefault(&mut self, memory: &Memory) {
        let size = memory.round(self.size);
        let mut jobs: Vec<Vec<(usize, Job)>> = Vec::new();
        let mut rows = Vec::new();
        for (n, &t) in self.threads.clone().iter().enumerate() {
            let raw_threads = benchkit::raw_c_threads(size, memory.page, t);
            let mut group = vec![
                (
                    self.push(Row::new("prefault", "raw-c", memory, t, size)),
                    Job::Prefault(Populate::RawC, raw_threads),
                ),
                (
                    self.push(Row::new("prefault", "populate-write", memory, t, size)),
                    Job::Prefault(Populate::Engine(PrefaultChoice::PopulateWrite), t),
                ),
                (
                    self.push(Row::new("prefault", "touch", memory, t, size)),
                    Job::Prefault(Populate::Engine(PrefaultChoice::Touch), t),
                ),
                (
                    self.push(Row::new("prefault", "alloc", memory, t, size)),
                    Job::Alloc(t),
                ),
            ];
            if raw_threads != t {
                self.rows[group[0].0].note(format!(
                    "the C reference splits the range into 4 KiB-even slices, which with {t} \
                     threads would start inside a {} page (EINVAL); it ran with {raw_threads}",
                    benchkit::page_label(memory.page)
                ));
            }
            if n == 0 {
                // One mmap call: the kernel populates in the calling thread.
                let i = self.push(Row::new("prefault", "map-populate", memory, 1, size));
                if memory.backing == "shm-segmented" {
                    self.rows[i].note("one /dev/shm file (the pool uses 4 segments)".into());
                }
                group.push((i, Job::MapPopulate));
            }
            rows.extend(group.iter().map(|(i, _)| *i));
            jobs.push(group);
        }
        // Anonymous 4 KiB memory was warmed up for memset already.
        let warm = self.env.warm_up_seconds.contains_key(&Self::label(memory));
        if !self.available(memory, size, &rows) || (!warm && !self.warm_up(memory, size, &rows)) {
            return;
        }
        let plan = match memory.plan(size) {
            Ok(p) => p,
            Err(e) => {
                for &i in &rows {
                    self.rows[i].set(Status::Failed, error_text(&e));
                }
                return;
            }
        };
        for group in &jobs {
            progress(&format!(
                "prefault of {} {} with {} thread(s)",
                mib(size),
                Self::label(memory),
                self.rows[group[0].0].threads
            ));
            for r in 0..self.repeat {
                for k in 0..group.len() {
                    let (i, job) = group[(k + r) % group.len()];
                    if !self.rows[i].open() {
                        continue;
                    }
                    let result = match job {
                        Job::Prefault(how, t) => benchkit::prefault_once(&plan, how, t).map(|t| {
                            let mut notes = Vec::new();
                            if t.fell_back {
                                notes.push(
                                    "populate-write fell back to touch (EINVAL from madvise)"
                                        .to_string(),
                                );
                            }
                            (t.took, Some(t.threads), notes)
                        }),
                        Job::Alloc(t) => {
                            alloc_once(memory, size, t).map(|took| (took, Some(t), Vec::new()))
                        }
                        Job::MapPopulate => benchkit::map_populate_once(memory, size).map(|m| {
                            let mut notes = Vec::new();
                            if let Some(p) = m.present.filter(|p| *p < size) {
                                notes.push(format!(
                                    "only {} of {} present after MAP_POPULATE",
                                    mib(p),
                                    mib(size)
                                ));
                            }
                            (m.took, Some(1), notes)
                        }),
                    };
                    let row = &mut self.rows[i];
                    match result {
                        Ok((took, used, notes)) => {
                            row.seconds_each.push(took.as_secs_f64());
                            row.threads_used = used;
                            for n in notes {
                                row.note(n);
                            }
                        }
                        Err(e) => row.set(Status::Failed, error_text(&e)),
                    }
                }
            }
        }
        let pages = usize::try_from(size / memory.page.get()).unwrap_or(usize::MAX);
        for &i in &rows {
            let row = &mut self.rows[i];
            if let Some(used) = row.threads_used
                && row.method != "raw-c"
                && pages < used
            {
                // The engine starts a thread per slice even when some slices
                // are empty; only threads with a page do any work.
                row.threads_used = Some(pages);
                row.note(format!(
                    "only {pages} of the {used} threads had a page to fault ({pages} x {})",
                    benchkit::page_label(memory.page)
                ));
            }
            if size != self.size {
                row.note(format!(
                    "{} per run: the size rounded up to whole {} pages",
                    mib(size),
                    benchkit::page_label(memory.page)
                ));
            }
            row.finish();
        }
    }
}

/// One `hostpool alloc --json` of `size` bytes of `memory` with `threads`
/// prefault threads, in a process of its own, as operators run it: the
/// prefault phase it reports (map, probe and threads included as `alloc`
/// measures them). Issue 13: this path ran at 0.7-0.85 of the raw C
/// reference on 2 MiB pages while the in-process engine rows said 1.0.
fn alloc_once(
    memory: &Memory,
    size: u64,
    threads: usize,
) -> pool_core::Result<std::time::Duration> {
    use pool_core::Error;
    let config = memory.config(size);
    let mut doc =
        serde_json::to_value(&config).map_err(|e| Error::config(format!("bench config: {e}")))?;
    if let Some(obj) = doc.as_object_mut() {
        obj.insert("prefault".into(), "populate-write".into());
        obj.insert("threads".into(), threads.into());
        for (name, table) in &config.plugins {
            obj.insert(name.clone(), table.clone());
        }
    }
    static RUN: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = RUN.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let path = std::env::temp_dir().join(format!("hostpool-bench-{}-{n}.json", std::process::id()));
    let os =
        |op: &'static str, e: std::io::Error| Error::os(op, e, pool_core::Context::file(&path));
    std::fs::write(&path, doc.to_string()).map_err(|e| os("write", e))?;
    let exe = std::env::current_exe().map_err(|e| os("current_exe", e));
    let out = exe.and_then(|exe| {
        std::process::Command::new(exe)
            .args(["alloc", "--json", "--config"])
            .arg(&path)
            .env_remove("RUST_LOG")
            .output()
            .map_err(|e| os("spawn hostpool alloc", e))
    });
    let _ = std::fs::remove_file(&path);
    let out = out?;
    if !out.status.success() {
        return Err(Error::Plugin {
            what: "hostpool alloc".into(),
            message: String::from_utf8_lossy(&out.stderr).trim().to_string(),
            source: None,
        });
    }
    let report: serde_json::Value = serde_json::from_slice(&out.stdout)
        .map_err(|e| Error::config(format!("hostpool alloc printed no report: {e}")))?;
    report["phases"]["prefault"]
        .as_f64()
        .map(std::time::Duration::from_secs_f64)
        .ok_or_else(|| Error::config("hostpool alloc reported no prefault phase"))
}
