//! `kubectl-switchyard`: the same tool as `switchyard`, named so that kubectl finds it on PATH as
//! `kubectl switchyard`.

fn main() -> std::process::ExitCode {
    switchyard_cli::main()
}
