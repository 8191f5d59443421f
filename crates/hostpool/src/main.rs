//! The `hostpool` command. See `hostpool --help` and the README.

fn main() {
    let code = hostpool::cli::main();
    if registrar_nixl::loaded() {
        // The nixl-cu12 wheel's UCX can crash in exit() (see
        // `registrar_nixl::loaded`): the output is flushed, the pool torn
        // down; end without running exit handlers.
        registrar_nixl::exit_now(code);
    }
    std::process::exit(code);
}
