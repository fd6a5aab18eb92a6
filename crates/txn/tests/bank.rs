//! The bank test on sled: concurrent transfers between accounts, full-snapshot readers, and
//! transfers that crash at random commit steps (their workers then die). Every snapshot and
//! the final state sum to the initial total, also after the store is reopened.

mod common;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use bytes::Bytes;
use perc_txn::{Clock, CommitStep, SystemClock, TxnConfig, TxnError};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

const ACCOUNTS: usize = 12;
const INITIAL: i64 = 1_000;
const TRANSFER_TASKS: u64 = 4;
const TRANSFERS_EACH: u64 = 400;
const SEED: u64 = 0xBA4C;

fn account(i: usize) -> Bytes {
    Bytes::from(format!("acct{i:02}"))
}

fn config() -> TxnConfig {
    // Short TTLs: a crashed transfer's locks are deregistered at once, and a lock of a
    // stuck one clears within a second.
    TxnConfig {
        lock_ttl_ms: 1_000,
        liveness_ttl_ms: 2_000,
        backoff_max_ms: 20,
        ..TxnConfig::default()
    }
}

fn parse(v: Option<Bytes>) -> Result<i64, TxnError> {
    let v = v.ok_or_else(|| TxnError::Corrupt("account vanished".into()))?;
    Ok(std::str::from_utf8(&v).unwrap().parse().unwrap())
}

async fn snapshot_total(client: &perc_txn::Client) -> Result<i64, TxnError> {
    let t = client.begin().await?;
    let keys: Vec<(Bytes, Bytes)> =
        (0..ACCOUNTS).map(|i| (account(i), Bytes::from_static(b"balance"))).collect();
    let mut total = 0;
    for v in t.get_many(&keys).await? {
        total += parse(v)?;
    }
    Ok(total)
}

#[test]
fn bank_invariant_holds_under_crashes_sled() {
    let dir = tempfile::tempdir().unwrap();
    let rt =
        tokio::runtime::Builder::new_multi_thread().worker_threads(4).enable_all().build().unwrap();
    let crashes = Arc::new(AtomicU64::new(0));
    let snapshots = Arc::new(AtomicU64::new(0));
    rt.block_on(async {
        let store = common::sled_store(dir.path());
        let oracle = common::oracle(&store).await;
        let clock: Arc<dyn Clock> = Arc::new(SystemClock);
        let setup = common::client(&store, &oracle, &clock, config()).await;
        let mut t = setup.begin().await.unwrap();
        for i in 0..ACCOUNTS {
            t.set(account(i), "balance", INITIAL.to_string());
        }
        t.commit().await.unwrap();

        let done = Arc::new(AtomicBool::new(false));
        let mut readers = Vec::new();
        for _ in 0..2 {
            let reader = common::client(&store, &oracle, &clock, config()).await;
            let (done, snapshots) = (done.clone(), snapshots.clone());
            readers.push(tokio::spawn(async move {
                while !done.load(Ordering::Relaxed) {
                    match snapshot_total(&reader).await {
                        Ok(total) => {
                            assert_eq!(
                                total,
                                INITIAL * ACCOUNTS as i64,
                                "a snapshot saw a fractured transfer"
                            );
                            snapshots.fetch_add(1, Ordering::Relaxed);
                        }
                        Err(e) if e.is_retryable() => {}
                        Err(e) => panic!("reader: {e}"),
                    }
                    tokio::task::yield_now().await;
                }
            }));
        }

        let mut writers = Vec::new();
        for w in 0..TRANSFER_TASKS {
            let (store, oracle, clock, crashes) =
                (store.clone(), oracle.clone(), clock.clone(), crashes.clone());
            writers.push(tokio::spawn(async move {
                let mut rng = StdRng::seed_from_u64(SEED + w);
                let mut client = common::client(&store, &oracle, &clock, config()).await;
                let mut done = 0;
                while done < TRANSFERS_EACH {
                    let from = rng.random_range(0..ACCOUNTS);
                    let to = (from + rng.random_range(1..ACCOUNTS)) % ACCOUNTS;
                    let amount = rng.random_range(1..50i64);
                    let crash = rng
                        .random_bool(0.08)
                        .then(|| CommitStep::ALL[rng.random_range(0..CommitStep::ALL.len())]);
                    let result: Result<(), TxnError> = async {
                        let mut t = client.begin().await?;
                        let a = parse(t.get(&account(from), b"balance").await?)?;
                        let b = parse(t.get(&account(to), b"balance").await?)?;
                        t.set(account(from), "balance", (a - amount).to_string());
                        t.set(account(to), "balance", (b + amount).to_string());
                        match crash {
                            None => t.commit().await.map(|_| ()),
                            Some(step) => t.commit_crashing_at(step).await.map(|_| ()),
                        }
                    }
                    .await;
                    match result {
                        Ok(()) => done += 1,
                        Err(e) if e.is_retryable() => {
                            clock.sleep_ms(client.backoff_ms(1)).await;
                            continue;
                        }
                        Err(e) => panic!("transfer: {e}"),
                    }
                    if crash.is_some() {
                        // The process "died" at that step: its worker leaves the registry
                        // and a new one takes over, as a restarted process would.
                        client.deregister().await.unwrap();
                        client = common::client(&store, &oracle, &clock, config()).await;
                        crashes.fetch_add(1, Ordering::Relaxed);
                    }
                }
            }));
        }
        for w in writers {
            w.await.unwrap();
        }
        done.store(true, Ordering::Relaxed);
        for r in readers {
            r.await.unwrap();
        }
        let checker = common::client(&store, &oracle, &clock, config()).await;
        assert_eq!(snapshot_total(&checker).await.unwrap(), INITIAL * ACCOUNTS as i64);
    });
    assert!(crashes.load(Ordering::Relaxed) > 0, "the seed injected no crash");
    assert!(snapshots.load(Ordering::Relaxed) > 0, "no snapshot was taken");

    // Reopen: what is on disk still sums up.
    rt.block_on(async {
        let store = common::sled_store(dir.path());
        let oracle = common::oracle(&store).await;
        let clock: Arc<dyn Clock> = Arc::new(SystemClock);
        let checker = common::client(&store, &oracle, &clock, config()).await;
        assert_eq!(snapshot_total(&checker).await.unwrap(), INITIAL * ACCOUNTS as i64);
    });
}
