//! Runs that fail: counted, retried with backoff, and parked (in the store, so every
//! process sees them) once they fail too often in a row.

use std::collections::HashMap;
use std::sync::atomic::Ordering;

use bytes::Bytes;
use perc_store::{Column, Mutation, RowMutation, Scan, Ts, TsRange};
use perc_txn::TxnError;

use super::{
    notify_delete, Counters, Engine, FailedEntry, Failure, Pending, RunOutcome, FAILED, PARKED,
    PARKED_MOVED_COLUMN, PARKED_MOVED_ROW,
};
use crate::observer::Registration;

impl Engine {
    pub(super) fn failures_lock(
        &self,
    ) -> std::sync::MutexGuard<'_, HashMap<(Bytes, Bytes), Failure>> {
        self.failures.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub(super) async fn succeeded(&self, key: &(Bytes, Bytes)) -> Result<(), TxnError> {
        self.failures_lock().remove(key);
        let was_parked = self.parked.lock().unwrap_or_else(|e| e.into_inner()).remove(key);
        if was_parked {
            let m = Mutation::Delete {
                column: Column::new(PARKED.name, key.1.clone()),
                range: TsRange::ALL,
            };
            self.store()
                .mutate_rows(&[RowMutation { row: key.0.clone(), mutations: vec![m] }])
                .await?;
        }
        Ok(())
    }

    /// Records a failure: back off, or after `failures_max` park the notification.
    pub(super) async fn failed(
        &self,
        reg: &Registration,
        p: &Pending,
        error: String,
        counters: &Counters,
    ) -> Result<RunOutcome, TxnError> {
        let key = (p.row.clone(), p.column.clone());
        let count = {
            let now = self.client.clock().now_ms();
            let mut failures = self.failures_lock();
            let f = failures.entry(key.clone()).or_insert(Failure { count: 0, not_before_ms: 0 });
            f.count += 1;
            let backoff = self.config.failure_backoff_ms.saturating_mul(1 << f.count.min(16));
            f.not_before_ms = now + backoff;
            f.count
        };
        if count < self.config.failures_max {
            return Ok(RunOutcome::Failed);
        }
        let detail = format!("{}: {error}", reg.name);
        let record = Mutation::Put {
            column: Column::new(PARKED.name, p.column.clone()),
            ts: Ts::ZERO,
            value: Bytes::from(detail),
        };
        // The failure record first, flushed: a crash in between leaves the notification
        // pending (run again), never a notification gone with no record of why (unflushed,
        // the delete could survive a crash that the record does not).
        self.store()
            .mutate_rows(&[RowMutation { row: p.row.clone(), mutations: vec![record] }])
            .await?;
        self.store().sync().await?;
        self.store().mutate_rows(&[notify_delete(p)]).await?;
        self.failures_lock().remove(&key);
        self.parked.lock().unwrap_or_else(|e| e.into_inner()).insert(key);
        counters.parked.fetch_add(1, Ordering::Relaxed);
        Ok(RunOutcome::Parked)
    }

    /// Parked notifications, in (row, column) order.
    pub async fn failed_list(&self) -> Result<Vec<FailedEntry>, TxnError> {
        let scan = Scan::whole(PARKED.name, usize::MAX);
        Ok(self
            .store()
            .scan(&scan)
            .await?
            .into_iter()
            .filter(|c| c.row.as_ref() != PARKED_MOVED_ROW)
            .map(|c| FailedEntry {
                row: c.row,
                column: c.qualifier,
                detail: String::from_utf8_lossy(&c.value).into(),
            })
            .collect())
    }

    /// Learns the parked notifications already in the store, so that a later success clears
    /// their record (a worker calls this when it starts). The first call on a store also
    /// moves the records an older perc kept in [`FAILED`].
    pub async fn load_parked(&self) -> Result<(), TxnError> {
        self.move_failed_records().await?;
        let list = self.failed_list().await?;
        let mut parked = self.parked.lock().unwrap_or_else(|e| e.into_inner());
        parked.extend(list.into_iter().map(|f| (f.row, f.column)));
        Ok(())
    }

    /// Moves the parked records of [`FAILED`] into [`PARKED`], once per store: a scan of the
    /// whole table, then a mark that it was done. Copies first and the mark after them, so a
    /// crash in between moves them again (the same cells: harmless); the old records go last.
    pub(super) async fn move_failed_records(&self) -> Result<(), TxnError> {
        let moved = Column::new(PARKED.name, Bytes::from_static(PARKED_MOVED_COLUMN));
        let read = [perc_store::ColumnRead::newest(moved.clone(), TsRange::ALL)];
        let row = Bytes::from_static(PARKED_MOVED_ROW);
        if self.store().read_row(&row, &read).await?.iter().any(|v| !v.is_empty()) {
            return Ok(());
        }
        let scan = Scan::whole(FAILED.name, usize::MAX);
        let old = self.store().scan(&scan).await?;
        let put = |c: &perc_store::ScanCell| RowMutation {
            row: c.row.clone(),
            mutations: vec![Mutation::Put {
                column: Column::new(PARKED.name, c.qualifier.clone()),
                ts: Ts::ZERO,
                value: c.value.clone(),
            }],
        };
        let mut copies: Vec<RowMutation> = old.iter().map(put).collect();
        copies.push(RowMutation {
            row,
            mutations: vec![Mutation::Put { column: moved, ts: Ts::ZERO, value: Bytes::new() }],
        });
        self.store().mutate_rows(&copies).await?;
        // The copies durable before the old records go.
        self.store().sync().await?;
        if !old.is_empty() {
            tracing::info!(
                records = old.len(),
                "moved the parked notifications to their own family"
            );
            let deletes: Vec<RowMutation> = old
                .iter()
                .map(|c| RowMutation {
                    row: c.row.clone(),
                    mutations: vec![Mutation::Delete {
                        column: Column::new(FAILED.name, c.qualifier.clone()),
                        range: TsRange::ALL,
                    }],
                })
                .collect();
            self.store().mutate_rows(&deletes).await?;
        }
        Ok(())
    }
}
