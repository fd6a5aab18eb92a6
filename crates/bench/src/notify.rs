//! The observer framework's figures: notifications processed per second by a trivial
//! observer on sled, and what one scan of the notifications costs as the table grows.

use std::sync::Arc;
use std::time::Instant;

use anyhow::Result;
use async_trait::async_trait;
use bytes::Bytes;
use perc_notify::{
    client_for, Engine, NotifyConfig, NotifyKind, Observer, ObserverError, Registry, Workers,
};
use perc_oracle::{LocalOracle, Oracle};
use perc_store::{Counted, SledOptions, SledStore, Store};
use perc_txn::{Client, Clock, SystemClock, Transaction, TxnConfig};

use crate::table::{rate, scaled, Table};

/// Writes one cell: the least an observer can do and still commit.
struct Trivial;

#[async_trait]
impl Observer for Trivial {
    async fn observe(
        &self,
        txn: &mut Transaction,
        row: &Bytes,
        _: &Bytes,
    ) -> Result<(), ObserverError> {
        txn.set(row.clone(), "out", "1");
        Ok(())
    }
}

struct Setup {
    _dir: tempfile::TempDir,
    store: Arc<Counted<Arc<dyn Store>>>,
    oracle: Arc<dyn Oracle>,
    clock: Arc<dyn Clock>,
    registry: Arc<Registry>,
}

async fn setup() -> Result<Setup> {
    let dir = tempfile::tempdir()?;
    let sled: Arc<dyn Store> =
        Arc::new(SledStore::open(dir.path(), perc_notify::schema(), &SledOptions::default())?);
    let store = Arc::new(Counted::new(sled));
    let dyn_store: Arc<dyn Store> = store.clone();
    let oracle: Arc<dyn Oracle> = Arc::new(LocalOracle::open(dyn_store, 1_000_000).await?);
    let mut registry = Registry::new();
    registry.register("trivial", "in", NotifyKind::Strong, Arc::new(Trivial))?;
    Ok(Setup {
        _dir: dir,
        store,
        oracle,
        clock: Arc::new(SystemClock),
        registry: Arc::new(registry),
    })
}

impl Setup {
    async fn client(&self) -> Result<Client> {
        let store: Arc<dyn Store> = self.store.clone();
        Ok(client_for(
            store,
            self.oracle.clone(),
            self.clock.clone(),
            TxnConfig::default(),
            self.registry.clone(),
        )
        .await?)
    }

    /// Writes `column` on rows `from..to`, 100 rows a transaction.
    async fn fill(&self, client: &Client, from: u64, to: u64, column: &'static str) -> Result<()> {
        let mut i = from;
        while i < to {
            let mut t = client.begin().await?;
            for k in i..(i + 100).min(to) {
                t.set(format!("row{k:08}"), column, "x");
            }
            t.commit().await?;
            i += 100;
        }
        Ok(())
    }
}

pub fn run(scale: f64) -> Result<()> {
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?;
    rt.block_on(async {
        println!("# perc-bench notify (scale {scale}; 2 worker threads; sled 0.34 in a temp dir)");
        throughput(scale).await?;
        scan_cost(scale).await
    })
}

async fn throughput(scale: f64) -> Result<()> {
    let mut t = Table::new();
    let n = scaled(20_000, scale);
    for mode in ["step (1 task)", "workers (2 scanners, 16 runs in flight)"] {
        let s = setup().await?;
        let writer = s.client().await?;
        s.fill(&writer, 0, n, "in").await?;
        let config = NotifyConfig { gc_interval_ms: 0, ..NotifyConfig::default() };
        let engine = Arc::new(Engine::new(s.client().await?, s.registry.clone(), config));
        let before = s.store.counts();
        let start = Instant::now();
        if mode.starts_with("step") {
            engine.run_until_quiet().await?;
        } else {
            let workers = Workers::start(engine.clone(), &tokio::runtime::Handle::current());
            workers.wait().await?;
            workers.shutdown().await;
        }
        let secs = start.elapsed().as_secs_f64();
        let ops = s.store.counts();
        let commits: u64 = engine.stats().iter().map(|x| x.commits).sum();
        anyhow::ensure!(commits == n, "expected {n} runs, got {commits}");
        let per = (ops.row_ops() - before.row_ops()) as f64 / n as f64;
        let syncs = (ops.sync - before.sync) as f64 / n as f64;
        t.add(
            format!("notifications/s, trivial observer, {mode}"),
            rate(n, secs),
            format!("{n} notifications; {per:.1} store calls + {syncs:.2} syncs each"),
        );
    }
    t.print("notification processing on sled (each run: begin, read ack and column, write ack and one cell, commit, clear)");
    Ok(())
}

/// One full pass over the notify family, with few notifications among many or few rows.
async fn scan_cost(scale: f64) -> Result<()> {
    let mut t = Table::new();
    let pending = 100u64;
    let mut per_pass = Vec::new();
    for rows in [scaled(1_000, scale), scaled(100_000, scale)] {
        let s = setup().await?;
        let writer = s.client().await?;
        // Rows of data nobody watches, then notifications spread among them.
        s.fill(&writer, 0, rows, "data").await?;
        let step = rows / pending;
        let mut t_ = writer.begin().await?;
        for k in 0..pending {
            t_.set(format!("row{:08}", k * step), "in", "x");
        }
        t_.commit().await?;
        let engine = Engine::new(s.client().await?, s.registry.clone(), NotifyConfig::default());
        let passes = 200u32;
        let before = s.store.counts();
        let start = Instant::now();
        for _ in 0..passes {
            let mut from = Bytes::new();
            let mut seen = 0;
            loop {
                let (batch, next) = engine.scan(&from, 512).await?;
                seen += batch.len();
                match next {
                    Some(n) => from = n,
                    None => break,
                }
            }
            anyhow::ensure!(seen as u64 == pending, "scan saw {seen}");
        }
        let us = start.elapsed().as_secs_f64() * 1e6 / f64::from(passes);
        let calls = (s.store.counts().scan - before.scan) as f64 / f64::from(passes);
        per_pass.push(us);
        t.add(
            format!("one scan pass, {rows} rows, {pending} pending"),
            format!("{us:.0} µs"),
            format!("{calls:.0} scan call(s) per pass"),
        );
    }
    t.add(
        "pass time at 100k rows / at 1k rows",
        format!("{:.2}x", per_pass[1] / per_pass[0]),
        "1.0 = the cost follows notifications, not rows",
    );
    t.print("scanning for notifications (the notify family is its own sled tree)");
    Ok(())
}
