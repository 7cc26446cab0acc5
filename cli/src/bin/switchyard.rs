//! `switchyard`: plan, inventory and status for GPU pool migrations.

fn main() -> std::process::ExitCode {
    switchyard_cli::main()
}
