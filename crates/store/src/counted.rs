//! A store wrapper that counts operations by kind: the figure behind "store operations per
//! transaction" and "per indexed page" in the benchmarks. Each trait call is one operation,
//! the unit a Bigtable RPC would be; a batched call counts once, and its rows are counted
//! apart. Scans are also counted by family (the notification scanners' against the rest).

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use async_trait::async_trait;

use crate::{
    Cell, ColumnRead, Condition, Mutation, Result, RowMutation, RowRead, Scan, ScanCell, Schema,
    Store,
};

/// A snapshot of the counters.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct OpCounts {
    pub read_row: u64,
    pub read_rows: u64,
    pub check_and_mutate: u64,
    pub mutate_rows: u64,
    pub scan: u64,
    pub sync: u64,
    /// Rows touched by the batched calls.
    pub batched_rows: u64,
}

impl OpCounts {
    /// Every call, batched or not, except `sync` (a flush, not a row operation).
    pub fn row_ops(&self) -> u64 {
        self.read_row + self.read_rows + self.check_and_mutate + self.mutate_rows + self.scan
    }
}

#[derive(Default)]
struct Counters {
    read_row: AtomicU64,
    read_rows: AtomicU64,
    check_and_mutate: AtomicU64,
    mutate_rows: AtomicU64,
    scan: AtomicU64,
    sync: AtomicU64,
    batched_rows: AtomicU64,
    scans_by_family: Mutex<BTreeMap<&'static str, u64>>,
}

pub struct Counted<S> {
    inner: S,
    counters: Counters,
}

impl<S: Store> Counted<S> {
    pub fn new(inner: S) -> Self {
        Counted { inner, counters: Counters::default() }
    }

    pub fn inner(&self) -> &S {
        &self.inner
    }

    /// Scans of `family` so far (each of a `scan_many` counted).
    pub fn scans_of(&self, family: &str) -> u64 {
        let by_family = self.counters.scans_by_family.lock().unwrap_or_else(|e| e.into_inner());
        by_family.get(family).copied().unwrap_or(0)
    }

    pub fn counts(&self) -> OpCounts {
        let c = &self.counters;
        OpCounts {
            read_row: c.read_row.load(Ordering::Relaxed),
            read_rows: c.read_rows.load(Ordering::Relaxed),
            check_and_mutate: c.check_and_mutate.load(Ordering::Relaxed),
            mutate_rows: c.mutate_rows.load(Ordering::Relaxed),
            scan: c.scan.load(Ordering::Relaxed),
            sync: c.sync.load(Ordering::Relaxed),
            batched_rows: c.batched_rows.load(Ordering::Relaxed),
        }
    }
}

fn bump(c: &AtomicU64, n: u64) {
    c.fetch_add(n, Ordering::Relaxed);
}

#[async_trait]
impl<S: Store> Store for Counted<S> {
    fn schema(&self) -> &Schema {
        self.inner.schema()
    }
    async fn read_row(&self, row: &[u8], reads: &[ColumnRead]) -> Result<Vec<Vec<Cell>>> {
        bump(&self.counters.read_row, 1);
        self.inner.read_row(row, reads).await
    }
    async fn read_rows(&self, rows: &[RowRead]) -> Result<Vec<Vec<Vec<Cell>>>> {
        bump(&self.counters.read_rows, 1);
        bump(&self.counters.batched_rows, rows.len() as u64);
        self.inner.read_rows(rows).await
    }
    async fn check_and_mutate(
        &self,
        row: &[u8],
        conditions: &[Condition],
        mutations: &[Mutation],
    ) -> Result<bool> {
        bump(&self.counters.check_and_mutate, 1);
        self.inner.check_and_mutate(row, conditions, mutations).await
    }
    async fn mutate_rows(&self, rows: &[RowMutation]) -> Result<()> {
        bump(&self.counters.mutate_rows, 1);
        bump(&self.counters.batched_rows, rows.len() as u64);
        self.inner.mutate_rows(rows).await
    }
    async fn scan(&self, scan: &Scan) -> Result<Vec<ScanCell>> {
        bump(&self.counters.scan, 1);
        *self
            .counters
            .scans_by_family
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .entry(scan.family)
            .or_default() += 1;
        self.inner.scan(scan).await
    }
    async fn scan_many(&self, scans: &[Scan]) -> Result<Vec<Vec<ScanCell>>> {
        bump(&self.counters.scan, 1);
        {
            let mut by_family =
                self.counters.scans_by_family.lock().unwrap_or_else(|e| e.into_inner());
            for scan in scans {
                *by_family.entry(scan.family).or_default() += 1;
            }
        }
        self.inner.scan_many(scans).await
    }
    async fn sync(&self) -> Result<()> {
        bump(&self.counters.sync, 1);
        self.inner.sync().await
    }
    async fn maintain(&self) -> Result<()> {
        self.inner.maintain().await
    }
}
