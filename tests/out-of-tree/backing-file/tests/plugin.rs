//! What the record of this out-of-tree backing adds to pool-core without
//! pool-core naming it: a claim under `backing = "auto"` for directories on
//! disk filesystems, and findings for `hostpool doctor`.

use std::path::{Path, PathBuf};

use hostpool_example_backing_file::NAME;
use pool_core::plugin::BackingPlugin;
use pool_core::plugin::{DoctorContext, PoolFacts, lookup};
use pool_core::{ByteSize, PoolConfig, PoolPlan};

/// A directory on the disk that holds the build, removed on drop.
struct DiskDir(PathBuf);

impl DiskDir {
    fn new(tag: &str) -> DiskDir {
        let d = Path::new(env!("CARGO_TARGET_TMPDIR"))
            .join(format!("file-plugin-{tag}-{}", std::process::id()));
        std::fs::create_dir_all(&d).unwrap();
        DiskDir(d)
    }
}

impl Drop for DiskDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn on_a_disk_filesystem(dir: &Path) -> bool {
    let magic = pool_core::host::fs::statfs_info(dir).unwrap().magic;
    [0xef53, 0x5846_5342, 0x9123_683e, 0x794c_7630].contains(&magic)
}

#[test]
fn auto_on_a_disk_directory_selects_this_out_of_tree_backing() {
    let dir = DiskDir::new("auto");
    if !on_a_disk_filesystem(&dir.0) {
        eprintln!("skip: the target dir is not on ext4, xfs, btrfs or overlayfs");
        return;
    }
    let plan = PoolPlan::new(PoolConfig {
        size: ByteSize::mib(4),
        backing: "auto".into(),
        dir: Some(dir.0.clone()),
        ..PoolConfig::default()
    })
    .unwrap();
    assert_eq!(plan.backing_plan().unwrap().backing, NAME);
    let why = &plan.report().explain[0];
    assert!(
        why.contains("backing = auto") && why.contains("out-of-tree"),
        "{why}"
    );
    // tmpfs is not its to claim: no linked backing serves it here.
    let e = PoolPlan::new(PoolConfig {
        backing: "auto".into(),
        dir: Some("/dev/shm".into()),
        ..PoolConfig::default()
    })
    .unwrap_err();
    assert!(
        e.to_string()
            .contains("neither ext2/3/4, xfs, btrfs nor overlayfs"),
        "{e}"
    );
    assert_eq!(e.exit_code(), 2);
}

#[test]
fn its_doctor_hook_reports_the_pool_dir_and_the_room_there() {
    let record = lookup::<BackingPlugin>(NAME).unwrap();
    let hook = record.doctor.expect("the record carries a doctor hook");
    assert!(
        hook(&DoctorContext::default()).is_empty(),
        "no pool: nothing to say"
    );
    let dir = DiskDir::new("doctor");
    let config = PoolConfig {
        size: ByteSize::mib(4),
        backing: NAME.into(),
        dir: Some(dir.0.clone()),
        ..PoolConfig::default()
    };
    fn facts(config: &PoolConfig) -> DoctorContext<'_> {
        DoctorContext {
            pool: Some(PoolFacts {
                config,
                page_size: 4096,
                mapped_bytes: 4 << 20,
                prefault_bytes: 4 << 20,
            }),
        }
    }
    let found = hook(&facts(&config));
    assert_eq!(found.len(), 1, "{found:?}");
    assert_eq!(found[0].area, "file");
    assert_eq!(found[0].item, dir.0.display().to_string());
    assert!(found[0].value.contains("free"), "{found:?}");
    assert_eq!(found[0].verdict, pool_core::plugin::Level::Ok, "{found:?}");
    let huge = PoolConfig {
        size: ByteSize(1 << 55),
        ..config.clone()
    };
    assert_eq!(
        hook(&facts(&huge))[0].verdict,
        pool_core::plugin::Level::Fail
    );
    let missing = PoolConfig {
        dir: Some("/nonexistent/dir".into()),
        ..config.clone()
    };
    let f = &hook(&facts(&missing))[0];
    assert!(f.value.contains("cannot be examined"), "{f:?}");
}
