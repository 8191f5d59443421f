//! The one cgroup walk: this process's group for a controller, found in
//! `/proc/self/cgroup` (cgroup v1 and v2), and every ancestor from it up to
//! the root of the hierarchy, with the finite limits they set.
//!
//! Limits are hierarchical: a group can use no more than the tightest limit
//! of any of its ancestors, so a nested group without a limit of its own
//! (or with a looser one) is bound by its parent's. Every reader of a
//! cgroup limit (the memory limit of [`memory`](crate::memory), a
//! huge-page backing's hugetlb limits) goes through [`limits`] or
//! [`tightest`].
//!
//! The readers take the text of `/proc/self/cgroup` and the root the
//! hierarchies are mounted under as arguments ([`limits_in`],
//! [`tightest_in`]), so tests run them over a fake tree.

use std::fs;
use std::path::{Component, Path, PathBuf};

use serde::Serialize;

/// Where cgroup hierarchies are mounted.
pub const ROOT: &str = "/sys/fs/cgroup";
/// Where this process's groups are listed.
pub const SELF_CGROUP: &str = "/proc/self/cgroup";

/// Limits at or above this are "unlimited" (cgroup v1 writes `PAGE_COUNTER_MAX`).
const UNLIMITED: u64 = 1 << 62;

/// A limit file and the usage file charged against it, as named in a group
/// directory (e.g. `memory.max` and `memory.current`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LimitFile {
    /// The limit, e.g. `memory.max`, `hugetlb.2MB.limit_in_bytes`.
    pub limit: String,
    /// The usage, e.g. `memory.current`, `hugetlb.2MB.usage_in_bytes`.
    pub usage: String,
}

impl LimitFile {
    /// A limit file and its usage file.
    pub fn new(limit: impl Into<String>, usage: impl Into<String>) -> LimitFile {
        LimitFile {
            limit: limit.into(),
            usage: usage.into(),
        }
    }
}

/// What to read of one controller, in each cgroup version.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Controller {
    /// Its name in `/proc/self/cgroup` under v1, which is also the
    /// directory of its v1 hierarchy under the root: `memory`, `hugetlb`.
    pub name: String,
    /// The files read in a v2 group (the unified hierarchy, at the root or
    /// at `unified/` under it).
    pub v2: Vec<LimitFile>,
    /// The files read in a v1 group (under `<root>/<name>`).
    pub v1: Vec<LimitFile>,
}

/// One finite limit that binds this process: in its own group or in an
/// ancestor.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct CgroupLimit {
    /// The limit file read, e.g. `/sys/fs/cgroup/kubepods/memory.max`.
    pub path: PathBuf,
    /// The limit in bytes.
    pub limit: u64,
    /// Bytes charged against it now.
    pub usage: u64,
}

impl CgroupLimit {
    /// Bytes still allowed: `limit − usage`, saturating.
    pub fn free(&self) -> u64 {
        self.limit.saturating_sub(self.usage)
    }

    /// The group directory that sets the limit.
    pub fn group(&self) -> &Path {
        self.path.parent().unwrap_or(&self.path)
    }

    /// The limit file's name, e.g. `memory.max`.
    pub fn file_name(&self) -> &str {
        self.path
            .file_name()
            .and_then(|n| n.to_str())
            .unwrap_or_default()
    }
}

/// Every finite limit of the controller that binds this process
/// ([`limits_in`] over `/proc/self/cgroup` and [`ROOT`]). Empty when
/// `/proc/self/cgroup` cannot be read.
pub fn limits(controller: &Controller) -> Vec<CgroupLimit> {
    match fs::read_to_string(SELF_CGROUP) {
        Ok(own) => limits_in(&own, Path::new(ROOT), controller),
        Err(_) => Vec::new(),
    }
}

/// The limit with the least room left (`limit − usage`) of [`limits`].
pub fn tightest(controller: &Controller) -> Option<CgroupLimit> {
    limits(controller).into_iter().min_by_key(CgroupLimit::free)
}

/// The limit with the least room left of [`limits_in`]; of equals, the
/// first found (the deepest group).
pub fn tightest_in(own: &str, root: &Path, controller: &Controller) -> Option<CgroupLimit> {
    limits_in(own, root, controller)
        .into_iter()
        .min_by_key(CgroupLimit::free)
}

/// Every finite limit of the controller that binds the process whose
/// `/proc/PID/cgroup` text is `own`, with its hierarchies mounted under
/// `root`.
///
/// For each line of `own`: a v2 line (`0::/path`) is looked up under `root`
/// and under `root/unified` (the hybrid layout), with the controller's v2
/// files; a v1 line naming the controller (`4:memory:/path`) under
/// `root/<name>` with its v1 files. In each, the group and every ancestor up
/// to the hierarchy's root are read, deepest first ([`group_and_ancestors`]),
/// each with the files in the order given. Limit files that say `max`, v1's
/// `PAGE_COUNTER_MAX`, missing files and limits whose usage cannot be read
/// are skipped.
pub fn limits_in(own: &str, root: &Path, controller: &Controller) -> Vec<CgroupLimit> {
    let mut found = Vec::new();
    for line in own.lines() {
        let mut parts = line.splitn(3, ':');
        let (Some(_), Some(controllers), Some(path)) = (parts.next(), parts.next(), parts.next())
        else {
            continue;
        };
        let (mounts, files) = if controllers.is_empty() {
            (
                vec![root.to_path_buf(), root.join("unified")],
                &controller.v2,
            )
        } else if controllers.split(',').any(|c| c == controller.name) {
            (vec![root.join(&controller.name)], &controller.v1)
        } else {
            continue;
        };
        for mount in &mounts {
            for dir in group_and_ancestors(mount, path) {
                for f in files {
                    if let Some(l) = finite_limit(&dir, &f.limit, &f.usage) {
                        found.push(l);
                    }
                }
            }
        }
    }
    found
}

/// The group directory of `path` (as `/proc/self/cgroup` writes it) under
/// the hierarchy mounted at `mount`, and its ancestors up to the mount,
/// deepest first. When the group is not visible there (another cgroup
/// namespace, a container that sees its own group as the root, a path with
/// `..`), only the mount itself; nothing when the mount does not exist.
pub fn group_and_ancestors(mount: &Path, path: &str) -> Vec<PathBuf> {
    let rel = Path::new(path.trim_start_matches('/'));
    let plain = rel.components().all(|c| matches!(c, Component::Normal(_)));
    let mut dir = mount.join(rel);
    if !plain || !dir.is_dir() {
        return if mount.is_dir() {
            vec![mount.to_path_buf()]
        } else {
            Vec::new()
        };
    }
    let mut dirs = Vec::new();
    loop {
        dirs.push(dir.clone());
        if dir.as_path() == mount || !dir.pop() {
            break;
        }
    }
    dirs
}

/// The group a process's pages are charged to by one controller: where
/// the kernel counts the memory it faults (`hostpool doctor` says it of a
/// keeper, whose group is charged for the pool its engines lease).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ChargedGroup {
    /// The group as `/proc/PID/cgroup` writes it, e.g. `/system.slice/x`:
    /// under cgroup v2, the nearest of the process's group and its
    /// ancestors that has the controller (a group without it is charged to
    /// that ancestor).
    pub path: String,
    /// Its directory where this process sees it; `None` when it does not
    /// (another cgroup namespace, a container that sees its own group as
    /// the root).
    pub dir: Option<PathBuf>,
    /// The cgroup version of the hierarchy: 1 or 2.
    pub version: u8,
    /// Bytes charged to it now, from the controller's first usage file
    /// (`memory.usage_in_bytes`, `memory.current`); `None` when unreadable
    /// (cgroup v2's root has no `memory.current`) or the controller has none.
    pub usage: Option<u64>,
}

/// The group process `pid` is charged to by `controller`
/// ([`charged_group_in`] over `/proc/PID/cgroup` and [`ROOT`]). `None` when
/// the process is gone or no hierarchy has the controller.
pub fn charged_group(pid: u32, controller: &Controller) -> Option<ChargedGroup> {
    let own = fs::read_to_string(format!("/proc/{pid}/cgroup")).ok()?;
    charged_group_in(&own, Path::new(ROOT), controller)
}

/// The group the process whose `/proc/PID/cgroup` text is `own` is charged
/// to by `controller`, with its hierarchies mounted under `root`.
///
/// A v1 line naming the controller (`4:memory:/path`) is that group, under
/// `root/<name>`. Otherwise the v2 line (`0::/path`) is looked up under
/// `root` and `root/unified` (the hybrid layout), in the first whose
/// `cgroup.controllers` lists the controller: the group is the nearest of
/// the process's group and its ancestors that has it (the hierarchy's root
/// always does). A group this process cannot see keeps its path, without a
/// directory or usage.
pub fn charged_group_in(own: &str, root: &Path, controller: &Controller) -> Option<ChargedGroup> {
    let lines = || {
        own.lines().filter_map(|line| {
            let mut parts = line.splitn(3, ':');
            let (_, controllers, path) = (parts.next()?, parts.next()?, parts.next()?);
            Some((controllers, path))
        })
    };
    let usage = |dir: &Path, files: &[LimitFile]| {
        let f = files.first()?;
        fs::read_to_string(dir.join(&f.usage))
            .ok()?
            .trim()
            .parse()
            .ok()
    };
    if let Some((_, path)) = lines().find(|(c, _)| c.split(',').any(|c| c == controller.name)) {
        let dir = visible(&root.join(&controller.name), path);
        return Some(ChargedGroup {
            path: path.to_string(),
            usage: dir.as_deref().and_then(|d| usage(d, &controller.v1)),
            dir,
            version: 1,
        });
    }
    let (_, path) = lines().find(|(c, _)| c.is_empty())?;
    let has = |dir: &Path| {
        fs::read_to_string(dir.join("cgroup.controllers"))
            .is_ok_and(|c| c.split_whitespace().any(|c| c == controller.name))
    };
    let mount = [root.to_path_buf(), root.join("unified")]
        .into_iter()
        .find(|m| has(m))?;
    let Some(own_dir) = visible(&mount, path) else {
        return Some(ChargedGroup {
            path: path.to_string(),
            dir: None,
            version: 2,
            usage: None,
        });
    };
    // The nearest group with the controller; the mount (the root) has it.
    let dir = group_and_ancestors(&mount, path)
        .into_iter()
        .find(|d| d == &mount || has(d))
        .unwrap_or(own_dir);
    let rel = dir.strip_prefix(&mount).unwrap_or(Path::new(""));
    Some(ChargedGroup {
        path: format!("/{}", rel.display()),
        usage: usage(&dir, &controller.v2),
        dir: Some(dir),
        version: 2,
    })
}

/// The directory of `path` (as `/proc/PID/cgroup` writes it) under the
/// hierarchy mounted at `mount`, when this process sees it.
fn visible(mount: &Path, path: &str) -> Option<PathBuf> {
    let rel = Path::new(path.trim_start_matches('/'));
    let plain = rel.components().all(|c| matches!(c, Component::Normal(_)));
    let dir = mount.join(rel);
    (plain && dir.is_dir()).then_some(dir)
}

/// The limit file `limit` in `dir` when it holds a finite limit, with its
/// usage file. `None` for `max`, for v1's `PAGE_COUNTER_MAX`, and for
/// unreadable files.
fn finite_limit(dir: &Path, limit: &str, usage: &str) -> Option<CgroupLimit> {
    let path = dir.join(limit);
    // "max" does not parse: unlimited.
    let limit: u64 = fs::read_to_string(&path).ok()?.trim().parse().ok()?;
    if limit >= UNLIMITED {
        return None;
    }
    let usage: u64 = fs::read_to_string(dir.join(usage))
        .ok()?
        .trim()
        .parse()
        .ok()?;
    Some(CgroupLimit { path, limit, usage })
}

#[cfg(test)]
mod tests {
    use super::*;

    const M: u64 = 1 << 20;

    /// A fake cgroup root under the temp dir, removed on drop.
    struct Tree(PathBuf);

    impl Tree {
        fn new(name: &str) -> Tree {
            let dir = std::env::temp_dir().join(format!(
                "hostpool-cgroup-test-{}-{name}",
                std::process::id()
            ));
            let _ = fs::remove_dir_all(&dir);
            fs::create_dir_all(&dir).unwrap();
            Tree(dir)
        }

        /// A limit and its usage in one group (`""`: the root).
        fn set(&self, group: &str, f: &LimitFile, limit: &str, usage: u64) {
            let dir = self.0.join(group);
            fs::create_dir_all(&dir).unwrap();
            fs::write(dir.join(&f.limit), format!("{limit}\n")).unwrap();
            fs::write(dir.join(&f.usage), format!("{usage}\n")).unwrap();
        }
    }

    impl Drop for Tree {
        fn drop(&mut self) {
            let _ = fs::remove_dir_all(&self.0);
        }
    }

    fn memory() -> Controller {
        crate::memory::memory_controller()
    }

    fn hugetlb_2m() -> Controller {
        Controller {
            name: "hugetlb".into(),
            v2: vec![
                LimitFile::new("hugetlb.2MB.max", "hugetlb.2MB.current"),
                LimitFile::new("hugetlb.2MB.rsvd.max", "hugetlb.2MB.rsvd.current"),
            ],
            v1: vec![LimitFile::new(
                "hugetlb.2MB.limit_in_bytes",
                "hugetlb.2MB.usage_in_bytes",
            )],
        }
    }

    /// A nested group whose own limit is loose (or unlimited) and whose
    /// parent's is tight: the parent's binds, whichever version and
    /// controller.
    #[test]
    fn the_parent_of_a_nested_group_binds_when_its_limit_is_tighter() {
        for c in [memory(), hugetlb_2m()] {
            for v1 in [false, true] {
                let t = Tree::new(&format!("nested-{}-{v1}", c.name));
                let (own, base, f) = if v1 {
                    (
                        format!("7:{}:/pod/ctr\n0::/\n", c.name),
                        c.name.clone(),
                        &c.v1[0],
                    )
                } else {
                    ("0::/pod/ctr\n".to_string(), String::new(), &c.v2[0])
                };
                let group = |g: &str| {
                    if base.is_empty() {
                        g.to_string()
                    } else {
                        format!("{base}/{g}")
                    }
                };
                // Own group: 1 GiB, 24 MiB used; parent: 64 MiB, 40 used;
                // the parent's parent: unlimited.
                t.set(&group("pod/ctr"), f, &(1024 * M).to_string(), 24 * M);
                t.set(&group("pod"), f, &(64 * M).to_string(), 40 * M);
                let unlimited = if v1 { "9223372036854771712" } else { "max" };
                t.set(&group(""), f, unlimited, 0);
                let all = limits_in(&own, &t.0, &c);
                assert_eq!(all.len(), 2, "{} v1={v1}: {all:?}", c.name);
                assert_eq!(all[0].group(), t.0.join(group("pod/ctr")));
                let tight = tightest_in(&own, &t.0, &c).unwrap();
                assert_eq!(
                    tight.path,
                    t.0.join(group("pod")).join(&f.limit),
                    "{} v1={v1}",
                    c.name
                );
                assert_eq!(
                    (tight.limit, tight.usage, tight.free()),
                    (64 * M, 40 * M, 24 * M)
                );
                assert_eq!(tight.file_name(), f.limit);
                // The own group unlimited: the parent still binds.
                t.set(&group("pod/ctr"), f, unlimited, 0);
                let tight = tightest_in(&own, &t.0, &c).unwrap();
                assert_eq!(tight.group(), t.0.join(group("pod")));
                // A v1 line for another controller, or a v2 tree read for v1,
                // finds nothing.
                let other = if v1 {
                    "7:cpu:/pod/ctr\n".to_string()
                } else {
                    format!("7:{}:/pod/ctr\n", c.name)
                };
                assert_eq!(limits_in(&other, &t.0, &c), Vec::new(), "{other}");
            }
        }
    }

    #[test]
    fn invisible_groups_read_the_mount_root_and_unified_is_found() {
        let t = Tree::new("invisible");
        let c = memory();
        let f = &c.v2[0];
        t.set("", f, &(8 * M).to_string(), M);
        // Another namespace, a path with `..`: the mount root only.
        for own in ["0::/elsewhere\n", "0::/../x\n"] {
            let l = tightest_in(own, &t.0, &c).unwrap();
            assert_eq!(l.path, t.0.join("memory.max"), "{own}");
        }
        assert_eq!(
            group_and_ancestors(&t.0.join("none"), "/"),
            Vec::<PathBuf>::new()
        );
        // A limit without a readable usage is skipped.
        fs::remove_file(t.0.join("memory.current")).unwrap();
        assert_eq!(tightest_in("0::/\n", &t.0, &c), None);
        // The hybrid layout: v2 under unified/.
        t.set("unified/svc", f, &(2 * M).to_string(), 0);
        let l = tightest_in("0::/svc\n", &t.0, &c).unwrap();
        assert_eq!(l.path, t.0.join("unified/svc/memory.max"));
    }

    #[test]
    fn equal_room_keeps_the_deepest_group_and_every_file_is_read() {
        let t = Tree::new("ties");
        let c = hugetlb_2m();
        t.set("a/b", &c.v2[0], &(10 * M).to_string(), 2 * M);
        t.set("a", &c.v2[0], &(9 * M).to_string(), M);
        t.set("a/b", &c.v2[1], &(20 * M).to_string(), 0);
        let all = limits_in("0::/a/b\n", &t.0, &c);
        assert_eq!(all.len(), 3, "{all:?}");
        let l = tightest_in("0::/a/b\n", &t.0, &c).unwrap();
        assert_eq!(l.path, t.0.join("a/b/hugetlb.2MB.max"));
    }

    /// The group a process is charged to: its v1 group with the usage
    /// read; under v2 the nearest group with the controller (an own group
    /// without it is charged to its parent), found under `unified/` in the
    /// hybrid layout; a group not visible here keeps its path alone.
    #[test]
    fn the_charged_group_is_the_v1_group_or_the_nearest_v2_group_with_the_controller() {
        let t = Tree::new("charged");
        let c = memory();
        t.set("memory/pod/ctr", &c.v1[0], "9223372036854771712", 5 * M);
        let v1 = charged_group_in("4:memory:/pod/ctr\n0::/\n", &t.0, &c).unwrap();
        assert_eq!(v1.path, "/pod/ctr");
        assert_eq!(v1.dir, Some(t.0.join("memory/pod/ctr")));
        assert_eq!((v1.version, v1.usage), (1, Some(5 * M)));
        // v2 at unified/: the own group lacks the controller, its parent has it.
        let u = t.0.join("unified");
        fs::create_dir_all(u.join("svc/inner")).unwrap();
        fs::write(u.join("cgroup.controllers"), "cpu memory hugetlb\n").unwrap();
        fs::write(u.join("svc/cgroup.controllers"), "memory\n").unwrap();
        fs::write(u.join("svc/inner/cgroup.controllers"), "cpu\n").unwrap();
        fs::write(u.join("svc/memory.current"), format!("{}\n", 3 * M)).unwrap();
        let v2 = charged_group_in("1:cpu:/\n0::/svc/inner\n", &t.0, &c).unwrap();
        assert_eq!(v2.path, "/svc");
        assert_eq!(v2.dir, Some(u.join("svc")));
        assert_eq!((v2.version, v2.usage), (2, Some(3 * M)));
        // Nothing below the root has it: the root, without a usage file.
        fs::write(u.join("svc/cgroup.controllers"), "\n").unwrap();
        let root = charged_group_in("0::/svc/inner\n", &t.0, &c).unwrap();
        assert_eq!((root.path.as_str(), root.usage), ("/", None));
        // Another namespace: the path alone.
        let far = charged_group_in("0::/../elsewhere\n", &t.0, &c).unwrap();
        assert_eq!(
            (far.path.as_str(), far.dir.clone()),
            ("/../elsewhere", None)
        );
        // No hierarchy with the controller.
        assert_eq!(charged_group_in("3:cpu:/x\n", &t.0, &c), None);
    }

    /// This process's own groups, read for real: the limits found are
    /// those of the groups `/proc/self/cgroup` names, each as its file says,
    /// and the tightest is the one with the least room of them.
    #[test]
    fn this_process_reads_the_limits_of_its_own_groups() {
        let own = fs::read_to_string(SELF_CGROUP).expect("every Linux process has one");
        let paths = |ls: &[CgroupLimit]| {
            ls.iter()
                .map(|l| (l.path.clone(), l.limit))
                .collect::<Vec<_>>()
        };
        let all = limits(&memory());
        assert_eq!(
            paths(&all),
            paths(&limits_in(&own, Path::new(ROOT), &memory())),
            "{own}"
        );
        for l in &all {
            assert!(l.path.starts_with(ROOT), "{l:?}");
            let text = fs::read_to_string(&l.path).unwrap();
            assert_eq!(text.trim().parse::<u64>().ok(), Some(l.limit), "{l:?}");
            assert!(l.limit < UNLIMITED, "unlimited is not a limit: {l:?}");
        }
        let tight = tightest(&memory());
        assert_eq!(tight.is_some(), !all.is_empty());
        if let Some(t) = tight {
            assert!(all.iter().any(|l| l.path == t.path), "{t:?} of {all:?}");
        }
    }
}
