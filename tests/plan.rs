//! The plan decides where a pool's memory comes from, typed ([`Source`]),
//! with the built-in backings: a private pool's own memory, a share of a
//! pool the ranks of one engine create, a lease of a kept pool (with its
//! fallback as a plan of its own, and no backing planned for the lease
//! itself), and a keeper's kept files. The build is given its handoff and
//! says so when it has none.

use pool_core::{
    BuildOptions, ByteSize, Error, KeeperFallback, LeaseConfig, Pool, PoolConfig, PoolPlan, Quiet,
    Rendezvous, SharingConfig, Source,
};

// Link the facade (and with it the built-in plugins) into this test binary.
use hostpool as _;

const MIB: u64 = 1 << 20;

fn sharing(name: &str) -> SharingConfig {
    SharingConfig {
        name: name.into(),
        world: 2,
        rank: 1,
        attach_timeout_secs: 3.0,
        barrier_timeout_secs: 7.0,
        rendezvous: Rendezvous::Socket,
        control_dir: None,
    }
}

fn config(size: u64) -> PoolConfig {
    PoolConfig {
        size: ByteSize(size),
        ..PoolConfig::default()
    }
}

#[test]
fn the_plan_decides_where_memory_comes_from_for_every_source() {
    // A private pool: the backing's own memory.
    let plan = PoolPlan::new(config(8 * MIB)).unwrap();
    let Source::Own(memory) = plan.source() else {
        panic!("a private pool is its own: {:?}", plan.source());
    };
    assert_eq!(memory.plan.backing, "anon");
    assert!(plan.ranks().is_none());

    // A shared pool: auto picks memory other ranks can open; this rank
    // faults its own shard.
    let name = format!("plan-shared-{}", std::process::id());
    let shared = PoolConfig {
        sharing: Some(sharing(&name)),
        ..config(8 * MIB)
    };
    let plan = PoolPlan::new(shared.clone()).unwrap();
    let Source::Shared(share) = plan.source() else {
        panic!("a shared pool is shared: {:?}", plan.source());
    };
    assert_eq!(share.sharing, sharing(&name));
    assert_eq!(share.files.len(), share.memory.plan.segments.len().max(1));
    assert_ne!(share.memory.plan.backing, "anon");
    assert_eq!(
        plan.prefault().extent.offset + plan.prefault().extent.len,
        8 * MIB
    );

    // Memory of a backing's own cannot be shared.
    let e = PoolPlan::new(PoolConfig {
        backing: "anon".into(),
        ..shared.clone()
    })
    .unwrap_err();
    assert!(
        e.is_usage() && e.to_string().contains("backing anon cannot be shared"),
        "{e}"
    );

    // A lease: what to ask the keeper, typed; no backing of its own.
    let lease = LeaseConfig {
        tag: Some("model-x".into()),
        size: Some(ByteSize(8 * MIB)),
        ..LeaseConfig::of("kv0")
    };
    let leased = PoolConfig {
        lease: Some(lease.clone()),
        page_size: Some(ByteSize(2 * MIB)),
        ..shared.clone()
    };
    let plan = PoolPlan::new(leased.clone()).unwrap();
    let Source::Leased(l) = plan.source() else {
        panic!("a keeper's pool is leased: {:?}", plan.source());
    };
    assert_eq!(l.keeper, "kv0");
    assert_eq!(l.ranks.as_ref(), Some(&sharing(&name)));
    assert_eq!(l.engine(), name);
    assert_eq!(l.tag.as_deref(), Some("model-x"));
    assert_eq!((l.size, l.page), (Some(8 * MIB), Some(2 * MIB)));
    // The ranks' timeouts, unless the lease names its own.
    assert_eq!((l.attach_timeout_secs, l.barrier_timeout_secs), (3.0, 7.0));
    assert!(l.fallback.is_none());
    assert!(plan.backing_plan().is_none(), "a lease plans no backing");
    let report = plan.report();
    assert_eq!(report.backing, "keeper");
    assert_eq!(report.keeper.as_deref(), Some("kv0"));
    assert!(
        report.explain[0].contains("leased from keeper `kv0`"),
        "{report:?}"
    );

    // With fallback = build, the fallback is a plan of its own: the pool
    // without its lease.
    let plan = PoolPlan::new(PoolConfig {
        lease: Some(LeaseConfig {
            fallback: KeeperFallback::Build,
            attach_timeout_secs: Some(1.5),
            ..lease.clone()
        }),
        ..shared.clone()
    })
    .unwrap();
    let Source::Leased(l) = plan.source() else {
        panic!("leased");
    };
    assert_eq!(l.attach_timeout_secs, 1.5);
    let fallback = l.fallback.as_deref().expect("a fallback plan");
    assert!(matches!(fallback.source(), Source::Shared(_)));
    assert!(fallback.config().lease.is_none());

    // A companion maps its engine's lease.
    let plan = PoolPlan::new(PoolConfig {
        lease: Some(LeaseConfig {
            companion_of: Some("vllm-e0".into()),
            ..LeaseConfig::of("kv0")
        }),
        ..config(8 * MIB)
    })
    .unwrap();
    let Source::Leased(l) = plan.source() else {
        panic!("leased");
    };
    assert_eq!((l.engine(), l.ranks.as_ref()), ("vllm-e0", None));

    // A keeper's pool: files it can hand over, planned as what they are.
    let plan = PoolPlan::kept(config(8 * MIB)).unwrap();
    let Source::Kept(memory) = plan.source() else {
        panic!("a kept pool is kept: {:?}", plan.source());
    };
    assert!(matches!(
        memory.plan.source,
        pool_core::plugin::MemorySource::Files(_)
    ));
    assert!(plan.ranks().is_none(), "a kept pool is no one-rank share");
    for (bad, says) in [
        (
            PoolConfig {
                backing: "anon".into(),
                ..config(8 * MIB)
            },
            "cannot hand to another process",
        ),
        (shared.clone(), "drop `sharing` and `[lease]`"),
        (leased.clone(), "drop `sharing` and `[lease]`"),
    ] {
        let e = PoolPlan::kept(bad).unwrap_err();
        assert!(e.is_usage() && e.to_string().contains(says), "{e}");
    }
    // A kept plan is the keeper's to build.
    let e = Pool::build(&plan, &Quiet).unwrap_err();
    assert!(e.to_string().contains("built by its keeper"), "{e}");
}

/// A build that shares or leases memory is given its handoff: without one
/// it fails before mapping anything, saying how to give one.
#[test]
fn a_shared_or_leased_build_without_a_handoff_says_how_to_give_one() {
    let name = format!("plan-nohandoff-{}", std::process::id());
    let shared = PoolConfig {
        sharing: Some(sharing(&name)),
        ..config(8 * MIB)
    };
    let leased = PoolConfig {
        lease: Some(LeaseConfig::of(&name)),
        ..config(8 * MIB)
    };
    for (config, what) in [
        (shared, "a shared pool"),
        (leased, "a lease of a kept pool"),
    ] {
        let plan = PoolPlan::new(config).unwrap();
        let e = Pool::build_with_options(&plan, &Quiet, &BuildOptions::new()).unwrap_err();
        let msg = e.to_string();
        assert!(matches!(e, Error::Config { .. }), "{e:?}");
        assert!(
            msg.contains(&format!("{what} needs memory handed between processes"))
                && msg.contains("BuildOptions::handoff"),
            "{msg}"
        );
    }
    let left: Vec<_> = std::fs::read_dir("/dev/shm")
        .unwrap()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().contains(&name))
        .collect();
    assert!(left.is_empty(), "{left:?}");
}

/// A joiner whose `huge_pages = "prefer"` could have chosen the other page
/// size has that plan ready: it never plans again at build time.
#[test]
fn a_prefer_joiner_has_the_other_page_size_planned() {
    let sizes = std::fs::read_dir("/sys/kernel/mm/hugepages").map_or(0, Iterator::count);
    if sizes == 0 {
        eprintln!("skip: this kernel has no huge pages at all");
        return;
    }
    let name = format!("plan-prefer-{}", std::process::id());
    let plan = PoolPlan::new(PoolConfig {
        sharing: Some(sharing(&name)),
        huge_pages: Some(pool_core::HugePages::Prefer),
        ..config(8 * MIB)
    })
    .unwrap();
    let Source::Shared(share) = plan.source() else {
        panic!("shared");
    };
    let ours = share.memory.plan.size.page().get();
    let theirs = share
        .creators_pages
        .as_deref()
        .expect("the other page size is planned");
    let other = theirs.backing_plan().unwrap().size.page().get();
    assert_ne!(ours, other);
    let base = pool_core::base_page_size() as u64;
    assert!(ours == base || other == base, "{ours} {other}");
}
