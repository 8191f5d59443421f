//! Restoring the machine at the end of a [`Session`] (steps 1-5 of the
//! [parent module](super)'s docs) and reporting it as a footer.

use std::fs;
use std::io::ErrorKind;
use std::path::Path;

use super::{Pool, SHM_DIR, SHM_PREFIX, Session, shm_leftovers};
use crate::hugepages::{self, Counters, PageSize};
use crate::mounts::{self, Unmounted};

/// What restoring did, printed as the footer.
#[derive(Default)]
pub(super) struct Footer {
    /// What was done, one line each.
    pub(super) done: Vec<String>,
    /// Problems to shout about.
    pub(super) warnings: Vec<String>,
}

impl Footer {
    /// Prints the footer to stderr, warnings loudly.
    pub(super) fn print(&self) {
        eprintln!("xtask: ---- huge page restore ----");
        for line in &self.done {
            eprintln!("xtask:   {line}");
        }
        if self.warnings.is_empty() {
            eprintln!("xtask:   machine restored cleanly");
            return;
        }
        eprintln!("xtask: !!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!");
        for warning in &self.warnings {
            eprintln!("xtask: !!! WARNING: {warning}");
        }
        eprintln!("xtask: !!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!");
    }
}

impl Session {
    /// Undoes the setup; never panics, problems become warnings.
    pub(super) fn restore(&mut self) -> Footer {
        let mut footer = Footer::default();
        if self.dir_owned {
            self.unmount_all(&mut footer);
            self.remove_dirs(&mut footer);
        }
        for pool in &self.pools {
            restore_counter(pool, "nr_hugepages", pool.original.nr, &mut footer);
            restore_counter(
                pool,
                "nr_overcommit_hugepages",
                pool.original.overcommit,
                &mut footer,
            );
            check_pages_released(pool, &mut footer);
        }
        self.check_dev_shm(&mut footer);
        self.remove_state_file(&mut footer);
        footer
    }

    /// Unmounts everything mounted at or below the session dir.
    fn unmount_all(&self, footer: &mut Footer) {
        let points = match mounts::mounts_under(&self.dir) {
            Ok(points) => points,
            Err(err) => {
                footer.warnings.push(err);
                return;
            }
        };
        for point in points {
            report_leftover_files(&point, footer);
            match mounts::unmount(&point) {
                Ok(Unmounted::Cleanly) => {
                    footer.done.push(format!("unmounted {}", point.display()));
                }
                Ok(Unmounted::Lazily) => footer.warnings.push(format!(
                    "{} was busy and was only lazily unmounted (`umount -l`); a process still \
                     uses it and its huge pages stay in use until that process exits",
                    point.display()
                )),
                Err(err) => footer.warnings.push(err),
            }
        }
    }

    /// Removes the mount points and the session dir (never their contents).
    fn remove_dirs(&self, footer: &mut Footer) {
        let subdirs = PageSize::ALL.map(|size| self.dir.join(size.tag()));
        for dir in subdirs.iter().chain([&self.dir]) {
            match fs::remove_dir(dir) {
                Ok(()) if *dir == self.dir => {
                    footer.done.push(format!("removed {}", dir.display()));
                }
                Ok(()) => {}
                Err(err) if err.kind() == ErrorKind::NotFound => {}
                Err(err) => footer.warnings.push(format!(
                    "could not remove {}: {err}; check /proc/mounts and remove it by hand",
                    dir.display()
                )),
            }
        }
    }

    /// Warns about `hostpool*` files in /dev/shm.
    fn check_dev_shm(&self, footer: &mut Footer) {
        let left = shm_leftovers();
        if left.is_empty() {
            footer
                .done
                .push(format!("no {SHM_PREFIX}* files in {SHM_DIR}"));
            return;
        }
        let listed: Vec<String> = left
            .iter()
            .map(|name| {
                let before = if self.shm_before.contains(name) {
                    " (already there before)"
                } else {
                    ""
                };
                format!("{SHM_DIR}/{name}{before}")
            })
            .collect();
        footer.warnings.push(format!(
            "{} file(s) starting with `{SHM_PREFIX}` remain in {SHM_DIR} (leaked shared memory?): {}",
            left.len(),
            listed.join(", ")
        ));
    }
}

/// Warns about files the tests left in the mount at `point`.
fn report_leftover_files(point: &Path, footer: &mut Footer) {
    let Ok(entries) = fs::read_dir(point) else {
        return;
    };
    let names: Vec<String> = entries
        .filter_map(Result::ok)
        .map(|entry| entry.file_name().to_string_lossy().into_owned())
        .collect();
    if !names.is_empty() {
        footer.warnings.push(format!(
            "tests left {} file(s) in {}: {} (a test leaks hugetlbfs \
             files; unmounting frees them once no process uses them)",
            names.len(),
            point.display(),
            names.join(", ")
        ));
    }
}

/// Writes `original` back to `counter` of `pool` if it differs now.
fn restore_counter(pool: &Pool, counter: &str, original: u64, footer: &mut Footer) {
    let label = format!("{} {counter}", pool.size.human());
    let now = match hugepages::read_counter(pool.size, counter) {
        Ok(now) => now,
        Err(err) => return footer.warnings.push(err),
    };
    if now == original {
        footer.done.push(format!("{label} = {now} (unchanged)"));
        return;
    }
    if let Err(err) = hugepages::write_counter(pool.size, counter, original) {
        return footer.warnings.push(format!("{err}; restore it by hand"));
    }
    match hugepages::read_counter(pool.size, counter) {
        Ok(back) if back == original => footer.done.push(format!("{label} {now} -> {back}")),
        Ok(back) => footer.warnings.push(format!(
            "{label} is {back} after writing {original} (was {now}): pages still in use \
             stay allocated (as surplus) until their user releases them"
        )),
        Err(err) => footer.warnings.push(err),
    }
}

/// Warns if more huge pages of `pool` are in use than before the session.
fn check_pages_released(pool: &Pool, footer: &mut Footer) {
    let now = match Counters::read(pool.size) {
        Ok(now) => now,
        Err(err) => return footer.warnings.push(err),
    };
    let (before, after) = (pool.original.in_use(), now.in_use());
    if after <= before {
        footer.done.push(format!(
            "{} pages: {} free of {} (in use: {after}, before: {before})",
            pool.size.human(),
            now.free,
            now.nr
        ));
        return;
    }
    footer.warnings.push(format!(
        "{} huge page(s) of {} are STILL IN USE after restore (before: {before}; now nr_hugepages \
         {}, surplus {}, free {}). A test leaked a hugetlbfs file or mapping; \
         check `grep -i huge /proc/meminfo` and `grep -l huge /proc/*/maps`",
        after - before,
        pool.size.human(),
        now.nr,
        now.surplus,
        now.free
    ));
}
