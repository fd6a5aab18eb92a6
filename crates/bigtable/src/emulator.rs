//! The Cloud Bigtable emulator (`cbtemulator`, from the Google Cloud SDK) as a child process,
//! for tests and local runs: started on 127.0.0.1 on a port the kernel picks, killed when
//! dropped. It keeps nothing across a restart and enforces none of Bigtable's limits (the
//! backend enforces them itself).
//!
//! Where the binary is looked for, in order: `$PERC_CBTEMULATOR`; `cbtemulator` on `PATH`;
//! `platform/bigtable-emulator/cbtemulator` under the SDK root that
//! `gcloud info --format='value(installation.sdk_root)'` prints. If none is there, starting
//! fails with a message saying how to get it: the tests that need it fail, never pass silently.

use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

/// A running emulator; dropping it kills the process.
pub struct Emulator {
    child: Child,
    addr: String,
}

/// How to get the emulator, for error messages.
pub const HOW_TO_INSTALL: &str = "install the Google Cloud SDK and its Bigtable emulator \
     (`gcloud components install bigtable`, or the Debian package \
     google-cloud-cli-bigtable-emulator), or set PERC_CBTEMULATOR to the cbtemulator binary";

impl Emulator {
    /// Finds the emulator binary (see the module docs).
    pub fn binary() -> Result<PathBuf, String> {
        find(std::env::var_os("PERC_CBTEMULATOR"), std::env::var_os("PATH"), sdk_root)
    }

    /// Starts a fresh emulator on 127.0.0.1 and returns once it listens.
    pub fn start() -> Result<Emulator, String> {
        let bin = Emulator::binary()?;
        let mut child = Command::new(&bin)
            .args(["-host", "127.0.0.1", "-port", "0"])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| format!("cannot start {}: {e}", bin.display()))?;
        // It prints "Cloud Bigtable emulator running on 127.0.0.1:PORT" once it listens.
        let stdout = child.stdout.take().expect("piped");
        let mut lines = BufReader::new(stdout);
        let mut line = String::new();
        let read = lines.read_line(&mut line);
        let addr = line.trim().rsplit(' ').next().unwrap_or_default().to_string();
        if read.is_err() || !addr.starts_with("127.0.0.1:") {
            let _ = child.kill();
            let _ = child.wait();
            return Err(format!(
                "{} did not report its address (it printed {:?})",
                bin.display(),
                line.trim()
            ));
        }
        // Keep draining its output, so that it never blocks on a full pipe.
        std::thread::spawn(move || {
            let mut sink = Vec::new();
            let _ = lines.read_to_end(&mut sink);
        });
        Ok(Emulator { child, addr })
    }

    /// The emulator's process id (benchmarks read its CPU time).
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// `127.0.0.1:PORT`, the value `BIGTABLE_EMULATOR_HOST` would take.
    pub fn addr(&self) -> &str {
        &self.addr
    }
}

impl Drop for Emulator {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The SDK root `gcloud` reports, if there is a `gcloud`.
fn sdk_root() -> Option<String> {
    Command::new("gcloud")
        .args(["info", "--format=value(installation.sdk_root)"])
        .stderr(Stdio::null())
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .filter(|s| !s.is_empty())
}

/// The search of [`Emulator::binary`], over the given environment.
fn find(
    explicit: Option<std::ffi::OsString>,
    path: Option<std::ffi::OsString>,
    sdk_root: impl FnOnce() -> Option<String>,
) -> Result<PathBuf, String> {
    if let Some(p) = explicit {
        let p = PathBuf::from(p);
        return if p.is_file() {
            Ok(p)
        } else {
            Err(format!("PERC_CBTEMULATOR={} is not a file; {HOW_TO_INSTALL}", p.display()))
        };
    }
    if let Some(path) = path {
        for dir in std::env::split_paths(&path) {
            let p = dir.join("cbtemulator");
            if p.is_file() {
                return Ok(p);
            }
        }
    }
    match sdk_root() {
        Some(root) => {
            let p = Path::new(&root).join("platform/bigtable-emulator/cbtemulator");
            if p.is_file() {
                Ok(p)
            } else {
                Err(format!(
                    "the Cloud Bigtable emulator is not installed: {} does not exist; \
                     {HOW_TO_INSTALL}",
                    p.display()
                ))
            }
        }
        None => Err(format!(
            "the Cloud Bigtable emulator was not found: no cbtemulator on PATH and no \
             `gcloud` to find the SDK; {HOW_TO_INSTALL}"
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_emulator_is_an_error_that_says_how_to_get_it() {
        let none = find(None, Some("/nonexistent-dir".into()), || None).unwrap_err();
        assert!(none.contains("no cbtemulator on PATH"), "{none}");
        assert!(none.contains("gcloud components install bigtable"), "{none}");
        let sdk = find(None, None, || Some("/nonexistent-sdk".into())).unwrap_err();
        assert!(sdk.contains("/nonexistent-sdk/platform/bigtable-emulator/cbtemulator"), "{sdk}");
        assert!(sdk.contains(HOW_TO_INSTALL), "{sdk}");
        let bad = find(Some("/nonexistent/cbt".into()), None, || None).unwrap_err();
        assert!(bad.contains("PERC_CBTEMULATOR=/nonexistent/cbt is not a file"), "{bad}");
    }

    #[test]
    fn the_emulator_is_found_where_the_sdk_keeps_it_and_starts() {
        let found = Emulator::binary().unwrap_or_else(|e| panic!("{e}"));
        assert!(found.ends_with("cbtemulator"));
        let e = Emulator::start().unwrap_or_else(|e| panic!("{e}"));
        assert!(e.addr().starts_with("127.0.0.1:"));
        assert!(std::net::TcpStream::connect(e.addr()).is_ok(), "it listens once started");
    }
}
