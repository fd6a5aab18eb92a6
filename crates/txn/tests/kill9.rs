//! A commit acknowledged to a caller survives `kill -9`.
//!
//! The test re-runs its own binary as a child (selected by an environment variable) that
//! commits transactions on sled and prints each commit once it is acknowledged; the parent
//! SIGKILLs it mid-stream, reopens the store, and finds every acknowledged commit, its
//! secondaries included. Two kill cycles on the same store, so recovery is also followed by
//! more work.

mod common;

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::sync::Arc;

use perc_txn::{Clock, SystemClock, TxnConfig};

const CHILD_ENV: &str = "PERC_KILL9_CHILD_DIR";

/// In the child: commit forever, printing acknowledgements. In a normal run: nothing.
#[test]
fn kill9_child() {
    let Ok(dir) = std::env::var(CHILD_ENV) else { return };
    let first: u64 = std::env::var("PERC_KILL9_FIRST").unwrap().parse().unwrap();
    let rt =
        tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    rt.block_on(async move {
        let store = common::sled_store(std::path::Path::new(&dir));
        let oracle = common::oracle(&store).await;
        let clock: Arc<dyn Clock> = Arc::new(SystemClock);
        let client = common::client(&store, &oracle, &clock, TxnConfig::default()).await;
        for i in first.. {
            let mut t = client.begin().await.unwrap();
            // Two rows: the primary and a secondary, both must survive.
            t.set(format!("a{i:06}"), "c", i.to_string());
            t.set(format!("b{i:06}"), "c", i.to_string());
            t.commit().await.unwrap();
            println!("acked {i}");
        }
    });
}

fn run_child_and_kill(dir: &std::path::Path, first: u64, acks_before_kill: usize) -> Vec<u64> {
    let exe = std::env::current_exe().unwrap();
    let mut child = Command::new(exe)
        .args(["--exact", "kill9_child", "--nocapture", "--test-threads=1"])
        .env(CHILD_ENV, dir)
        .env("PERC_KILL9_FIRST", first.to_string())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut acked = Vec::new();
    let stdout = child.stdout.take().unwrap();
    for line in BufReader::new(stdout).lines() {
        let line = line.unwrap();
        if let Some(n) = line.strip_prefix("acked ") {
            acked.push(n.parse().unwrap());
            if acked.len() >= acks_before_kill {
                child.kill().unwrap(); // SIGKILL
                break;
            }
        }
    }
    child.wait().unwrap();
    assert_eq!(acked.len(), acks_before_kill, "the child stopped early");
    acked
}

#[test]
fn acknowledged_commits_survive_kill9() {
    let dir = tempfile::tempdir().unwrap();
    let mut all_acked = Vec::new();
    let mut next = 0;
    for cycle in 0..2 {
        let acked = run_child_and_kill(dir.path(), next, 150 + cycle * 50);
        next = acked.last().unwrap() + 1_000; // leave a gap so cycles never overlap
        all_acked.extend(acked);
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        rt.block_on(async {
            let store = common::sled_store(dir.path());
            let oracle = common::oracle(&store).await;
            // Read "a minute later": the killed worker's heartbeat and locks are stale by
            // then, so whatever it left half-done is resolved rather than waited on.
            let later = SystemClock.now_ms() + 60_000;
            let clock: Arc<dyn Clock> = Arc::new(perc_txn::ManualClock::new(later));
            let client = common::client(&store, &oracle, &clock, TxnConfig::default()).await;
            let t = client.begin().await.unwrap();
            for i in &all_acked {
                for prefix in ["a", "b"] {
                    let got = t.get(format!("{prefix}{i:06}").as_bytes(), b"c").await.unwrap();
                    assert_eq!(
                        got.as_deref(),
                        Some(i.to_string().as_bytes()),
                        "cycle {cycle}: commit {prefix}{i} lost"
                    );
                }
            }
        });
    }
}
