//! Writes the CRDs in `crds/` and the API reference `docs/reference/api.md` from the Rust types
//! (`make generate`), or with `--check` fails when either has drifted from them (`make test`).

// As in the library (lib.rs): no function over 100 lines without a reason; tests exempt.
#![cfg_attr(not(test), warn(clippy::too_many_lines))]

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;

#[derive(Parser)]
#[command(about = "Generate Switchyard's CRD YAML and API reference from the Rust API types")]
struct Args {
    /// Only compare; exit 1 if any file differs.
    #[arg(long)]
    check: bool,
    /// Directory holding the CRD YAML.
    #[arg(default_value = "crds")]
    dir: PathBuf,
    /// The API reference in Markdown, rendered from the CRDs; relative to the working directory,
    /// which `make` sets to the repository root.
    #[arg(long, default_value = "docs/reference/api.md")]
    reference: PathBuf,
}

fn main() -> anyhow::Result<ExitCode> {
    let args = Args::parse();
    let drift = switchyard_operator::crd::sync(&args.dir, &args.reference, !args.check)?;
    for d in &drift {
        let verb = if args.check { "drift" } else { "wrote" };
        eprintln!("crdgen: {verb}: {} {}", d.path.display(), d.reason);
    }
    if args.check && !drift.is_empty() {
        eprintln!(
            "crdgen: the committed CRDs or API reference are out of date; run `make generate` and commit crds/ and {}",
            args.reference.display()
        );
        return Ok(ExitCode::FAILURE);
    }
    Ok(ExitCode::SUCCESS)
}
