//! Child cgroups of this process's own, for tests that run `hostpool` under
//! a real controller and read what the kernel charges: made in whichever
//! hierarchy has the controller (its own under cgroup v1, the unified one
//! under v2, delegating it there when it must), and removed on drop, any
//! process still in one moved back to the parent first.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

/// Where cgroup hierarchies are mounted.
const ROOT: &str = "/sys/fs/cgroup";

/// This process's group in the hierarchy with controller `name` (v1), or
/// in the unified one (`0::`, v2), as `/proc/self/cgroup` writes it.
pub fn own_group(v2: bool, name: &str) -> Option<String> {
    let text = std::fs::read_to_string("/proc/self/cgroup").ok()?;
    text.lines().find_map(|l| {
        let mut parts = l.splitn(3, ':');
        let (id, controllers, path) = (parts.next()?, parts.next()?, parts.next()?);
        let hit = if v2 {
            id == "0" && controllers.is_empty()
        } else {
            controllers.split(',').any(|c| c == name)
        };
        hit.then(|| path.to_string())
    })
}

/// This process's own group in the hierarchy of one controller: where the
/// tests' child groups are made. Under v2, the controller is delegated to
/// the children (`+NAME` in `cgroup.subtree_control`) if it was not, and
/// that is undone on drop, after the children (which borrow it) are gone.
pub struct Parent {
    /// The group's directory.
    pub dir: PathBuf,
    /// The controller.
    pub controller: String,
    /// Whether it is the unified hierarchy (v2).
    pub v2: bool,
    /// Whether this delegated the controller, to undo.
    delegated: bool,
}

impl Parent {
    /// This process's group in the hierarchy that has `controller`: v1's
    /// own (`/sys/fs/cgroup/<controller>`), else the unified hierarchy
    /// (`/sys/fs/cgroup/unified` or `/sys/fs/cgroup`) where it is available.
    ///
    /// # Errors
    /// Why there is none: no hierarchy has the controller, the group is not
    /// visible here, or v2 cannot delegate it (the group has processes of
    /// its own and is not the root).
    pub fn find(controller: &str) -> Result<Parent, String> {
        let v1 = Path::new(ROOT).join(controller);
        if let Some(own) = own_group(false, controller) {
            let dir = v1.join(own.trim_start_matches('/'));
            return if dir.is_dir() {
                Ok(Parent {
                    dir,
                    controller: controller.to_string(),
                    v2: false,
                    delegated: false,
                })
            } else {
                Err(format!(
                    "this process's {controller} group {own} is not visible under {}",
                    v1.display()
                ))
            };
        }
        let lists = |file: &Path| {
            std::fs::read_to_string(file)
                .is_ok_and(|c| c.split_whitespace().any(|x| x == controller))
        };
        let Some(mount) = [Path::new(ROOT).join("unified"), PathBuf::from(ROOT)]
            .into_iter()
            .find(|m| lists(&m.join("cgroup.controllers")))
        else {
            return Err(format!(
                "no cgroup hierarchy here has the {controller} controller (neither v1's {} nor \
                 v2's cgroup.controllers)",
                v1.display()
            ));
        };
        let own = own_group(true, "").ok_or("this process is in no cgroup v2 group")?;
        let dir = mount.join(own.trim_start_matches('/'));
        if !dir.is_dir() {
            return Err(format!(
                "this process's group {own} is not visible under {}",
                mount.display()
            ));
        }
        let control = dir.join("cgroup.subtree_control");
        let delegated = !lists(&control);
        if delegated {
            let _ = std::fs::write(&control, format!("+{controller}"));
            if !lists(&control) {
                return Err(format!(
                    "{} does not delegate the {controller} controller, and cannot (a group with \
                     processes of its own below the root)",
                    dir.display()
                ));
            }
        }
        Ok(Parent {
            dir,
            controller: controller.to_string(),
            v2: true,
            delegated,
        })
    }

    /// A child group of its own, `hostpool-test-<pid>-<tag>`.
    pub fn child(&self, tag: &str) -> Group<'_> {
        let dir = self
            .dir
            .join(format!("hostpool-test-{}-{tag}", std::process::id()));
        std::fs::create_dir(&dir).unwrap_or_else(|e| panic!("mkdir {}: {e}", dir.display()));
        Group { dir, parent: self }
    }
}

impl Drop for Parent {
    fn drop(&mut self) {
        if self.delegated {
            let control = self.dir.join("cgroup.subtree_control");
            if let Err(e) = std::fs::write(&control, format!("-{}", self.controller)) {
                eprintln!(
                    "could not undo +{} in {}: {e}",
                    self.controller,
                    control.display()
                );
            }
        }
    }
}

/// A child group; removed on drop, after moving any process left in it to
/// its parent.
pub struct Group<'a> {
    /// Its directory.
    pub dir: PathBuf,
    parent: &'a Parent,
}

impl Group<'_> {
    /// `cmd` (its program, arguments and environment, removals included),
    /// run inside this group: a shell moves itself in, then execs it, so the
    /// process is in the group before it allocates anything, under its own
    /// pid.
    pub fn run_in(&self, cmd: &Command) -> Command {
        let mut sh = Command::new("sh");
        sh.arg("-c")
            .arg(r#"echo $$ > "$0/cgroup.procs" && exec "$@""#)
            .arg(&self.dir)
            .arg(cmd.get_program())
            .args(cmd.get_args());
        for (k, v) in cmd.get_envs() {
            match v {
                Some(v) => sh.env(k, v),
                None => sh.env_remove(k),
            };
        }
        sh
    }

    /// A number file of the group (`memory.current`, `hugetlb.2MB.current`).
    pub fn read(&self, file: &str) -> Option<u64> {
        std::fs::read_to_string(self.dir.join(file))
            .ok()?
            .trim()
            .parse()
            .ok()
    }

    /// Bytes charged to the group's memory: `memory.current` (v2) or
    /// `memory.usage_in_bytes` (v1).
    pub fn memory_usage(&self) -> u64 {
        let file = if self.parent.v2 {
            "memory.current"
        } else {
            "memory.usage_in_bytes"
        };
        self.read(file)
            .unwrap_or_else(|| panic!("{} has no {file}", self.dir.display()))
    }

    /// `memory.stat`, line by line (`shmem`, `rss` or `anon`, `cache` or
    /// `file`, ...).
    pub fn memory_stat(&self) -> BTreeMap<String, u64> {
        std::fs::read_to_string(self.dir.join("memory.stat"))
            .unwrap_or_default()
            .lines()
            .filter_map(|l| {
                let (k, v) = l.split_once(' ')?;
                Some((k.to_string(), v.trim().parse().ok()?))
            })
            .collect()
    }

    /// The processes in it.
    pub fn procs(&self) -> Vec<u32> {
        std::fs::read_to_string(self.dir.join("cgroup.procs"))
            .unwrap_or_default()
            .lines()
            .filter_map(|l| l.trim().parse().ok())
            .collect()
    }
}

impl Drop for Group<'_> {
    fn drop(&mut self) {
        // A test that failed may leave processes here (being killed): move
        // them out, so that the directory can go.
        for pid in self.procs() {
            let _ = std::fs::write(self.parent.dir.join("cgroup.procs"), pid.to_string());
        }
        // The kernel may take a moment after the last process left.
        let removed = super::procs::within(Duration::from_secs(5), || {
            std::fs::remove_dir(&self.dir).is_ok() || !self.dir.exists()
        });
        if !removed {
            eprintln!("could not remove {}", self.dir.display());
        }
    }
}
