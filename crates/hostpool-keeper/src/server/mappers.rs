//! Which processes map a pool's files (`/proc/PID/maps`): how an adopted
//! pool's keeper tells the engines that mapped it before the restart (and
//! may still write chunks the keeper before granted them) from its own
//! tenants.

use pool_core::file::FileId;

/// The pids (this PID namespace's) of the processes other than this one
/// that map any of `files`.
pub(super) fn mapping(files: &[FileId]) -> Vec<u32> {
    let me = std::process::id();
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    let mut pids: Vec<u32> = dir
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| *pid != me)
        .filter(|pid| {
            std::fs::read_to_string(format!("/proc/{pid}/maps"))
                .is_ok_and(|maps| maps.lines().any(|l| maps_line_names(l, files)))
        })
        .collect();
    pids.sort_unstable();
    pids
}

/// Whether process `pid` is one of `ancestors` or a descendant of one (its
/// parent chain in `/proc/PID/stat`): an engine's workers are its children.
pub(super) fn descends_from(pid: u32, ancestors: &[u32]) -> bool {
    let mut p = pid;
    for _ in 0..64 {
        if ancestors.contains(&p) {
            return true;
        }
        let Some(parent) = parent_of(p) else {
            return false;
        };
        if parent <= 1 {
            return false;
        }
        p = parent;
    }
    false
}

fn parent_of(pid: u32) -> Option<u32> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // After the command's closing parenthesis: state, then the parent.
    stat.rsplit_once(')')?
        .1
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()
}

/// Whether one line of `/proc/PID/maps` maps one of `files`: its device
/// (`major:minor`, hex) and inode.
fn maps_line_names(line: &str, files: &[FileId]) -> bool {
    let mut fields = line.split_whitespace().skip(3);
    let (Some(dev), Some(ino)) = (fields.next(), fields.next()) else {
        return false;
    };
    let Some((major, minor)) = dev.split_once(':') else {
        return false;
    };
    let (Ok(major), Ok(minor), Ok(ino)) = (
        u32::from_str_radix(major, 16),
        u32::from_str_radix(minor, 16),
        ino.parse::<u64>(),
    ) else {
        return false;
    };
    ino != 0
        && files.iter().any(|f| {
            f.ino == ino && rustix::fs::major(f.dev) == major && rustix::fs::minor(f.dev) == minor
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsFd;

    /// A child process that maps a memfd is found; this process is not
    /// (it maps it too), and neither is the child once it is gone.
    #[test]
    fn a_process_that_maps_a_file_is_found_until_it_is_gone() {
        let fd = rustix::fs::memfd_create("mappers", rustix::fs::MemfdFlags::empty()).unwrap();
        rustix::fs::ftruncate(&fd, 4096).unwrap();
        let id = pool_core::file::file_id(fd.as_fd()).unwrap();
        let raw = std::os::fd::AsRawFd::as_raw_fd(&fd);
        // The child maps the memfd it inherits, says so, and waits.
        let mut child = std::process::Command::new("python3")
            .args([
                "-c",
                &format!(
                    "import mmap, sys; m = mmap.mmap({raw}, 4096); print('mapped', flush=True); \
                     sys.stdin.read()"
                ),
            ])
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let mut line = String::new();
        std::io::BufRead::read_line(
            &mut std::io::BufReader::new(child.stdout.as_mut().unwrap()),
            &mut line,
        )
        .unwrap();
        assert_eq!(line.trim(), "mapped");
        assert_eq!(mapping(&[id]), vec![child.id()]);
        assert!(descends_from(child.id(), &[std::process::id()]));
        assert!(!descends_from(child.id(), &[child.id() + 100_000]));
        drop(child.stdin.take());
        child.wait().unwrap();
        assert!(mapping(&[id]).is_empty());
        let other = FileId {
            dev: id.dev,
            ino: id.ino + 1_000_000,
        };
        assert!(!maps_line_names(
            &format!(
                "7f00-7f01 rw-s 00000000 00:01 {} /memfd:x (deleted)",
                id.ino + 1
            ),
            &[other]
        ));
    }
}
