//! Helpers shared by the `hostpool` package's integration tests (each test
//! binary uses a part of them).
#![allow(dead_code)]

use std::path::{Path, PathBuf};

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
