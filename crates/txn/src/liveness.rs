//! The worker liveness registry: a row per live worker, refreshed while it works.
//!
//! The paper keeps worker liveness in Chubby; perc keeps it in the store, so it needs nothing
//! else: row `<worker id>` of family `worker` holds the worker's last heartbeat (wall ms) and
//! its *low watermark*, a timestamp no transaction of this worker, running or future, starts
//! below. A lock's owner counts as dead when its row is missing (deregistered, or never
//! written) or its heartbeat is older than `liveness_ttl_ms`; only then, or when the lock
//! itself is older than its TTL (an owner alive but stuck), may another worker clean the lock
//! up. Garbage collection reads every live worker's low watermark: versions that only
//! transactions below the smallest one could read are garbage.
//!
//! Beside them the row says, for people and for `perc status`, when the worker started, how
//! many notification scanners it runs (0: it only loads or queries), and the process it
//! belongs to (the id of that process's main client: a process registers more than one).
//!
//! ```text
//!   family "worker"   row "000000000000002a"
//!   heartbeat@0 = wall_ms (8 B) ++ low_watermark (8 B) ++ started_ms (8 B) ++ scanners (4 B)
//!                 ++ process (8 B)
//! ```
//!
//! (A row of 16 bytes, from an older perc, reads as started at its heartbeat, no scanners.)
//!
//! The family is a locality group of its own: reading the registry ([`Liveness::workers`],
//! which every collection pass and every process start does) then reads only the registry.
//! In the row's atomic unit, as it was, a scan of it was a scan of the whole table on sled:
//! every row record read and decoded to find a few heartbeats (seconds on a big store).
//! Nothing needs it there: a heartbeat is written unconditionally and read alone. Rows an
//! older perc registered in the rows tree are no longer seen, which is what a worker that
//! deregistered looks like: an embedded store forgets its workers at open anyway.

use std::sync::Arc;

use bytes::Bytes;
use perc_store::{
    Column, ColumnRead, FamilySpec, Locality, Mutation, RowMutation, Scan, Store, Ts, TsRange,
};

use crate::clock::Clock;
use crate::record::ClientId;
use crate::TxnError;

pub const FAMILY: FamilySpec = FamilySpec { name: "worker", locality: Locality::Own };

fn row(worker: ClientId) -> Bytes {
    worker.hex()
}

fn column() -> Column {
    Column::new(FAMILY.name, Bytes::from_static(b"heartbeat"))
}

/// A registered worker as the registry shows it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WorkerEntry {
    pub worker: ClientId,
    pub heartbeat_ms: u64,
    pub low_watermark: Ts,
    pub about: About,
}

/// What a heartbeat says of its worker besides its liveness.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct About {
    /// When it registered (wall ms).
    pub started_ms: u64,
    /// Notification scanners it runs: 0 for a process that only loads or queries.
    pub scanners: u32,
    /// The process it belongs to, named by that process's main client.
    pub process: ClientId,
    /// What that process is, in its owner's word (empty: not said).
    pub kind: ProcessKind,
}

/// What a process is, in a word its owner chooses ("serve", "worker"): up to
/// [`ProcessKind::MAX`] bytes of UTF-8, cut at a character boundary.
#[derive(Clone, Copy, Default, PartialEq, Eq)]
pub struct ProcessKind {
    len: u8,
    bytes: [u8; ProcessKind::MAX],
}

impl ProcessKind {
    pub const MAX: usize = 15;

    pub fn new(word: &str) -> ProcessKind {
        let mut len = word.len().min(ProcessKind::MAX);
        while !word.is_char_boundary(len) {
            len -= 1;
        }
        let mut bytes = [0; ProcessKind::MAX];
        bytes[..len].copy_from_slice(&word.as_bytes()[..len]);
        ProcessKind { len: len as u8, bytes }
    }

    pub fn as_str(&self) -> &str {
        // Made from a `&str` cut at a boundary, or decoded and checked.
        std::str::from_utf8(&self.bytes[..usize::from(self.len)]).unwrap_or("")
    }
}

impl std::fmt::Debug for ProcessKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::Debug::fmt(self.as_str(), f)
    }
}

#[derive(Clone)]
pub struct Liveness {
    store: Arc<dyn Store>,
    clock: Arc<dyn Clock>,
    ttl_ms: u64,
}

fn decode(worker: ClientId, raw: &[u8]) -> Result<WorkerEntry, TxnError> {
    // 16 bytes: heartbeat and watermark; 36: and what it is about; then its kind's word.
    let kind = raw.get(36..).map(std::str::from_utf8);
    let corrupt = || TxnError::Corrupt(format!("heartbeat of {worker}: {} bytes", raw.len()));
    if raw.len() != 16 && (raw.len() < 36 || raw.len() > 36 + ProcessKind::MAX) {
        return Err(corrupt());
    }
    let u64_at = |i: usize| u64::from_be_bytes(raw[i..i + 8].try_into().unwrap());
    let heartbeat_ms = u64_at(0);
    let about = match kind {
        Some(kind) => About {
            started_ms: u64_at(16),
            scanners: u32::from_be_bytes(raw[24..28].try_into().unwrap()),
            process: ClientId(u64_at(28)),
            kind: ProcessKind::new(kind.map_err(|_| corrupt())?),
        },
        None => About {
            started_ms: heartbeat_ms,
            scanners: 0,
            process: worker,
            kind: ProcessKind::default(),
        },
    };
    Ok(WorkerEntry { worker, heartbeat_ms, low_watermark: Ts(u64_at(8)), about })
}

impl Liveness {
    pub fn new(store: Arc<dyn Store>, clock: Arc<dyn Clock>, ttl_ms: u64) -> Liveness {
        Liveness { store, clock, ttl_ms }
    }

    pub fn ttl_ms(&self) -> u64 {
        self.ttl_ms
    }

    /// Writes `worker`'s heartbeat at the current wall time, with its low watermark, as a
    /// process of its own that started now and runs no scanners.
    pub async fn heartbeat(&self, worker: ClientId, low_watermark: Ts) -> Result<(), TxnError> {
        let about = About {
            started_ms: self.clock.now_ms(),
            scanners: 0,
            process: worker,
            kind: ProcessKind::default(),
        };
        self.heartbeat_with(worker, low_watermark, about).await
    }

    /// Writes `worker`'s heartbeat at the current wall time: its low watermark and `about`.
    pub async fn heartbeat_with(
        &self,
        worker: ClientId,
        low_watermark: Ts,
        about: About,
    ) -> Result<(), TxnError> {
        let now = self.clock.now_ms();
        let mut value = Vec::with_capacity(36 + ProcessKind::MAX);
        value.extend_from_slice(&now.to_be_bytes());
        value.extend_from_slice(&low_watermark.0.to_be_bytes());
        value.extend_from_slice(&about.started_ms.to_be_bytes());
        value.extend_from_slice(&about.scanners.to_be_bytes());
        value.extend_from_slice(&about.process.0.to_be_bytes());
        value.extend_from_slice(about.kind.as_str().as_bytes());
        let m = Mutation::Put { column: column(), ts: Ts::ZERO, value: value.into() };
        self.store.mutate_rows(&[RowMutation { row: row(worker), mutations: vec![m] }]).await?;
        Ok(())
    }

    /// Removes `worker` from the registry: from now on its locks may be cleaned at once.
    pub async fn deregister(&self, worker: ClientId) -> Result<(), TxnError> {
        let m = Mutation::Delete { column: column(), range: TsRange::ALL };
        self.store.mutate_rows(&[RowMutation { row: row(worker), mutations: vec![m] }]).await?;
        Ok(())
    }

    /// Removes every worker from the registry, so that the locks they left may be cleaned at
    /// once. Only for a store this process holds exclusively (the embedded one): then every
    /// worker registered before it opened the store belongs to a process that has ended,
    /// however fresh its last heartbeat looks. Returns how many there were.
    pub async fn forget_all(&self) -> Result<usize, TxnError> {
        let gone: Vec<RowMutation> = self
            .workers()
            .await?
            .into_iter()
            .map(|(entry, _)| RowMutation {
                row: row(entry.worker),
                mutations: vec![Mutation::Delete { column: column(), range: TsRange::ALL }],
            })
            .collect();
        if !gone.is_empty() {
            self.store.mutate_rows(&gone).await?;
        }
        Ok(gone.len())
    }

    fn fresh(&self, entry: &WorkerEntry) -> bool {
        self.clock.now_ms().saturating_sub(entry.heartbeat_ms) <= self.ttl_ms
    }

    /// Whether `worker` has a heartbeat younger than the TTL.
    pub async fn is_alive(&self, worker: ClientId) -> Result<bool, TxnError> {
        let got = self
            .store
            .read_row(&row(worker), &[ColumnRead::newest(column(), TsRange::ALL)])
            .await?;
        match got[0].first() {
            None => Ok(false),
            Some(cell) => Ok(self.fresh(&decode(worker, &cell.value)?)),
        }
    }

    /// Every registered worker, live or not, in id order.
    pub async fn workers(&self) -> Result<Vec<(WorkerEntry, bool)>, TxnError> {
        let scan = Scan::whole(FAMILY.name, usize::MAX);
        let mut out = Vec::new();
        for cell in self.store.scan(&scan).await? {
            let id = ClientId::from_hex(&cell.row)
                .ok_or_else(|| TxnError::Corrupt(format!("worker row {:?}", cell.row)))?;
            let entry = decode(id, &cell.value)?;
            let alive = self.fresh(&entry);
            out.push((entry, alive));
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ManualClock;

    #[tokio::test]
    async fn a_heartbeat_says_what_its_process_is_and_older_ones_still_read() {
        let store: Arc<dyn Store> =
            Arc::new(perc_store::MemStore::new(perc_store::Schema::new(crate::FAMILIES)));
        let clock = Arc::new(ManualClock::new(1_000));
        let liveness = Liveness::new(store.clone(), clock, 5_000);
        let about = About {
            started_ms: 7,
            scanners: 2,
            process: ClientId(9),
            kind: ProcessKind::new("serve"),
        };
        liveness.heartbeat_with(ClientId(3), Ts(4), about).await.unwrap();
        let (entry, alive) = liveness.workers().await.unwrap()[0];
        assert!(alive);
        assert_eq!(entry.about, about);
        assert_eq!(entry.about.kind.as_str(), "serve");

        // A heartbeat written before processes said their kind (36 bytes) reads as unsaid.
        let mut raw = vec![0u8; 36];
        raw[..8].copy_from_slice(&1_000u64.to_be_bytes());
        assert_eq!(decode(ClientId(3), &raw).unwrap().about.kind.as_str(), "");
        // A word too long is cut at a character boundary; bytes beyond the bound are corrupt.
        assert_eq!(ProcessKind::new("replay-and-index-é").as_str(), "replay-and-inde");
        assert_eq!(ProcessKind::new("abcdefghijklmné").as_str(), "abcdefghijklmn");
        assert!(decode(ClientId(3), &[0u8; 36 + ProcessKind::MAX + 1]).is_err());
        assert!(decode(ClientId(3), &[0u8; 20]).is_err());
    }
}
