//! Helpers shared by the binary's end-to-end tests.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use perc_synth::site;

pub mod browser;
pub mod server;

pub const PERC: &str = env!("CARGO_BIN_EXE_perc");

/// Runs perc in `cwd` with the test configuration and no `--data`.
pub fn perc_in(cwd: &Path, args: &[&str]) -> Output {
    let mut perc = Command::new(PERC);
    perc.current_dir(cwd)
        .arg("--config")
        .arg(root().join("config/test.toml"))
        .args(args)
        .env_remove("RUST_LOG");
    finish(perc, &format!("perc {}", args.join(" ")))
}

pub fn code(out: &Output) -> i32 {
    out.status.code().expect("exited")
}

pub fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

pub fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

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

/// How long one perc command of a test may take: a command that hangs fails its test with
/// its arguments and what it wrote, well before nextest's own limit ends the test unnamed.
const COMMAND_DEADLINE: Duration = Duration::from_secs(150);

/// Runs perc on the store `data` with the test configuration.
pub fn perc(data: &Path, args: &[&str]) -> Output {
    finish(command(data, args), &format!("perc {}", args.join(" ")))
}

/// Runs `cmd` (described by `what`) to its end, its output collected; kills it and fails the
/// test if it outlasts [`COMMAND_DEADLINE`].
pub fn finish(mut cmd: Command, what: &str) -> Output {
    let child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot run {what}: {e}"));
    let pid = child.id();
    let (tx, rx) = std::sync::mpsc::channel();
    let waiter = std::thread::spawn(move || {
        let _ = tx.send(child.wait_with_output());
    });
    match rx.recv_timeout(COMMAND_DEADLINE) {
        Ok(out) => out.unwrap_or_else(|e| panic!("cannot run {what}: {e}")),
        Err(_) => {
            let _ = Command::new("kill").args(["-KILL", &pid.to_string()]).status();
            let out = waiter.join().ok().and_then(|_| rx.recv().ok()).and_then(|o| o.ok());
            let stderr = out.map(|o| String::from_utf8_lossy(&o.stderr).into_owned());
            panic!(
                "{what} did not finish in {COMMAND_DEADLINE:?}; killed. Its stderr:\n{}",
                stderr.unwrap_or_default()
            );
        }
    }
}

/// perc on the store `data` with the test configuration and `args`, not started yet. An
/// `args` that starts with `--config` replaces the test configuration.
pub fn command(data: &Path, args: &[&str]) -> Command {
    let mut c = Command::new(PERC);
    if args.first() != Some(&"--config") {
        c.arg("--config").arg(root().join("config/test.toml"));
    }
    c.arg("--data").arg(data).args(args).env_remove("RUST_LOG");
    c
}

/// Serves `dir` for the duration of a test.
pub struct Site {
    _rt: tokio::runtime::Runtime,
    served: site::Served,
}

impl Site {
    pub fn start(dir: &Path) -> Site {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap();
        let served = rt.block_on(site::serve(dir)).unwrap();
        Site { _rt: rt, served }
    }
    pub fn base(&self) -> String {
        self.served.base().to_string()
    }
    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base())
    }
    /// Requests it answered 304.
    pub fn not_modified(&self) -> u64 {
        self.served.not_modified()
    }
}

pub fn export(data: &Path, out: &Path) -> String {
    ok(&perc(data, &["export", "--out", out.to_str().unwrap()]));
    std::fs::read_to_string(out).unwrap()
}

pub fn seeds(dir: &Path, urls: &[String]) -> PathBuf {
    let f = dir.join("seeds.txt");
    std::fs::write(&f, format!("# the demo site\n\n{}\n", urls.join("\n"))).unwrap();
    f
}

pub fn golden(name: &str, actual: &str) {
    let path = root().join("fixtures/golden").join(name);
    if std::env::var("UPDATE_GOLDENFILES").is_ok_and(|v| v == "1") {
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(&path, actual).unwrap();
        return;
    }
    let want = std::fs::read_to_string(&path)
        .unwrap_or_else(|_| panic!("{} is missing: run make golden", path.display()));
    assert!(
        want == actual,
        "export differs from {}:\n--- want\n{want}\n--- got\n{actual}",
        path.display()
    );
}

/// How two exports differ, if they do: every line's fields must be equal but `pagerank`,
/// which must agree within the bound the ranks are kept in (max(0.001, 0.001 · rank),
/// docs/spec.md §6.4b; and the six decimals' rounding).
pub fn export_difference(got: &str, want: &str) -> Option<String> {
    let (got_lines, want_lines): (Vec<&str>, Vec<&str>) =
        (got.lines().collect(), want.lines().collect());
    if got_lines.len() != want_lines.len() {
        return Some(format!("{} lines against {}", got_lines.len(), want_lines.len()));
    }
    let rank = |v: &mut serde_json::Value| v.as_object_mut()?.remove("pagerank")?.as_f64();
    for (g, w) in got_lines.iter().zip(&want_lines) {
        let mut g: serde_json::Value = serde_json::from_str(g).unwrap();
        let mut w: serde_json::Value = serde_json::from_str(w).unwrap();
        match (rank(&mut g), rank(&mut w)) {
            (Some(a), Some(b)) if (a - b).abs() <= f64::max(0.001, 0.001 * a.max(b)) + 2e-6 => {}
            (None, None) => {}
            (a, b) => return Some(format!("pagerank {a:?} against {b:?} in {g}")),
        }
        if g != w {
            return Some(format!("{g}\nagainst\n{w}"));
        }
    }
    None
}

/// Asserts that two exports are the same ([`export_difference`]).
pub fn assert_same_export(got: &str, want: &str, what: &str) {
    if let Some(d) = export_difference(got, want) {
        panic!("{what}: {d}\n--- want\n{want}\n--- got\n{got}");
    }
}

/// An independent validator (warcio, from Python's index; `make test` installs it) reads
/// every record of `warc` and checks its digests: a warcinfo first, then each request and
/// response with a block digest that passes, and revisits (whose digests name the record
/// they refer to, so warcio leaves them). The numbers of response and revisit records.
pub fn warcio_check(warc: &Path) -> (usize, usize) {
    let cli = "import sys; from warcio.cli import main; main(sys.argv[1:])";
    let out = Command::new("python3")
        .args(["-c", cli, "check", "-v"])
        .arg(warc)
        .output()
        .expect("python3 runs");
    let report = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "warcio check failed (without warcio: python3 -m pip install warcio): {}\n{report}",
        String::from_utf8_lossy(&out.stderr)
    );
    let records = report.matches("WARC-Record-ID").count();
    assert!(records > 20, "{report}");
    let revisits = report.matches("digest present but not checked (revisit)").count();
    assert_eq!(report.matches("digest pass").count() + revisits, records, "{report}");
    let first = report.lines().nth(1).unwrap_or_default();
    assert!(first.ends_with("warcinfo"), "{report}");
    let responses = report.lines().filter(|l| l.ends_with(" response")).count();
    assert_eq!(report.lines().filter(|l| l.ends_with(" revisit")).count(), revisits, "{report}");
    (responses, revisits)
}

/// Copies the directory `from` into `to`, recursively.
pub fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        let target = to.join(entry.file_name());
        if entry.file_type().unwrap().is_dir() {
            copy_dir(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), target).unwrap();
        }
    }
}

/// Applies the demo's v2 change set to the copy of the site in `web`: its files replace or
/// join the site's, and the files `_deleted` lists are removed. The changed files' paths.
pub fn apply_v2(web: &Path) -> Vec<String> {
    let changes = root().join("fixtures/changes/v2");
    copy_dir(&changes, web);
    let deleted = std::fs::read_to_string(web.join("_deleted")).unwrap();
    let mut changed = Vec::new();
    for f in deleted.lines().map(str::trim).filter(|l| !l.is_empty() && !l.starts_with('#')) {
        std::fs::remove_file(web.join(f)).unwrap();
        changed.push(f.to_string());
    }
    changed
}
