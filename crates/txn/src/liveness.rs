//! The worker liveness registry: a row per live worker, refreshed while it holds locks.
//!
//! The paper keeps worker liveness in Chubby; perc keeps it in the store, so it needs nothing
//! else: row `<worker id>` of family `worker` holds the worker's last heartbeat (wall ms).
//! A lock's owner counts as dead when its row is missing (deregistered, or never written) or
//! its heartbeat is older than `liveness_ttl_ms`. Only then, or when the lock itself is older
//! than its TTL (an owner alive but stuck), may another worker clean the lock up.

use std::sync::Arc;

use bytes::Bytes;
use perc_store::{
    Column, ColumnRead, FamilySpec, Locality, Mutation, RowMutation, Store, Ts, TsRange,
};

use crate::clock::Clock;
use crate::record::WorkerId;
use crate::TxnError;

pub const FAMILY: FamilySpec = FamilySpec { name: "worker", locality: Locality::Row };

fn row(worker: WorkerId) -> Bytes {
    Bytes::from(format!("{:016x}", worker.0))
}

fn column() -> Column {
    Column::new(FAMILY.name, Bytes::from_static(b"heartbeat"))
}

#[derive(Clone)]
pub struct Liveness {
    store: Arc<dyn Store>,
    clock: Arc<dyn Clock>,
    ttl_ms: u64,
}

impl Liveness {
    pub fn new(store: Arc<dyn Store>, clock: Arc<dyn Clock>, ttl_ms: u64) -> Liveness {
        Liveness { store, clock, ttl_ms }
    }

    pub fn ttl_ms(&self) -> u64 {
        self.ttl_ms
    }

    /// Writes `worker`'s heartbeat at the current wall time.
    pub async fn heartbeat(&self, worker: WorkerId) -> Result<(), TxnError> {
        let now = self.clock.now_ms();
        let m = Mutation::Put {
            column: column(),
            ts: Ts::ZERO,
            value: Bytes::copy_from_slice(&now.to_be_bytes()),
        };
        self.store.mutate_rows(&[RowMutation { row: row(worker), mutations: vec![m] }]).await?;
        Ok(())
    }

    /// Removes `worker` from the registry: from now on its locks may be cleaned at once.
    pub async fn deregister(&self, worker: WorkerId) -> Result<(), TxnError> {
        let m = Mutation::Delete { column: column(), range: TsRange::ALL };
        self.store.mutate_rows(&[RowMutation { row: row(worker), mutations: vec![m] }]).await?;
        Ok(())
    }

    /// Whether `worker` has a heartbeat younger than the TTL.
    pub async fn is_alive(&self, worker: WorkerId) -> Result<bool, TxnError> {
        let got = self
            .store
            .read_row(&row(worker), &[ColumnRead::newest(column(), TsRange::ALL)])
            .await?;
        let Some(cell) = got[0].first() else {
            return Ok(false);
        };
        let beat: [u8; 8] = cell
            .value
            .as_ref()
            .try_into()
            .map_err(|_| TxnError::Corrupt(format!("heartbeat of {}", worker)))?;
        let beat = u64::from_be_bytes(beat);
        Ok(self.clock.now_ms().saturating_sub(beat) <= self.ttl_ms)
    }
}
