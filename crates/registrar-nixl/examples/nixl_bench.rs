//! NIXL loopback bandwidth from hostpool pools against `memcpy` of the same
//! size in the same run, and registration time per GiB.
//!
//! Two agents in this process, each with a pool of its own (the same
//! backing), exchange `--size` bytes: WRITE (A's pool into B's) and READ
//! (B's into A's), `--repeat` times each, interleaved with a `memcpy` of the
//! same size between two prefaulted buffers. Prints one JSON line: medians
//! in GB/s, their ratios to memcpy, and `register_s_per_gib` (one
//! `nixl_capi_register_mem` of the whole pool).
//!
//! ```sh
//! UCX_NET_DEVICES=lo nixl_bench [--size 1GiB] [--repeat 5] [--dir /mnt/huge-2M] [--peer-dir DIR]
//!
//! `--peer-dir` puts the peer's pool elsewhere (default: where `--dir` is),
//! for a host with one 1 GiB page.
//! ```

use std::time::{Duration, Instant};

use pool_core::{ByteSize, Extent, Pool, PoolConfig, PoolPlan, Quiet};
use registrar_nixl::{Agent, NixlOptions, Op};

use backing_anon as _;
use backing_hugetlbfs as _;

fn main() {
    let code = match run() {
        Ok(line) => {
            println!("{line}");
            0
        }
        Err(e) => {
            eprintln!("nixl_bench: {e}");
            1
        }
    };
    registrar_nixl::exit_now(code);
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn run() -> Result<String, Box<dyn std::error::Error>> {
    let mut size = ByteSize::gib(1);
    let mut repeat = 5usize;
    let mut dir = None;
    let mut peer_dir = None;
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--size" => size = args.next().ok_or("--size SIZE")?.parse()?,
            "--repeat" => repeat = args.next().ok_or("--repeat N")?.parse()?,
            "--dir" => dir = Some(std::path::PathBuf::from(args.next().ok_or("--dir DIR")?)),
            "--peer-dir" => {
                peer_dir = Some(std::path::PathBuf::from(
                    args.next().ok_or("--peer-dir DIR")?,
                ))
            }
            other => return Err(format!("unknown argument {other}").into()),
        }
    }
    let peer_dir = peer_dir.or_else(|| dir.clone());
    let plan = PoolPlan::new(PoolConfig {
        size,
        dir,
        ..PoolConfig::default()
    })?;
    let peer_plan = PoolPlan::new(PoolConfig {
        size,
        dir: peer_dir,
        ..PoolConfig::default()
    })?;
    let (a_pool, b_pool) = (
        Pool::build(&plan, &Quiet)?,
        Pool::build(&peer_plan, &Quiet)?,
    );
    let (a_region, b_region) = (
        a_pool.region().ok_or("no region")?,
        b_pool.region().ok_or("no region")?,
    );
    let (api, _) = registrar_nixl::load(&NixlOptions::default())?;
    let a = Agent::new(api, "bench-a", None, false, "UCX", &[])?;
    // The target progresses on NIXL's thread: nothing else polls it here.
    let b = Agent::new(api, "bench-b", None, true, "UCX", &[])?;
    let whole = Extent {
        offset: 0,
        len: a_region.mapped_len(),
    };
    let t = Instant::now();
    let a_reg = a.register(&a_region, whole)?;
    let register_s = t.elapsed().as_secs_f64();
    let b_reg = b.register(&b_region, whole)?;
    let peer = a.load_remote(&b.local_metadata()?)?;
    let len = whole.len;
    let bytes = usize::try_from(len)?;
    let src = vec![0x5au8; bytes];
    let mut dst = vec![0u8; bytes];
    let (mut write, mut read, mut copy) = (Vec::new(), Vec::new(), Vec::new());
    let timeout = Duration::from_secs(120);
    let gb_s = |f: &mut dyn FnMut() -> Result<(), registrar_nixl::Failure>| {
        let t = Instant::now();
        f().map(|()| len as f64 / t.elapsed().as_secs_f64() / 1e9)
    };
    let remote = b_reg.addr() as u64;
    for _ in 0..repeat {
        write.push(gb_s(&mut || {
            a.transfer(Op::Write, &a_reg, whole, &peer, remote, None, timeout)
        })?);
        copy.push(gb_s(&mut || {
            dst.copy_from_slice(&src);
            Ok(())
        })?);
        read.push(gb_s(&mut || {
            a.transfer(Op::Read, &a_reg, whole, &peer, remote, None, timeout)
        })?);
    }
    std::hint::black_box(&dst);
    let (w, r, c) = (median(write), median(read), median(copy));
    drop((a_reg, b_reg));
    a.forget_remote(&peer)?;
    Ok(format!(
        "{{\"bytes\": {len}, \"page_size\": {}, \"repeat\": {repeat}, \"write_gb_s\": {w:.3}, \"read_gb_s\": {r:.3}, \
         \"memcpy_gb_s\": {c:.3}, \"write_vs_memcpy\": {:.3}, \"read_vs_memcpy\": {:.3}, \"register_s_per_gib\": {:.5}}}",
        a_region.page().get(),
        w / c,
        r / c,
        register_s / (len as f64 / f64::from(1u32 << 30)),
    ))
}
