//! `switchyard-driver-agent`: parses flags and runs the node agent (or, with `--dry-run`, prints
//! what it would publish).

use clap::Parser;
use switchyard_driver_agent::cli::{self, Args};

#[tokio::main]
async fn main() -> std::process::ExitCode {
    let args = Args::parse();
    cli::init_logging(args.log_format);
    let result = if args.dry_run {
        cli::dry_run(&args).await.map(|yaml| print!("{yaml}"))
    } else {
        cli::run(args).await
    };
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            let mut chain = e.to_string();
            let mut source = std::error::Error::source(&e);
            while let Some(s) = source {
                chain.push_str(": ");
                chain.push_str(&s.to_string());
                source = s.source();
            }
            tracing::error!(error = %chain, category = e.category(), "driver agent failed");
            std::process::ExitCode::FAILURE
        }
    }
}
