//! A NIXL peer of a hostpool pool, as a remote engine would be: loads the
//! pool's agent metadata (`hostpool alloc --register nixl --hold
//! --nixl-metadata-out FILE`), WRITEs a pattern into the pool and READs it
//! back into a pool of its own, checks every byte, and notifies the pool's
//! agent. Prints one JSON line with the result and the bandwidths.
//!
//! ```sh
//! nixl_peer METADATA_FILE REMOTE_ADDR LEN [NOTIF]
//! ```
//!
//! The test `tests/nixl.rs` runs it against `hostpool alloc` over loopback
//! (`UCX_NET_DEVICES=lo`).

use std::io::Write;
use std::time::{Duration, Instant};

use pool_core::{ByteSize, Extent, Pool, PoolConfig, PoolPlan, Quiet};
use registrar_nixl::{Agent, NixlOptions, Op};

use backing_anon as _;

fn main() {
    let code = match run() {
        Ok(line) => {
            println!("{line}");
            0
        }
        Err(e) => {
            eprintln!("nixl_peer: {e}");
            1
        }
    };
    let _ = std::io::stdout().flush();
    // See `registrar_nixl::loaded`: the wheel's UCX may crash in exit().
    registrar_nixl::exit_now(code);
}

fn run() -> Result<String, Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [md, addr, len, rest @ ..] = args.as_slice() else {
        return Err("usage: nixl_peer METADATA_FILE REMOTE_ADDR LEN [NOTIF]".into());
    };
    let metadata = registrar_nixl::base64_decode(&std::fs::read_to_string(md)?)
        .ok_or("the metadata file is not base64")?;
    let remote = u64::from_str_radix(addr.trim_start_matches("0x"), 16)?;
    let len: u64 = len.parse()?;
    let notif = rest.first().map(String::as_bytes);
    let pool = Pool::build(
        &PoolPlan::new(PoolConfig {
            size: ByteSize(len),
            ..PoolConfig::default()
        })?,
        &Quiet,
    )?;
    let region = pool.region().ok_or("no region")?;
    let (api, _) = registrar_nixl::load(&NixlOptions::default())?;
    let agent = Agent::new(
        api,
        &format!("nixl-peer-{}", std::process::id()),
        None,
        false, // the initiator progresses as it polls its transfers
        "UCX",
        &[],
    )?;
    let whole = Extent {
        offset: 0,
        len: region.mapped_len(),
    };
    let reg = agent.register(&region, whole)?;
    let peer = agent.load_remote(&metadata)?;
    let extent = Extent { offset: 0, len };
    region.write_pattern(4096, 0x5a);
    let t = Instant::now();
    agent.transfer(
        Op::Write,
        &reg,
        extent,
        &peer,
        remote,
        None,
        Duration::from_secs(60),
    )?;
    let write_s = t.elapsed().as_secs_f64();
    region.write_pattern(4096, 0); // forget it locally, then read it back
    let t = Instant::now();
    agent.transfer(
        Op::Read,
        &reg,
        extent,
        &peer,
        remote,
        notif,
        Duration::from_secs(60),
    )?;
    let read_s = t.elapsed().as_secs_f64();
    let mismatch = region.check_pattern(4096, 0x5a);
    drop(reg);
    agent.forget_remote(&peer)?;
    Ok(format!(
        "{{\"peer\": \"{peer}\", \"bytes\": {len}, \"verified\": {}, \"write_gb_s\": {:.3}, \"read_gb_s\": {:.3}}}",
        mismatch.is_none(),
        len as f64 / write_s / 1e9,
        len as f64 / read_s / 1e9
    ))
}
