//! Faults and hostile inputs, through the `perc` binary (issue #7): each test is named after
//! the case it covers, and each failed before the fix it checks.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

mod common;

use common::{export, root, seeds, Site, PERC};

/// A small deterministic generator (splitmix64), so that every run kills at the same points.
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        (z ^ (z >> 31)) % n.max(1)
    }
}

/// Lock and liveness TTLs far longer than the test: a restart that waited for the dead
/// process's locks to age would time out instead of finishing.
const LONG_TTLS: [&str; 4] =
    ["--set", "txn.lock_ttl_ms=600000", "--set", "txn.liveness_ttl_ms=600000"];

fn command(data: &Path, args: &[&str]) -> Command {
    let mut c = Command::new(PERC);
    c.arg("--config")
        .arg(root().join("config/test.toml"))
        .arg("--data")
        .arg(data)
        .args(LONG_TTLS)
        .args(args)
        .env_remove("RUST_LOG");
    c
}

/// Runs `cmd` to its end, failing the test if it runs longer than `limit`. Its output goes
/// to files, so that a pipe nobody reads never blocks it.
fn finish_within(cmd: &mut Command, logs: &Path, limit: Duration, what: &str) -> (bool, String) {
    let (out, err) = (logs.with_extension("out"), logs.with_extension("err"));
    let mut child = cmd
        .stdout(std::fs::File::create(&out).unwrap())
        .stderr(std::fs::File::create(&err).unwrap())
        .spawn()
        .unwrap();
    let started = Instant::now();
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return (status.success(), std::fs::read_to_string(&err).unwrap());
        }
        if started.elapsed() > limit {
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "{what} did not finish within {limit:?}:\n{}",
                std::fs::read_to_string(&err).unwrap()
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Runs `args` on `data`, killing it with SIGKILL once it has logged `kill_at` observer runs
/// (0: after `delay_ms`, while it is still loading). Returns how many runs it logged.
fn run_and_kill(data: &Path, args: &[&str], kill_at: usize, delay_ms: u64) -> usize {
    let mut child = command(data, args)
        .env("RUST_LOG", "perc_notify=debug")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let stderr = child.stderr.take().unwrap();
    if kill_at == 0 {
        std::thread::sleep(Duration::from_millis(delay_ms));
        child.kill().unwrap();
        child.wait().unwrap();
        return 0;
    }
    let mut runs = 0;
    for line in BufReader::new(stderr).lines() {
        if line.unwrap().contains("observer ran") {
            runs += 1;
            if runs == kill_at {
                child.kill().unwrap(); // SIGKILL
                break;
            }
        }
    }
    child.wait().unwrap();
    runs
}

/// Kills `args` at 20 points of its run drawn from `seed` and checks each time that ONE
/// restart of the same command finishes and leaves the export `want` (after `fix`).
fn kill_and_restart_20_times(
    tmp: &Path,
    args: &[&str],
    seed: u64,
    want: &str,
    fix: &dyn Fn(String) -> String,
) {
    // The uninterrupted run: how many observer runs there are to kill between.
    let total = run_and_kill(&tmp.join("whole"), args, usize::MAX, 0);
    assert!(total > 20, "only {total} observer runs");
    assert_eq!(fix(export(&tmp.join("whole"), &tmp.join("whole.jsonl"))), want);
    let mut rng = Rng(seed);
    for i in 0..20 {
        let data = tmp.join(format!("killed{i}"));
        // One point in five is during loading, before any observer ran; the others are spread
        // over the first 90% of the runs (how many runs a crawl takes varies a little).
        let kill_at = if i % 5 == 0 { 0 } else { 1 + rng.below(total as u64 * 9 / 10) as usize };
        let delay_ms = rng.below(40);
        let runs = run_and_kill(&data, args, kill_at, delay_ms);
        assert!(kill_at == 0 || runs == kill_at, "the run ended before it could be killed");
        let mut restart = command(&data, args);
        restart.env("RUST_LOG", "perc_cli=debug,perc_txn=debug,perc_notify=debug");
        let what = format!("the restart after a kill at run {kill_at} (+{delay_ms} ms)");
        let (ok, stderr) = finish_within(&mut restart, &data, Duration::from_secs(60), &what);
        assert!(ok, "{what} failed:\n{stderr}");
        let got = fix(export(&data, &tmp.join(format!("killed{i}.jsonl"))));
        assert_eq!(got, want, "killed at run {kill_at} (+{delay_ms} ms), restarted once");
    }
}

#[test]
fn restart_after_kill9_of_a_crawl_finishes_in_one_run() {
    let tmp = tempfile::tempdir().unwrap();
    let site = Site::start(&root().join("fixtures/sites/demo"));
    let s = seeds(tmp.path(), &[site.base()]);
    let want = std::fs::read_to_string(root().join("fixtures/golden/demo.jsonl")).unwrap();
    let base = site.base();
    kill_and_restart_20_times(
        tmp.path(),
        &["crawl", "--seeds", s.to_str().unwrap()],
        7,
        &want,
        &|e| e.replace(&base, "http://demo.test/"),
    );
}

#[test]
fn restart_after_kill9_of_a_replay_finishes_in_one_run() {
    let tmp = tempfile::tempdir().unwrap();
    let warc = root().join("fixtures/crawls/wget-demo.warc.gz");
    let want = std::fs::read_to_string(root().join("fixtures/golden/wget-demo.jsonl")).unwrap();
    kill_and_restart_20_times(tmp.path(), &["replay", warc.to_str().unwrap()], 11, &want, &|e| e);
}
