//! Group commit of the small unconditional writes: a store wrapper that merges `mutate_rows`
//! calls made concurrently into one call to the store below. While every lane (a merged call
//! in flight; one to a few) is busy, the calls that arrive queue up; when a lane frees, the
//! first of them sends everything queued as the next call, and each caller gets the outcome
//! of the call that carried its rows. Nobody waits for a timer: a lone caller's call goes out
//! at once. Every other operation passes through.
//!
//! Why it is safe: `mutate_rows` promises atomicity per row and nothing across rows or calls,
//! and calls that overlap in time have no order between them to keep. A merged call keeps
//! each caller's rows in the caller's order. On Bigtable a merged call is one `MutateRows`
//! RPC for many observer runs' notify cells, notification clears and secondary commits.

use std::sync::Mutex;

use async_trait::async_trait;
use tokio::sync::watch;

use crate::{
    Cell, ColumnRead, Condition, Mutation, Result, RowMutation, RowRead, Scan, ScanCell, Schema,
    Store, StoreError,
};

pub struct Coalesced<S> {
    inner: S,
    queue: Mutex<Queue>,
    /// Merged calls in flight at most; FIFO, so every caller gets its turn.
    lanes: tokio::sync::Semaphore,
}

/// Rows waiting for the next call, and the channel their callers wait on.
#[derive(Default)]
struct Queue {
    rows: Vec<RowMutation>,
    next: Option<watch::Sender<Option<Result<()>>>>,
    /// How many batches were taken: a caller whose batch number is still current finds its
    /// rows queued.
    taken: u64,
}

impl<S: Store> Coalesced<S> {
    /// One merged call in flight at a time.
    pub fn new(inner: S) -> Self {
        Self::with_lanes(inner, 1)
    }

    /// Up to `lanes` merged calls in flight (at least one): a backend whose calls run in
    /// parallel (Bigtable's RPCs, sled's writes from several threads) keeps them busy, and
    /// the calls queued meanwhile still go out together.
    pub fn with_lanes(inner: S, lanes: usize) -> Self {
        Coalesced {
            inner,
            queue: Mutex::new(Queue::default()),
            lanes: tokio::sync::Semaphore::new(lanes.max(1)),
        }
    }

    async fn merged(&self, rows: &[RowMutation]) -> Result<()> {
        let (mut outcome, batch_no) = {
            let mut q = self.queue.lock().unwrap_or_else(|e| e.into_inner());
            q.rows.extend_from_slice(rows);
            (q.next.get_or_insert_with(|| watch::channel(None).0).subscribe(), q.taken)
        };
        let lane = self.lanes.acquire().await.expect("the semaphore is never closed");
        // Still queued (no call took them while we waited for a lane): these rows and all
        // queued with them go now.
        let mine = {
            let mut q = self.queue.lock().unwrap_or_else(|e| e.into_inner());
            (q.taken == batch_no).then(|| {
                q.taken += 1;
                (std::mem::take(&mut q.rows), q.next.take().expect("this caller's channel"))
            })
        };
        if let Some((batch, tx)) = mine {
            let done = self.inner.mutate_rows(&batch).await;
            let _ = tx.send(Some(done.clone()));
            return done;
        }
        // Another caller's call carries them: wait for its outcome, holding no lane.
        drop(lane);
        loop {
            if let Some(done) = outcome.borrow_and_update().clone() {
                return done;
            }
            if outcome.changed().await.is_err() {
                // The call that took these rows was dropped before it could send them.
                return Err(StoreError::Io {
                    backend: "coalesce",
                    detail: "a merged write was abandoned before it was sent".into(),
                });
            }
        }
    }
}

#[async_trait]
impl<S: Store> Store for Coalesced<S> {
    fn schema(&self) -> &Schema {
        self.inner.schema()
    }

    async fn read_row(&self, row: &[u8], reads: &[ColumnRead]) -> Result<Vec<Vec<Cell>>> {
        self.inner.read_row(row, reads).await
    }

    async fn read_rows(&self, rows: &[RowRead]) -> Result<Vec<Vec<Vec<Cell>>>> {
        self.inner.read_rows(rows).await
    }

    async fn check_and_mutate(
        &self,
        row: &[u8],
        conditions: &[Condition],
        mutations: &[Mutation],
    ) -> Result<bool> {
        self.inner.check_and_mutate(row, conditions, mutations).await
    }

    async fn mutate_rows(&self, rows: &[RowMutation]) -> Result<()> {
        if rows.is_empty() {
            return Ok(());
        }
        self.merged(rows).await
    }

    async fn scan(&self, scan: &Scan) -> Result<Vec<ScanCell>> {
        self.inner.scan(scan).await
    }

    async fn scan_many(&self, scans: &[Scan]) -> Result<Vec<Vec<ScanCell>>> {
        self.inner.scan_many(scans).await
    }

    async fn sync(&self) -> Result<()> {
        self.inner.sync().await
    }

    async fn maintain(&self) -> Result<()> {
        self.inner.maintain().await
    }
}
