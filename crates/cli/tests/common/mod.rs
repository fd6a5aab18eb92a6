//! Helpers shared by the binary's end-to-end tests.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::Output;

pub const PERC: &str = env!("CARGO_BIN_EXE_perc");

/// The repository's top directory.
pub fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The stdout of a perc run that must have succeeded (else its output, in the failure).
pub fn ok(out: &Output) -> String {
    assert!(
        out.status.success(),
        "perc failed: {}\n{}",
        String::from_utf8_lossy(&out.stderr),
        String::from_utf8_lossy(&out.stdout)
    );
    String::from_utf8(out.stdout.clone()).unwrap()
}
