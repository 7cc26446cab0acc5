//! What the mock's integration tests share.

use std::io::Write;
use std::path::{Path, PathBuf};

/// The mock, as cargo built it for this test: `target/<profile>/deps/libnvidia_ml_mock.so`, beside
/// the test binary. The test names the library crate (its rlib), so cargo builds the library
/// target, which emits the cdylib too; a cdylib alone is not built for integration tests.
pub fn mock_library() -> PathBuf {
    let exe = std::env::current_exe().expect("the test binary's path");
    let deps = exe.parent().expect("its directory");
    [deps.to_path_buf(), deps.parent().expect("the profile directory").to_path_buf()]
        .iter()
        .map(|d| d.join("libnvidia_ml_mock.so"))
        .find(|p| p.exists())
        .expect("cargo builds the cdylib before its tests")
}

/// Appends one fault line to the mock's faults file, as a test raises a fault.
pub fn raise(faults: &Path, line: &str) {
    let mut f = std::fs::OpenOptions::new().create(true).append(true).open(faults).expect("the faults file");
    writeln!(f, "{line}").expect("a fault line written");
}
