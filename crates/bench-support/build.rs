//! Compiles the plain-C prefault reference (`benches/c/raw_populate.c`) that
//! `bench_support::reference`, the benches and `hostpool bench` compare
//! against.

fn main() {
    let source = "../../benches/c/raw_populate.c";
    println!("cargo:rerun-if-changed={source}");
    println!("cargo:rerun-if-changed=build.rs");
    cc::Build::new()
        .file(source)
        .std("c11")
        .opt_level(2)
        .flag("-pthread")
        .warnings(true)
        .extra_warnings(true)
        .compile("hostpool_raw_populate");
    println!("cargo:rustc-link-lib=pthread");
}
