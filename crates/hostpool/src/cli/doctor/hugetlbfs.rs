//! `hugetlbfs`: the mounts, their page size and `size=` limit, and whether
//! their page size's pool has pages left.

use std::ffi::OsString;
use std::fmt::Write as _;
use std::io;
use std::os::unix::ffi::OsStringExt;
use std::path::PathBuf;

use pool_core::fs::{FsKind, filesystem_kind};
use pool_core::hugetlb;
use pool_core::layout::format_bytes;
use serde_json::json;

use super::hugepages::reserve_remedy;
use super::{Finding, Level};

/// A mount point from `/proc/mounts`, with its options.
struct Mount {
    point: PathBuf,
    options: String,
}

/// Undo the octal escapes of `/proc/mounts` (`\040` for a space).
fn unescape(field: &str) -> PathBuf {
    let b = field.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let octal = b
            .get(i + 1..i + 4)
            .filter(|d| b[i] == b'\\' && d.iter().all(|c| (b'0'..=b'7').contains(c)));
        match octal {
            Some(d) => {
                let v = d.iter().fold(0u32, |acc, c| acc * 8 + u32::from(c - b'0'));
                out.push(u8::try_from(v).unwrap_or(b'?'));
                i += 4;
            }
            None => {
                out.push(b[i]);
                i += 1;
            }
        }
    }
    PathBuf::from(OsString::from_vec(out))
}

/// The hugetlbfs mounts listed in `/proc/mounts`.
fn hugetlbfs_mounts() -> io::Result<Vec<Mount>> {
    let text = std::fs::read_to_string("/proc/mounts")?;
    Ok(text
        .lines()
        .filter_map(|line| {
            let mut f = line.split_whitespace();
            let (_, point, kind, options) = (f.next()?, f.next()?, f.next()?, f.next()?);
            (kind == "hugetlbfs").then(|| Mount {
                point: unescape(point),
                options: options.to_string(),
            })
        })
        .collect())
}

/// One finding per hugetlbfs mount; `need` as for [`super::hugepages::findings`].
pub(super) fn findings(need: Option<(u64, u64)>) -> Vec<Finding> {
    let mounts = match hugetlbfs_mounts() {
        Ok(m) => m,
        Err(e) => {
            return vec![
                Finding::new(
                    "hugetlbfs",
                    "mounts",
                    format!("cannot read /proc/mounts: {e}"),
                )
                .warn("mount /proc"),
            ];
        }
    };
    if mounts.is_empty() {
        return vec![Finding::new("hugetlbfs", "mounts", "none mounted").info(
            "the hugetlbfs backing works without one (memfd_create with MFD_HUGETLB); to \
                 share a pool by path: `mount -t hugetlbfs -o pagesize=2M none /dev/hugepages` \
                 (pagesize=1G for 1 GiB pages); Kubernetes: an emptyDir with medium \
                 HugePages-2Mi or HugePages-1Gi",
        )];
    }
    mounts.iter().map(|m| mount_finding(m, need)).collect()
}

/// A mount's page size, `size=` limit and pool.
fn mount_finding(m: &Mount, need: Option<(u64, u64)>) -> Finding {
    let item = m.point.display().to_string();
    let page = match filesystem_kind(&m.point) {
        Ok(FsKind::Hugetlbfs { page_size }) => page_size,
        Ok(_) => {
            return Finding::new(
                "hugetlbfs",
                item,
                "listed in /proc/mounts, but another file \
                                 system is mounted over it",
            )
            .info("use the mount on top, or unmount the one over it");
        }
        Err(e) => {
            return Finding::new("hugetlbfs", item, format!("cannot be examined: {e}"))
                .warn(format!("check the permissions of {}", m.point.display()));
        }
    };
    let label = format_bytes(page);
    let mut value = format!("{label} pages");
    let mut details = json!({ "path": item, "page_size": page, "options": m.options });
    let mut verdict = Level::Ok;
    let mut remedies = Vec::new();
    match hugetlb::mount_limit(&m.point) {
        Ok(Some(l)) => {
            let _ = write!(
                value,
                ", size={} ({} of {} pages free)",
                format_bytes(l.total_bytes()),
                l.free_pages,
                l.total_pages
            );
            details["size_limit"] = json!(l.total_bytes());
            details["limit_free_pages"] = json!(l.free_pages);
            if l.free_pages == 0 {
                verdict = Level::Warn;
                remedies.push(format!(
                    "its size= limit is used up: remove stale files (`hostpool gc --dir {}`) or \
                     mount it again with a larger size= (hugetlbfs cannot be remounted to \
                     change it)",
                    m.point.display()
                ));
            }
        }
        Ok(None) => value.push_str(", no size= limit"),
        Err(e) => {
            let _ = write!(value, ", size= limit unknown ({e})");
        }
    }
    match hugetlb::pool(page) {
        Ok(p) => {
            let _ = write!(
                value,
                "; {label} pool: {} free, {} available",
                p.free,
                p.available()
            );
            details["pool_free"] = json!(p.free);
            details["pool_available"] = json!(p.available());
            if p.available() == 0 {
                verdict = Level::Warn;
                let wanted = need.filter(|(sz, _)| *sz == page).map(|(_, n)| n);
                remedies.push(format!(
                    "no {label} page is available to files on it: {}",
                    reserve_remedy(page, wanted)
                ));
            }
        }
        Err(e) => {
            let _ = write!(value, "; {label} pool cannot be read ({e})");
            verdict = Level::Warn;
            remedies.push("check that /sys/kernel/mm/hugepages is readable".into());
        }
    }
    Finding::new("hugetlbfs", item, value)
        .level(verdict)
        .remedy(remedies.join("; "))
        .details(details)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mount_fields_are_unescaped() {
        assert_eq!(
            unescape("/mnt/huge\\040pages"),
            PathBuf::from("/mnt/huge pages")
        );
        assert_eq!(unescape("/a\\134b"), PathBuf::from("/a\\b"));
        assert_eq!(unescape("/odd\\04"), PathBuf::from("/odd\\04"));
        assert_eq!(unescape("\\"), PathBuf::from("\\"));
    }
}
