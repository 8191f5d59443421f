//! The `hostpool` command. See `hostpool --help` and the README.

fn main() {
    std::process::exit(hostpool::cli::main());
}
