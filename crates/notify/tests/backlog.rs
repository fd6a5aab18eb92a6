//! The framework under a backlog: runs that wait on the network never hold the permits of
//! the runs that compute, and the backlog says how long each observer's oldest pending
//! notification has waited.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use bytes::Bytes;
use perc_notify::{
    client_for, Engine, NotifyConfig, NotifyKind, Observer, ObserverError, Registry,
};
use perc_oracle::{LocalOracle, Oracle};
use perc_store::{MemStore, Store};
use perc_txn::{Client, Clock, ManualClock, SystemClock, Transaction, TxnConfig};

/// Waits for the gate on every run, as a fetch waits for a slow host.
struct Waits {
    gate: Arc<tokio::sync::Semaphore>,
    started: AtomicU64,
}

#[async_trait]
impl Observer for Waits {
    async fn observe(
        &self,
        _: &mut Transaction,
        _: &Bytes,
        _: &Bytes,
    ) -> Result<(), ObserverError> {
        self.started.fetch_add(1, Ordering::SeqCst);
        let _ = self.gate.acquire().await.expect("never closed");
        Ok(())
    }

    fn waits_on_io(&self) -> bool {
        true
    }
}

/// Writes what it was told to its row.
struct Quick;

#[async_trait]
impl Observer for Quick {
    async fn observe(
        &self,
        txn: &mut Transaction,
        row: &Bytes,
        column: &Bytes,
    ) -> Result<(), ObserverError> {
        let v = txn.get(row, column).await?.unwrap_or_default();
        txn.set(row.clone(), "quick:out", v);
        Ok(())
    }
}

async fn client(store: &Arc<dyn Store>, clock: Arc<dyn Clock>, registry: &Arc<Registry>) -> Client {
    let oracle: Arc<dyn Oracle> = Arc::new(LocalOracle::open(store.clone(), 64).await.unwrap());
    client_for(store.clone(), oracle, clock, TxnConfig::default(), registry.clone()).await.unwrap()
}

async fn write(c: &Client, row: String, column: &str) {
    let mut t = c.begin().await.unwrap();
    t.set(row, column.to_string(), "v".to_string());
    t.commit().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn runs_that_wait_on_the_network_never_take_the_permits_of_those_that_compute() {
    let gate = Arc::new(tokio::sync::Semaphore::new(0));
    let waits = Arc::new(Waits { gate: gate.clone(), started: AtomicU64::new(0) });
    let mut r = Registry::new();
    r.register("slow", "slow:in", NotifyKind::Strong, waits.clone()).unwrap();
    r.register("quick", "quick:in", NotifyKind::Strong, Arc::new(Quick)).unwrap();
    let registry = Arc::new(r);
    let store: Arc<dyn Store> = Arc::new(MemStore::new(perc_notify::schema()));
    let c = client(&store, Arc::new(SystemClock), &registry).await;
    // The waiting runs' rows come first in the scan: each would take a permit and hold it.
    for i in 0..20 {
        write(&c, format!("a{i:02}"), "slow:in").await;
    }
    for i in 0..5 {
        write(&c, format!("z{i}"), "quick:in").await;
    }
    let config = NotifyConfig {
        scanners: 1,
        concurrency: 2,
        io_concurrency: 2,
        idle_ms: 5,
        ..NotifyConfig::default()
    };
    let engine = Arc::new(Engine::new(c.clone(), registry.clone(), config));
    let workers = perc_notify::Workers::start(engine.clone(), &tokio::runtime::Handle::current());
    // Every quick run commits while the waiting runs hold their two permits.
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let quick = engine.stats().into_iter().find(|s| s.name == "quick").unwrap();
        if quick.commits == 5 {
            break;
        }
        assert!(Instant::now() < deadline, "the waiting runs held up the others: {quick:?}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(waits.started.load(Ordering::SeqCst), 2, "two waiting runs at once, no more");
    // The host answers: every waiting run finishes.
    gate.add_permits(1_000);
    workers.wait().await.unwrap();
    workers.shutdown().await;
    let slow = engine.stats().into_iter().find(|s| s.name == "slow").unwrap();
    assert_eq!(slow.runs, 20, "{slow:?}");
}

#[tokio::test]
async fn the_backlog_says_how_long_the_oldest_notification_of_each_observer_waited() {
    let mut r = Registry::new();
    r.register("quick", "quick:in", NotifyKind::Strong, Arc::new(Quick)).unwrap();
    let registry = Arc::new(r);
    let store: Arc<dyn Store> = Arc::new(MemStore::new(perc_notify::schema()));
    let clock = Arc::new(ManualClock::new(1_000_000));
    let c = client(&store, clock.clone(), &registry).await;
    let engine = Engine::new(c.clone(), registry.clone(), NotifyConfig::default());
    assert!(engine.backlog(100).await.unwrap().is_empty());
    write(&c, "a".into(), "quick:in").await;
    // Read a moment later (the engine's samples of the time are a second apart at least):
    // it has waited no longer than that.
    clock.advance_ms(1_000);
    let now = engine.backlog(100).await.unwrap();
    assert_eq!((now["quick"].pending, now["quick"].oldest_ms), (1, 0));
    clock.advance_ms(5_000);
    write(&c, "b".into(), "quick:in").await;
    let later = engine.backlog(100).await.unwrap();
    assert_eq!(later["quick"].pending, 2);
    assert_eq!(later["quick"].oldest_ms, 5_000, "the older one's age");
    // Once they have run, nothing waits; a new one's age is its own.
    engine.step().await.unwrap();
    assert!(engine.backlog(100).await.unwrap().is_empty());
    clock.advance_ms(1_000);
    write(&c, "c".into(), "quick:in").await;
    clock.advance_ms(1_000);
    assert_eq!(engine.backlog(100).await.unwrap()["quick"].oldest_ms, 0);
    clock.advance_ms(2_000);
    let after = engine.backlog(100).await.unwrap();
    assert_eq!((after["quick"].pending, after["quick"].oldest_ms), (1, 2_000));
}
