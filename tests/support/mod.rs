//! Helpers shared by the `hostpool` package's integration tests (each test
//! binary uses a part of them).
#![allow(dead_code)]

pub mod cgroup;
pub mod procs;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// A directory of the test's own, removed on drop.
pub struct TempDir(pub PathBuf);

impl TempDir {
    /// `/tmp/hostpool-test-<pid>-<tag>`, fresh.
    pub fn new(tag: &str) -> TempDir {
        let dir = std::env::temp_dir().join(format!("hostpool-test-{}-{tag}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        TempDir(dir)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A directory with `libcuda.so.1` and `libcuda.so` linked to the fake
/// driver (fake-cuda is a dev-dependency of hostpool, so cargo built it next
/// to the test binaries), for `LD_LIBRARY_PATH`.
pub fn fake_driver_dir(tag: &str) -> TempDir {
    let exe = std::env::current_exe().unwrap();
    let deps = exe.parent().unwrap();
    let fake = [deps.to_path_buf(), deps.join("deps")]
        .into_iter()
        .map(|d| d.join("libfake_cuda.so"))
        .find(|p| p.exists())
        .expect("libfake_cuda.so is built because fake-cuda is a dev-dependency of hostpool");
    let dir = TempDir::new(&format!("fakecuda-{tag}"));
    for name in ["libcuda.so.1", "libcuda.so"] {
        std::os::unix::fs::symlink(&fake, dir.0.join(name)).unwrap();
    }
    dir
}

/// Whether a real CUDA driver is installed.
pub fn real_driver_present() -> bool {
    [
        "/usr/lib/x86_64-linux-gnu/libcuda.so.1",
        "/usr/lib64/libcuda.so.1",
        "/usr/local/nvidia/lib64/libcuda.so.1",
        "/usr/lib/aarch64-linux-gnu/libcuda.so.1",
    ]
    .iter()
    .any(|p| Path::new(p).exists())
}

/// Run the shipped `hostpool` with `args` and extra environment `env`
/// (`RUST_LOG` removed, so logs do not change the output).
pub fn run_hostpool(args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut c = Command::new(env!("CARGO_BIN_EXE_hostpool"));
    c.args(args).env_remove("RUST_LOG");
    for (k, v) in env {
        c.env(k, v);
    }
    c.output().unwrap()
}

/// A command's stdout then stderr, for assertion messages and matching.
pub fn output_text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// `pieces` (`(offset in the pool, len)`, in order: pin chunks, registered
/// regions) tile a pool of `size` bytes from 0, and every interior boundary
/// is a multiple of `unit` (lcm(block, page)), of `block` and of the 4 KiB
/// page. `what` says which run it is in the messages.
pub fn assert_tiles_on_unit(pieces: &[(u64, u64)], size: u64, unit: u64, block: u64, what: &str) {
    assert!(!pieces.is_empty(), "{what}: nothing");
    assert_eq!(pieces[0].0, 0, "{what}: starts at 0: {pieces:?}");
    for w in pieces.windows(2) {
        assert_eq!(w[0].0 + w[0].1, w[1].0, "{what}: contiguous: {pieces:?}");
    }
    let (last, len) = *pieces.last().unwrap();
    assert_eq!(last + len, size, "{what}: the whole pool: {pieces:?}");
    for &(offset, _) in &pieces[1..] {
        assert_eq!(
            offset % unit,
            0,
            "{what}: boundary {offset} is not a multiple of lcm(block, page) = {unit}: {pieces:?}"
        );
        assert_eq!(
            offset % block,
            0,
            "{what}: boundary {offset} splits a block"
        );
        assert_eq!(
            offset % 4096,
            0,
            "{what}: boundary {offset} is off the page"
        );
    }
}
