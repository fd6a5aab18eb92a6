//! The transactional core at work: concurrent transfers between accounts on the durable sled
//! store, with full-snapshot audits running beside them. Run it again and it continues on
//! the same store; the audited total never changes.
//!
//! `cargo run --release -p perc-txn --example bank -- [DATA_DIR]` (default `./data/bank`).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;
use perc_oracle::{LocalOracle, Oracle};
use perc_store::{Counted, Schema, SledOptions, SledStore, Store};
use perc_txn::{Client, Clock, SystemClock, TxnConfig, TxnError};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

const ACCOUNTS: usize = 100;
const INITIAL: i64 = 1_000;
const TASKS: u64 = 8;
const TRANSFERS_EACH: u64 = 500;

fn account(i: usize) -> Bytes {
    Bytes::from(format!("account/{i:03}"))
}

async fn balance(t: &perc_txn::Transaction, i: usize) -> Result<Option<i64>, TxnError> {
    Ok(t.get(&account(i), b"balance")
        .await?
        .map(|v| std::str::from_utf8(&v).unwrap().parse().unwrap()))
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let dir = std::env::args().nth(1).unwrap_or_else(|| "./data/bank".into());
    let mut schema = Schema::new(perc_txn::FAMILIES);
    schema.add(perc_oracle::FAMILY);
    let store = Arc::new(Counted::new(SledStore::open(&dir, schema, &SledOptions::default())?));
    let dyn_store: Arc<dyn Store> = store.clone();
    let oracle: Arc<dyn Oracle> = Arc::new(LocalOracle::open(dyn_store.clone(), 10_000).await?);
    let clock: Arc<dyn Clock> = Arc::new(SystemClock);
    let client =
        Client::new(dyn_store.clone(), oracle.clone(), clock.clone(), TxnConfig::default()).await?;

    // Open the accounts once; a second run finds them.
    let mut t = client.begin().await?;
    if balance(&t, 0).await?.is_none() {
        for i in 0..ACCOUNTS {
            t.set(account(i), "balance", INITIAL.to_string());
        }
        t.commit().await?;
        println!("opened {ACCOUNTS} accounts of {INITIAL} in {dir}");
    } else {
        println!("continuing on the accounts in {dir}");
    }

    let committed = Arc::new(AtomicU64::new(0));
    let conflicts = Arc::new(AtomicU64::new(0));
    let started = Instant::now();
    let mut tasks = Vec::new();
    for k in 0..TASKS {
        let client =
            Client::new(dyn_store.clone(), oracle.clone(), clock.clone(), TxnConfig::default())
                .await?;
        let (committed, conflicts) = (committed.clone(), conflicts.clone());
        tasks.push(tokio::spawn(async move {
            let mut rng = SmallRng::seed_from_u64(k);
            let mut attempt = 0;
            let mut done = 0;
            while done < TRANSFERS_EACH {
                let (from, to) = (rng.random_range(0..ACCOUNTS), rng.random_range(0..ACCOUNTS));
                if from == to {
                    continue;
                }
                let amount = rng.random_range(1..100);
                let result: Result<(), TxnError> = async {
                    let mut t = client.begin().await?;
                    let (a, b) = (
                        balance(&t, from).await?.unwrap_or(0),
                        balance(&t, to).await?.unwrap_or(0),
                    );
                    t.set(account(from), "balance", (a - amount).to_string());
                    t.set(account(to), "balance", (b + amount).to_string());
                    t.commit().await.map(|_| ())
                }
                .await;
                match result {
                    Ok(()) => {
                        done += 1;
                        attempt = 0;
                        committed.fetch_add(1, Ordering::Relaxed);
                    }
                    Err(e) if e.is_retryable() => {
                        conflicts.fetch_add(1, Ordering::Relaxed);
                        client.clock().sleep_ms(client.backoff_ms(attempt)).await;
                        attempt += 1;
                    }
                    Err(e) => return Err(e),
                }
            }
            Ok(())
        }));
    }
    for t in tasks {
        t.await??;
    }
    let secs = started.elapsed().as_secs_f64();

    let audit = client.begin().await?;
    let mut total = 0;
    for i in 0..ACCOUNTS {
        total += balance(&audit, i).await?.unwrap_or(0);
    }
    let ops = store.counts();
    let n = committed.load(Ordering::Relaxed);
    println!(
        "{n} transfers committed in {secs:.2}s ({:.0}/s), {} retried after a conflict",
        n as f64 / secs,
        conflicts.load(Ordering::Relaxed)
    );
    println!("audited total: {total} (expected {})", INITIAL * ACCOUNTS as i64);
    println!(
        "store calls: {} reads, {} conditional mutations, {} batched mutations, {} syncs",
        ops.read_row + ops.read_rows,
        ops.check_and_mutate,
        ops.mutate_rows,
        ops.sync
    );
    client.deregister().await?;
    if total != INITIAL * ACCOUNTS as i64 {
        return Err("the audited total changed".into());
    }
    Ok(())
}
