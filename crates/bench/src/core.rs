//! The transactional core's figures: sled store operations by kind, 2-row read-modify-write
//! transactions against the raw store operations they need, and the oracle.

use std::sync::Arc;
use std::time::Instant;

use anyhow::Result;
use bytes::Bytes;
use perc_oracle::{LocalOracle, Oracle};
use perc_store::{
    Column, ColumnRead, Condition, Counted, Mutation, RowMutation, Scan, Schema, SledOptions,
    SledStore, Store, Ts, TsRange,
};
use perc_txn::{Client, Clock, SystemClock, TxnConfig};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

use crate::table::{rate, scaled, Table};

fn schema() -> Schema {
    let mut s = Schema::new(perc_txn::FAMILIES);
    s.add(perc_oracle::FAMILY);
    s
}

fn open() -> Result<(tempfile::TempDir, Arc<Counted<SledStore>>)> {
    let dir = tempfile::tempdir()?;
    let store = SledStore::open(dir.path(), schema(), &SledOptions::default())?;
    Ok((dir, Arc::new(Counted::new(store))))
}

fn row(i: u64) -> Bytes {
    Bytes::from(format!("row{i:08}"))
}

fn value() -> Bytes {
    Bytes::from(vec![b'v'; 100])
}

fn col() -> Column {
    Column::new("data", Bytes::from_static(b"c"))
}

pub fn run(scale: f64) -> Result<()> {
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?;
    rt.block_on(async {
        println!("# perc-bench core (scale {scale}; 2 worker threads; sled 0.34 in a temp dir)");
        store_ops(scale).await?;
        transactions(scale).await?;
        oracle(scale).await?;
        Ok(())
    })
}

/// Single-task store operations on sled, by kind.
async fn store_ops(scale: f64) -> Result<()> {
    let (_dir, store) = open()?;
    let n = scaled(100_000, scale);
    let c = col();
    let mut t = Table::new();

    let start = Instant::now();
    for i in 0..n {
        let m = Mutation::Put { column: c.clone(), ts: Ts(1), value: value() };
        store.mutate_rows(&[RowMutation { row: row(i), mutations: vec![m] }]).await?;
    }
    t.add(
        "mutate_rows, 1 row, insert",
        rate(n, start.elapsed().as_secs_f64()),
        "unconditional, 100-byte value",
    );

    let start = Instant::now();
    for i in 0..n {
        store.read_row(&row(i), &[ColumnRead::newest(c.clone(), TsRange::ALL)]).await?;
    }
    t.add("read_row, 1 column", rate(n, start.elapsed().as_secs_f64()), "hit, newest version");

    let start = Instant::now();
    for i in 0..n {
        let cond = [Condition::NoCellIn { column: c.clone(), range: TsRange::from(Ts(2)) }];
        let m = [Mutation::Put { column: c.clone(), ts: Ts(2), value: value() }];
        assert!(store.check_and_mutate(&row(i), &cond, &m).await?);
    }
    t.add(
        "check_and_mutate",
        rate(n, start.elapsed().as_secs_f64()),
        "condition holds; row gains a version",
    );

    let start = Instant::now();
    for i in 0..n {
        let got = store.read_row(&row(i), &[ColumnRead::newest(c.clone(), TsRange::ALL)]).await?;
        let ts = got[0][0].ts;
        let cond = [Condition::CellAt { column: c.clone(), ts }];
        let m = [Mutation::Delete { column: c.clone(), range: TsRange::at(Ts(1)) }];
        store.check_and_mutate(&row(i), &cond, &m).await?;
    }
    t.add(
        "read_row + check_and_mutate",
        rate(n, start.elapsed().as_secs_f64()),
        "read-modify-write of one row",
    );

    let batch = 100;
    let start = Instant::now();
    for b in 0..n / batch {
        let rows: Vec<RowMutation> = (0..batch)
            .map(|k| RowMutation {
                row: row(n + b * batch + k),
                mutations: vec![Mutation::Put { column: c.clone(), ts: Ts(1), value: value() }],
            })
            .collect();
        store.mutate_rows(&rows).await?;
    }
    t.add(
        "mutate_rows, 100-row batches",
        rate(n / batch * batch, start.elapsed().as_secs_f64()),
        "rows/s",
    );

    let start = Instant::now();
    let cells = scan_all(&store).await?;
    t.add(
        "scan (1000 cells a call)",
        rate(cells, start.elapsed().as_secs_f64()),
        "cells/s, whole table",
    );
    synced_writes(&mut t, &store, scale).await?;
    t.print("sled store operations (1 task unless noted)");
    Ok(())
}

/// Every cell of the `data` family, 1,000 a call; how many.
async fn scan_all(store: &Counted<SledStore>) -> Result<u64> {
    let mut cells = 0;
    let mut from = Bytes::new();
    loop {
        let got = store
            .scan(&Scan { family: "data", start: from.clone(), end: Bytes::new(), limit: 1000 })
            .await?;
        cells += got.len() as u64;
        match got.last() {
            Some(last) if got.len() == 1000 => {
                from = Bytes::from([last.row.as_ref(), b"\0"].concat())
            }
            _ => break,
        }
    }
    Ok(cells)
}

/// Durable writes: one task syncing after each, then 32 tasks sharing flushes.
async fn synced_writes(t: &mut Table, store: &Arc<Counted<SledStore>>, scale: f64) -> Result<()> {
    let c = col();
    let syncs = scaled(2_000, scale);
    let start = Instant::now();
    for i in 0..syncs {
        let m = Mutation::Put { column: c.clone(), ts: Ts(3), value: value() };
        store.mutate_rows(&[RowMutation { row: row(i), mutations: vec![m] }]).await?;
        store.sync().await?;
    }
    t.add(
        "write + sync, 1 task",
        rate(syncs, start.elapsed().as_secs_f64()),
        "durable writes; one flush each",
    );

    let tasks = 32u64;
    let start = Instant::now();
    let mut handles = Vec::new();
    for k in 0..tasks {
        let (store, c) = (store.clone(), col());
        handles.push(tokio::spawn(async move {
            for i in 0..syncs / 4 {
                let m = Mutation::Put { column: c.clone(), ts: Ts(4), value: value() };
                store
                    .mutate_rows(&[RowMutation { row: row(i * tasks + k), mutations: vec![m] }])
                    .await?;
                store.sync().await?;
            }
            anyhow::Ok(())
        }));
    }
    for h in handles {
        h.await??;
    }
    t.add(
        format!("write + sync, {tasks} tasks"),
        rate(syncs / 4 * tasks, start.elapsed().as_secs_f64()),
        "durable writes; group commit shares flushes",
    );
    Ok(())
}

async fn rmw_txn(client: &Client, a: u64, b: u64) -> Result<bool> {
    let mut t = client.begin().await?;
    let keys = [(row(a), Bytes::from_static(b"c")), (row(b), Bytes::from_static(b"c"))];
    let got = t.get_many(&keys).await?;
    let n = |v: &Option<Bytes>| -> u64 {
        v.as_ref().map(|v| std::str::from_utf8(v).unwrap().parse().unwrap()).unwrap_or(0)
    };
    let (x, y) = (n(&got[0]), n(&got[1]));
    t.set(keys[0].0.clone(), keys[0].1.clone(), (x + 1).to_string());
    t.set(keys[1].0.clone(), keys[1].1.clone(), (y + 1).to_string());
    match t.commit().await {
        Ok(_) => Ok(true),
        Err(e) if e.is_retryable() => Ok(false),
        Err(e) => Err(e.into()),
    }
}

/// The same logical work without transactions: read both rows, write both back, sync.
async fn rmw_raw(store: &dyn Store, a: u64, b: u64) -> Result<()> {
    let c = Column::new("data", Bytes::from_static(b"raw"));
    for r in [a, b] {
        let got = store.read_row(&row(r), &[ColumnRead::newest(c.clone(), TsRange::ALL)]).await?;
        let ts = got[0].first().map(|c| c.ts).unwrap_or(Ts::ZERO);
        let m = [Mutation::Put { column: c.clone(), ts: ts.next(), value: value() }];
        store.check_and_mutate(&row(r), &[], &m).await?;
    }
    store.sync().await?;
    Ok(())
}

/// A counted store, and the directory it lives in (none for mem).
type Opened = (Option<tempfile::TempDir>, Arc<Counted<Arc<dyn Store>>>);

/// A fresh store of either backend, counted.
fn open_backend(backend: &str) -> Result<Opened> {
    Ok(match backend {
        "sled" => {
            let dir = tempfile::tempdir()?;
            let store: Arc<dyn Store> =
                Arc::new(SledStore::open(dir.path(), schema(), &SledOptions::default())?);
            (Some(dir), Arc::new(Counted::new(store)))
        }
        _ => {
            let store: Arc<dyn Store> = Arc::new(perc_store::MemStore::new(schema()));
            (None, Arc::new(Counted::new(store)))
        }
    })
}

/// 2-row read-modify-write transactions, and the raw operations they need: on sled, durable
/// (each commit and each raw RMW syncs); on mem, where sync is free, the protocol's CPU cost.
async fn transactions(scale: f64) -> Result<()> {
    let mut t = Table::new();
    let keys = 10_000u64;
    for (backend, tasks) in [("sled", 1u64), ("sled", 32), ("mem", 1), ("mem", 32)] {
        let n = scaled(if backend == "sled" && tasks == 1 { 3_000 } else { 20_000 }, scale);
        let (_dir, store) = open_backend(backend)?;
        let dyn_store: Arc<dyn Store> = store.clone();
        let oracle: Arc<dyn Oracle> =
            Arc::new(LocalOracle::open(dyn_store.clone(), 1_000_000).await?);
        let clock: Arc<dyn Clock> = Arc::new(SystemClock);

        // Raw first, on its own column, so both runs see a store of the same size.
        let start = Instant::now();
        let mut handles = Vec::new();
        for k in 0..tasks {
            let store = dyn_store.clone();
            handles.push(tokio::spawn(async move {
                let mut rng = SmallRng::seed_from_u64(k);
                for _ in 0..n / tasks {
                    let a = rng.random_range(0..keys);
                    rmw_raw(store.as_ref(), a, (a + 1 + rng.random_range(0..keys - 1)) % keys)
                        .await?;
                }
                anyhow::Ok(())
            }));
        }
        for h in handles {
            h.await??;
        }
        let raw_secs = start.elapsed().as_secs_f64();

        let before = store.counts();
        let start = Instant::now();
        let mut handles = Vec::new();
        for k in 0..tasks {
            let client =
                Client::new(dyn_store.clone(), oracle.clone(), clock.clone(), TxnConfig::default())
                    .await?;
            handles.push(tokio::spawn(async move {
                let mut rng = SmallRng::seed_from_u64(k);
                let (mut committed, mut conflicts) = (0u64, 0u64);
                for _ in 0..n / tasks {
                    let a = rng.random_range(0..keys);
                    if rmw_txn(&client, a, (a + 1 + rng.random_range(0..keys - 1)) % keys).await? {
                        committed += 1;
                    } else {
                        conflicts += 1;
                    }
                }
                anyhow::Ok((committed, conflicts))
            }));
        }
        let (mut committed, mut conflicts) = (0, 0);
        for h in handles {
            let (c, x) = h.await??;
            committed += c;
            conflicts += x;
        }
        let txn_secs = start.elapsed().as_secs_f64();
        let after = store.counts();
        let attempts = (n / tasks * tasks) as f64;
        let ops = (after.row_ops() - before.row_ops()) as f64 / attempts;
        let syncs = (after.sync - before.sync) as f64 / attempts;
        t.add(
            format!("{backend}: 2-row RMW transactions, {tasks} task(s)"),
            rate(committed, txn_secs),
            format!("{conflicts} conflicts; {ops:.1} store calls + {syncs:.2} syncs per txn"),
        );
        t.add(
            format!("{backend}: raw 2-row RMW (2 reads, 2 writes, 1 sync), {tasks} task(s)"),
            rate(n / tasks * tasks, raw_secs),
            "same keys, no transaction",
        );
        t.add(
            format!("{backend}: transaction cost / raw cost, {tasks} task(s)"),
            format!(
                "{:.2}x",
                (txn_secs / committed as f64) / (raw_secs / (n / tasks * tasks) as f64)
            ),
            "time per committed txn over time per raw RMW (target <= 3x)",
        );
    }
    t.print("2-row read-modify-write transactions against the raw store operations they need");
    Ok(())
}

async fn oracle(scale: f64) -> Result<()> {
    let mut t = Table::new();
    let (_dir, store) = open()?;
    let dyn_store: Arc<dyn Store> = store;
    let oracle = Arc::new(LocalOracle::open(dyn_store, 1_000_000).await?);
    let n = scaled(20_000_000, scale);
    let start = Instant::now();
    let mut last = Ts::ZERO;
    for _ in 0..n {
        let ts = oracle.next().await?;
        debug_assert!(ts > last);
        last = ts;
    }
    t.add(
        "oracle.next(), 1 task",
        rate(n, start.elapsed().as_secs_f64()),
        "in-process; target >= 10 M/s",
    );
    for tasks in [8u64, 64] {
        let start = Instant::now();
        let mut handles = Vec::new();
        for _ in 0..tasks {
            let oracle = oracle.clone();
            handles.push(tokio::spawn(async move {
                for _ in 0..n / tasks {
                    oracle.next().await?;
                }
                anyhow::Ok(())
            }));
        }
        for h in handles {
            h.await??;
        }
        t.add(
            format!("oracle.next(), {tasks} tasks"),
            rate(n / tasks * tasks, start.elapsed().as_secs_f64()),
            "2 threads",
        );
    }
    let start = Instant::now();
    for _ in 0..n / 100 {
        oracle.next_batch(100).await?;
    }
    t.add(
        "oracle.next_batch(100), 1 task",
        rate(n / 100 * 100, start.elapsed().as_secs_f64()),
        "timestamps/s",
    );
    t.print("timestamp oracle");
    Ok(())
}
