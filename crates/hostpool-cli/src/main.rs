//! The `hostpool` command. See `hostpool --help` and `docs/operators.md`.

mod cli;
mod sys;

// Every built-in plugin, linked through the library.
use hostpool as _;

fn main() {
    let code = cli::main();
    if registrar_nixl::loaded() {
        // The nixl-cu12 wheel's UCX can crash in exit() (see
        // `registrar_nixl::loaded`): the output is flushed, the pool torn
        // down; end without running exit handlers.
        registrar_nixl::exit_now(code);
    }
    std::process::exit(code);
}
