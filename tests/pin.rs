//! Pinning and registration through the shipped binary: no driver, the
//! `libcuda.so.1` test double in its place, and libibverbs on a kernel
//! without RDMA.

mod support;

use support::{
    assert_tiles_on_unit, fake_driver_dir, output_text as text, real_driver_present, run_hostpool,
};

use std::path::Path;
use std::process::{Command, Output};

use serde_json::Value;

/// Run hostpool with `LD_LIBRARY_PATH` set to `libs` only.
fn hostpool(libs: &Path, args: &[&str], env: &[(&str, &str)]) -> Output {
    let libs = libs.to_str().unwrap();
    let mut all = vec![("LD_LIBRARY_PATH", libs)];
    all.extend_from_slice(env);
    run_hostpool(args, &all)
}

#[test]
fn without_a_driver_best_effort_cuda_pinning_is_skipped_and_required_fails_clearly() {
    if real_driver_present() {
        eprintln!("skip: a real CUDA driver is installed; this test is about hosts without one");
        return;
    }
    let empty = std::env::temp_dir().join(format!("hostpool-nodriver-{}", std::process::id()));
    std::fs::create_dir_all(&empty).unwrap();
    let o = hostpool(
        &empty,
        &["alloc", "--size", "16MiB", "--pin", "cuda", "--json"],
        &[],
    );
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let r: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(r["pin"]["status"], "skipped");
    assert!(
        r["pin"]["reason"]
            .as_str()
            .unwrap()
            .contains("not available on this host"),
        "{r}"
    );
    let o = hostpool(
        &empty,
        &[
            "alloc",
            "--size",
            "16MiB",
            "--pin",
            "cuda",
            "--pin-required",
        ],
        &[],
    );
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("no CUDA driver") && !err.contains("panicked"),
        "{err}"
    );
    assert_eq!(err.trim().lines().count(), 1, "one paragraph: {err}");
    std::fs::remove_dir_all(&empty).unwrap();
}

#[test]
fn with_the_fake_driver_the_pool_is_pinned_in_chunks_and_the_copy_is_checked() {
    let dir = fake_driver_dir("pin");
    let log = dir.0.join("calls.log");
    let cfg = dir.0.join("pool.toml");
    std::fs::write(
        &cfg,
        "size = \"96MiB\"\nblock_size = \"4MiB\"\n[cuda]\nchunk_size = \"32MiB\"\n",
    )
    .unwrap();
    let o = hostpool(
        &dir.0,
        &[
            "alloc",
            "--config",
            cfg.to_str().unwrap(),
            "--pin",
            "cuda",
            "--pin-required",
            "--verify-copy",
            "--json",
        ],
        &[("FAKE_CUDA_LOG", log.to_str().unwrap())],
    );
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let r: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(r["pin"]["status"], "pinned");
    let chunks = r["pin"]["details"]["chunks"].as_array().unwrap();
    assert_eq!(chunks.len(), 3, "96 MiB in 32 MiB chunks: {r}");
    assert!(r["phases"]["pin"].is_f64());
    assert_eq!(r["verify_copy"]["verified"], true, "{r}");
    assert!(r["verify_copy"]["h2d_gib_s"].as_f64().unwrap() > 0.0);
    let calls = std::fs::read_to_string(&log).unwrap();
    let reg = calls
        .lines()
        .filter(|l| l.starts_with("cuMemHostRegister"))
        .count();
    let unreg = calls
        .lines()
        .filter(|l| l.starts_with("cuMemHostUnregister"))
        .count();
    assert_eq!(
        (reg, unreg),
        (3, 3),
        "every chunk registered and unregistered:\n{calls}"
    );
}

/// vLLM's 61 × 512 B unit on 4 KiB pages: the pool is pinned, foreground and
/// in the background, in chunks whose interior boundaries are multiples of
/// lcm(31232, 4096) = 61 × 4096 = 249856 bytes, as the driver saw them.
#[test]
fn with_the_fake_driver_a_block_off_the_page_pins_in_chunks_on_its_lcm_with_the_page() {
    const BLOCK: u64 = 61 * 512;
    const UNIT: u64 = 61 * 4096;
    const SIZE: u64 = 16 << 20;
    let dir = fake_driver_dir("vllm-block");
    let cfg = dir.0.join("pool.toml");
    std::fs::write(
        &cfg,
        format!("size = \"16MiB\"\nblock_size = {BLOCK}\n[cuda]\nchunk_size = \"1MiB\"\n"),
    )
    .unwrap();
    for background in [false, true] {
        let log = dir.0.join(format!("calls-{background}.log"));
        let mut args = vec![
            "alloc",
            "--config",
            cfg.to_str().unwrap(),
            "--pin",
            "cuda",
            "--pin-required",
            "--json",
        ];
        if background {
            args.extend(["--pin-background", "--pin-background-chunk", "1MiB"]);
        }
        let o = hostpool(&dir.0, &args, &[("FAKE_CUDA_LOG", log.to_str().unwrap())]);
        assert_eq!(o.status.code(), Some(0), "{}", text(&o));
        let r: Value = serde_json::from_slice(&o.stdout).unwrap();
        assert_eq!(r["pin"]["status"], "pinned", "{r}");
        let base = r["address"].as_str().unwrap().trim_start_matches("0x");
        let base = u64::from_str_radix(base, 16).unwrap();
        // (offset in the pool, length) of every cuMemHostRegister call.
        let calls: Vec<(u64, u64)> = std::fs::read_to_string(&log)
            .unwrap()
            .lines()
            .filter(|l| l.starts_with("cuMemHostRegister"))
            .map(|l| {
                let f: Vec<&str> = l.split_whitespace().collect();
                let addr = u64::from_str_radix(f[1].trim_start_matches("0x"), 16).unwrap();
                (addr - base, f[2].parse().unwrap())
            })
            .collect();
        assert!(calls.len() > 2, "background {background}: {calls:?}");
        assert_tiles_on_unit(
            &calls,
            SIZE,
            UNIT,
            BLOCK,
            &format!("background {background}"),
        );
        // floor(1 MiB / 244 KiB) = 4 units a chunk.
        assert_eq!(calls[0].1, 4 * UNIT, "background {background}: {calls:?}");
    }
}

#[test]
fn with_the_fake_driver_a_failed_chunk_fails_a_required_pin_and_rolls_back() {
    let dir = fake_driver_dir("fail");
    let log = dir.0.join("calls.log");
    let cfg = dir.0.join("pool.toml");
    std::fs::write(&cfg, "size = \"64MiB\"\n[cuda]\nchunk_size = \"16MiB\"\n").unwrap();
    let o = hostpool(
        &dir.0,
        &[
            "alloc",
            "--config",
            cfg.to_str().unwrap(),
            "--pin",
            "cuda",
            "--pin-required",
        ],
        &[
            ("FAKE_CUDA_LOG", log.to_str().unwrap()),
            ("FAKE_CUDA_FAIL_REGISTER_AT", "3"),
        ],
    );
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    let err = String::from_utf8_lossy(&o.stderr);
    // Chunks are numbered from 0: the third call is chunk 2.
    assert!(
        err.contains("chunk 2 (offset 32 MiB, 16 MiB)") && err.contains("CUDA_ERROR_OUT_OF_MEMORY"),
        "{err}"
    );
    assert!(
        err.contains("the 2 chunks before it (0 to 1) were unregistered in reverse"),
        "{err}"
    );
    let calls = std::fs::read_to_string(&log).unwrap();
    let unreg = calls
        .lines()
        .filter(|l| l.starts_with("cuMemHostUnregister"))
        .count();
    assert_eq!(
        unreg, 2,
        "the two registered chunks are rolled back:\n{calls}"
    );
}

#[test]
fn registering_with_rdma_on_this_host_fails_with_a_clear_reason() {
    let real = Path::new("/usr/lib/x86_64-linux-gnu/libibverbs.so.1").exists();
    let has_rdma = Path::new("/sys/class/infiniband_verbs").exists();
    if has_rdma {
        eprintln!("skip: this host has RDMA devices");
        return;
    }
    let o = Command::new(env!("CARGO_BIN_EXE_hostpool"))
        .args(["alloc", "--size", "16MiB", "--register", "rdma"])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!err.contains("panicked"), "{err}");
    if real {
        assert!(err.contains("kernel without RDMA"), "{err}");
    } else {
        assert!(err.contains("libibverbs"), "{err}");
    }
}

/// Eight ranks of a shared pool of four pages, pinned whole, each checking
/// the copy: a rank copies only through its own shard (the check overwrites
/// what it copies), and a rank with an empty shard copies nothing, rather
/// than the whole pool over its peers' shards.
#[test]
fn verify_copy_of_a_shared_pool_stays_inside_each_ranks_shard() {
    let dir = fake_driver_dir("shard-copy");
    let name = format!("pin-shard-copy-{}", std::process::id());
    let children: Vec<_> = (0..8)
        .map(|rank| {
            let log = dir.0.join(format!("calls-{rank}.log"));
            Command::new(env!("CARGO_BIN_EXE_hostpool"))
                .args([
                    "alloc",
                    "--size",
                    "16KiB",
                    "--dir",
                    "/dev/shm",
                    "--shared",
                    &name,
                    "--world",
                    "8",
                    "--rank",
                    &rank.to_string(),
                    "--attach-timeout",
                    "20",
                    "--pin",
                    "cuda",
                    "--pin-required",
                    "--verify-copy",
                    "--json",
                ])
                .env("LD_LIBRARY_PATH", &dir.0)
                .env("FAKE_CUDA_LOG", &log)
                .env_remove("RUST_LOG")
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    let mut empty = 0;
    for (rank, child) in children.into_iter().enumerate() {
        let o = child.wait_with_output().unwrap();
        assert_eq!(o.status.code(), Some(0), "rank {rank}: {}", text(&o));
        let r: Value = serde_json::from_slice(&o.stdout).unwrap();
        let shard = r["sharing"]["shard"]["len"].as_u64().unwrap();
        let copies: Vec<String> = std::fs::read_to_string(dir.0.join(format!("calls-{rank}.log")))
            .unwrap()
            .lines()
            .filter(|l| l.starts_with("cuMemcpy"))
            .map(str::to_string)
            .collect();
        if shard == 0 {
            empty += 1;
            assert_eq!(r["verify_copy"]["bytes"], 0, "rank {rank}: {r}");
            assert!(
                copies.is_empty(),
                "rank {rank} copied with an empty shard: {copies:?}"
            );
        } else {
            assert_eq!(r["verify_copy"]["bytes"], shard, "rank {rank}: {r}");
            assert_eq!(r["verify_copy"]["verified"], true, "rank {rank}: {r}");
            assert!(!copies.is_empty(), "rank {rank}");
        }
    }
    assert_eq!(empty, 4, "four of eight ranks get no page");
}

/// `hostpool ARGS` against the fake driver in `libs`, slowed to 100 ms per
/// registration, logging to `log`, with stdout piped.
fn spawn_slowed(libs: &Path, log: &Path, args: &[&str]) -> std::process::Child {
    Command::new(env!("CARGO_BIN_EXE_hostpool"))
        .args(args)
        .env("LD_LIBRARY_PATH", libs)
        .env("FAKE_CUDA_LOG", log)
        .env("FAKE_CUDA_REGISTER_DELAY_MS", "100")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap()
}

/// Reads a pretty-printed JSON report (ending with a `}` line) from `r`.
fn read_report(r: &mut impl std::io::BufRead) -> Value {
    let mut text = String::new();
    loop {
        let mut line = String::new();
        assert!(
            r.read_line(&mut line).unwrap() > 0,
            "stdout ended before the report: {text}"
        );
        text.push_str(&line);
        if line == "}\n" {
            return serde_json::from_str(&text).unwrap();
        }
    }
}

#[test]
fn a_held_pool_reports_when_usable_then_a_line_when_pinned_in_the_background() {
    use std::io::BufRead;
    let dir = fake_driver_dir("bg-hold");
    let log = dir.0.join("calls.log");
    let cfg = dir.0.join("pool.toml");
    std::fs::write(
        &cfg,
        "size = \"64MiB\"\nblock_size = \"4MiB\"\n[cuda]\nchunk_size = \"8MiB\"\n",
    )
    .unwrap();
    let mut a = spawn_slowed(
        &dir.0,
        &log,
        &[
            "alloc",
            "--config",
            cfg.to_str().unwrap(),
            "--pin",
            "cuda",
            "--pin-required",
            "--pin-background",
            "--pin-background-chunk",
            "16MiB",
            "--hold",
            "--json",
        ],
    );
    let mut out = std::io::BufReader::new(a.stdout.take().unwrap());
    let ready = read_report(&mut out);
    assert_eq!(
        ready["pin"]["status"], "pinning",
        "the pool is ready before it is pinned: {ready}"
    );
    assert!(
        ready["phases"]["pin"].is_null(),
        "no pin phase in the time to usable"
    );
    let mut line = String::new();
    out.read_line(&mut line).unwrap();
    let end: Value = serde_json::from_str(&line).unwrap_or_else(|e| panic!("{e}: {line}"));
    assert_eq!(end["pin"]["status"], "pinned", "{end}");
    assert_eq!(end["pin"]["state"], end["pin"]["status"], "{end}");
    assert_eq!(end["pin"]["pinned_bytes"], 64 << 20);
    assert_eq!(end["pin"]["chunks"], 4);
    assert!(
        end["pin"]["seconds"].as_f64().unwrap() >= 0.7,
        "8 slowed calls: {end}"
    );
    rustix::process::kill_process(
        rustix::process::Pid::from_child(&a),
        rustix::process::Signal::TERM,
    )
    .unwrap();
    assert_eq!(a.wait().unwrap().code(), Some(0));
    let calls = std::fs::read_to_string(&log).unwrap();
    let count = |name: &str| calls.lines().filter(|l| l.starts_with(name)).count();
    assert_eq!(
        (count("cuMemHostRegister"), count("cuMemHostUnregister")),
        (8, 8),
        "{calls}"
    );
}

/// The report gives the chunk the background pin really uses: the asked
/// size made whole pages and blocks (never less than one), not the raw ask.
#[test]
fn a_background_pin_reports_the_chunk_it_really_uses() {
    let dir = fake_driver_dir("bg-chunk");
    for (chunk, block, used, chunks) in [
        ("1KiB", "4KiB", 4u64 << 10, 4096u64),
        ("10MiB", "4MiB", 8 << 20, 2),
        ("16MiB", "4MiB", 16 << 20, 1),
    ] {
        let cfg = dir.0.join("pool.toml");
        std::fs::write(
            &cfg,
            format!("size = \"16MiB\"\nblock_size = \"{block}\"\n"),
        )
        .unwrap();
        let o = hostpool(
            &dir.0,
            &[
                "alloc",
                "--config",
                cfg.to_str().unwrap(),
                "--pin",
                "cuda",
                "--pin-required",
                "--pin-background",
                "--pin-background-chunk",
                chunk,
                "--json",
            ],
            &[],
        );
        assert_eq!(o.status.code(), Some(0), "{chunk}: {}", text(&o));
        let r: Value = serde_json::from_slice(&o.stdout).unwrap();
        let d = &r["pin"]["details"];
        assert_eq!(d["chunk"], used, "{chunk} of {block} blocks: {r}");
        assert_eq!(d["chunks"], chunks, "{chunk} of {block} blocks: {r}");
        assert_eq!(d["pinned_bytes"], 16 << 20, "{r}");
    }
}

#[test]
fn without_hold_alloc_waits_for_a_background_pin_and_sigterm_mid_pin_unpins_everything() {
    let dir = fake_driver_dir("bg-wait");
    let log = dir.0.join("calls.log");
    let args = [
        "alloc",
        "--size",
        "64MiB",
        "--pin",
        "cuda",
        "--pin-background",
        "--pin-background-chunk",
        "8MiB",
        "--json",
    ];
    let env = [
        ("FAKE_CUDA_LOG", log.to_str().unwrap()),
        ("FAKE_CUDA_REGISTER_DELAY_MS", "20"),
    ];
    let o = hostpool(&dir.0, &args, &env);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let r: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(r["pin"]["status"], "pinned", "{r}");
    assert_eq!(r["pin"]["details"]["pinned_bytes"], 64 << 20);
    // SIGTERM while the pin runs: teardown stops it after the current chunk
    // and unregisters every chunk before it unmaps.
    let _ = std::fs::remove_file(&log);
    let mut a = spawn_slowed(
        &dir.0,
        &log,
        &[
            "alloc",
            "--size",
            "64MiB",
            "--pin",
            "cuda",
            "--pin-background",
            "--pin-background-chunk",
            "4MiB",
            "--hold",
        ],
    );
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while std::fs::read_to_string(&log)
        .unwrap_or_default()
        .matches("cuMemHostRegister")
        .count()
        < 2
    {
        assert!(
            std::time::Instant::now() < deadline,
            "pinning never started"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    rustix::process::kill_process(
        rustix::process::Pid::from_child(&a),
        rustix::process::Signal::TERM,
    )
    .unwrap();
    assert_eq!(a.wait().unwrap().code(), Some(0));
    let calls = std::fs::read_to_string(&log).unwrap();
    let lines: Vec<&str> = calls
        .lines()
        .filter(|l| l.starts_with("cuMemHost"))
        .collect();
    let reg = lines
        .iter()
        .filter(|l| l.starts_with("cuMemHostRegister"))
        .count();
    let unreg = lines
        .iter()
        .filter(|l| l.starts_with("cuMemHostUnregister"))
        .count();
    assert!((2..16).contains(&reg), "stopped part way: {calls}");
    assert_eq!(
        unreg, reg,
        "every chunk registered was unregistered: {calls}"
    );
    assert!(
        lines.last().unwrap().starts_with("cuMemHostUnregister"),
        "nothing registered after teardown began: {calls}"
    );
}
