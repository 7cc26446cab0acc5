//! Writes the CRDs in `crds/` from the Rust types (`make generate`), or with `--check` fails when
//! the committed YAML has drifted from them (`make test`).

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;

#[derive(Parser)]
#[command(about = "Generate Switchyard's CRD YAML from the Rust API types")]
struct Args {
    /// Only compare; exit 1 if any file differs.
    #[arg(long)]
    check: bool,
    /// Directory holding the CRD YAML.
    #[arg(default_value = "crds")]
    dir: PathBuf,
}

fn main() -> anyhow::Result<ExitCode> {
    let args = Args::parse();
    let drift = switchyard_operator::crd::sync(&args.dir, !args.check)?;
    for d in &drift {
        let verb = if args.check { "drift" } else { "wrote" };
        eprintln!("crdgen: {verb}: {} {}", d.path.display(), d.reason);
    }
    if args.check && !drift.is_empty() {
        eprintln!("crdgen: the committed CRDs are out of date; run `make generate` and commit crds/");
        return Ok(ExitCode::FAILURE);
    }
    Ok(ExitCode::SUCCESS)
}
