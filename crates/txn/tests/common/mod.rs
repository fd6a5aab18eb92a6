//! Helpers shared by the transaction tests: stores with the transaction schema, clients.
#![allow(dead_code)]

use std::path::Path;
use std::sync::Arc;

use perc_oracle::{LocalOracle, Oracle};
use perc_store::{Counted, MemStore, Schema, SledOptions, SledStore, Store};
use perc_txn::{Client, Clock, ManualClock, TxnConfig, TxnError};

pub fn schema() -> Schema {
    let mut schema = Schema::new(perc_txn::FAMILIES);
    schema.add(perc_oracle::FAMILY);
    schema
}

pub fn mem_store() -> Arc<dyn Store> {
    Arc::new(MemStore::new(schema()))
}

pub fn sled_store(dir: &Path) -> Arc<dyn Store> {
    Arc::new(SledStore::open(dir, schema(), &SledOptions::default()).expect("open sled"))
}

/// A small oracle block, so that reservations happen during the tests too.
pub async fn oracle(store: &Arc<dyn Store>) -> Arc<dyn Oracle> {
    Arc::new(LocalOracle::open(store.clone(), 16).await.expect("oracle"))
}

pub async fn client(
    store: &Arc<dyn Store>,
    oracle: &Arc<dyn Oracle>,
    clock: &Arc<dyn Clock>,
    config: TxnConfig,
) -> Client {
    Client::new(store.clone(), oracle.clone(), clock.clone(), config).await.expect("client")
}

/// An in-memory store, its oracle and a manual clock: what a test's clients share.
pub async fn mem_parts() -> (Arc<dyn Store>, Arc<dyn Oracle>, Arc<dyn Clock>) {
    let store = mem_store();
    let oracle = oracle(&store).await;
    (store, oracle, Arc::new(ManualClock::new(1_000_000)))
}

/// A client (a manual clock, the default configuration) on an in-memory store that counts
/// its calls, and that store.
pub async fn counted_client() -> (Arc<Counted<Arc<dyn Store>>>, Client) {
    let counted = Arc::new(Counted::new(mem_store()));
    let store: Arc<dyn Store> = counted.clone();
    let oracle = oracle(&store).await;
    let clock: Arc<dyn Clock> = Arc::new(ManualClock::new(1_000_000));
    (counted, client(&store, &oracle, &clock, TxnConfig::default()).await)
}

/// Runs `body` in fresh transactions until it commits or fails for a reason other than
/// concurrency; returns its commit timestamp.
pub async fn retry<F, Fut>(client: &Client, mut body: F) -> Result<(), TxnError>
where
    F: FnMut(perc_txn::Transaction) -> Fut,
    Fut: std::future::Future<Output = Result<(), TxnError>>,
{
    let mut attempt = 0;
    loop {
        let txn = client.begin().await?;
        match body(txn).await {
            Ok(()) => return Ok(()),
            Err(e) if e.is_retryable() => {
                client.clock().sleep_ms(client.backoff_ms(attempt)).await;
                attempt += 1;
            }
            Err(e) => return Err(e),
        }
    }
}
