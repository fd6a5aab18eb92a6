//! The observer API and the registry of observers.
//!
//! An observer has a name and one trigger column, strong or weak (Fluo's rule: one observer
//! per column keeps "did this column change since the observer last ran" a single question).
//! The framework calls it with a fresh transaction, the row and the column; it reads and
//! writes through that transaction only, and the framework commits it together with the
//! observer's ack.

use std::collections::BTreeMap;
use std::sync::Arc;

use async_trait::async_trait;
use bytes::Bytes;
use perc_txn::{Transaction, TxnError, Watch};

/// How an observer is notified.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum NotifyKind {
    /// A transactional write of the column sets the notify cell; the observer runs when the
    /// column's newest commit is newer than its last run.
    Strong,
    /// Only explicit weak notifications ([`Transaction::notify`]) fire it: no write, so no
    /// conflicts on hot rows. It runs when a notification is newer than its last run.
    Weak,
}

/// Why an observer run did not succeed.
#[derive(Debug, thiserror::Error)]
pub enum ObserverError {
    /// From the transaction: conflicts are retried, other errors count as failures.
    #[error(transparent)]
    Txn(#[from] TxnError),
    /// The observer's own failure; counted, retried with backoff, and parked if it persists.
    #[error("{0}")]
    Failed(String),
}

#[async_trait]
pub trait Observer: Send + Sync + 'static {
    /// Handles a change of `column` in `row`, reading and writing through `txn`.
    async fn observe(
        &self,
        txn: &mut Transaction,
        row: &Bytes,
        column: &Bytes,
    ) -> Result<(), ObserverError>;

    /// Whether its runs spend their time waiting on the network rather than computing: the
    /// workers give such runs permits of their own (`workers.io_concurrency`).
    fn waits_on_io(&self) -> bool {
        false
    }
}

/// One registered observer.
#[derive(Clone)]
pub struct Registration {
    pub name: String,
    pub column: Bytes,
    pub kind: NotifyKind,
    pub observer: Arc<dyn Observer>,
    /// The order of registration: observers registered earlier are upstream of later ones
    /// (under load, a weak notification waits longer while earlier stages have work; see
    /// the workers' gathering).
    pub stage: usize,
}

impl Registration {
    /// The transactional column holding the start_ts of this observer's last run, per row.
    pub fn ack_column(&self) -> Bytes {
        ack_column(&self.name)
    }
}

/// Columns whose name starts with this belong to the framework.
pub const RESERVED_PREFIX: &[u8] = b"perc.";

pub fn ack_column(observer: &str) -> Bytes {
    Bytes::from(format!("perc.ack:{observer}"))
}

/// Writes, in `txn`, the ack a committed run of `observer` on `row` writes: the transaction's
/// start_ts. The engine does this for every run it commits; a stage that does, in another
/// observer's transaction, all that a run of `observer` on `row` would do calls it too. Such
/// a transaction is then that run: notifications of `row` no newer than its start are
/// settled by it, and a run of `observer` on `row` that overlaps it writes the same cell, so
/// one of the two does not commit.
pub fn record_run(txn: &mut Transaction, row: &Bytes, observer: &str) {
    let start = Bytes::copy_from_slice(&txn.start_ts().0.to_be_bytes());
    txn.set(row.clone(), ack_column(observer), start);
}

#[derive(Debug, thiserror::Error)]
pub enum RegistryError {
    #[error("column {column:?} already has observer {existing:?}; one observer per column")]
    ColumnTaken { column: String, existing: String },
    #[error("observer name {0:?} is used twice")]
    NameTaken(String),
    #[error("column {0:?} is reserved for the framework (prefix \"perc.\")")]
    Reserved(String),
}

/// The observers of a process, by trigger column. Implements [`Watch`], so a client built
/// with it sets notify cells for exactly the strongly observed columns.
#[derive(Default)]
pub struct Registry {
    by_column: BTreeMap<Bytes, Registration>,
}

impl Registry {
    pub fn new() -> Registry {
        Registry::default()
    }

    pub fn register(
        &mut self,
        name: impl Into<String>,
        column: impl Into<Bytes>,
        kind: NotifyKind,
        observer: Arc<dyn Observer>,
    ) -> Result<(), RegistryError> {
        let (name, column) = (name.into(), column.into());
        let show = |c: &Bytes| c.escape_ascii().to_string();
        if column.starts_with(RESERVED_PREFIX) {
            return Err(RegistryError::Reserved(show(&column)));
        }
        if let Some(existing) = self.by_column.get(&column) {
            return Err(RegistryError::ColumnTaken {
                column: show(&column),
                existing: existing.name.clone(),
            });
        }
        if self.by_column.values().any(|r| r.name == name) {
            return Err(RegistryError::NameTaken(name));
        }
        let stage = self.by_column.len();
        self.by_column.insert(column.clone(), Registration { name, column, kind, observer, stage });
        Ok(())
    }

    pub fn get(&self, column: &[u8]) -> Option<&Registration> {
        self.by_column.get(column)
    }

    /// Every observer, in column order.
    pub fn all(&self) -> impl Iterator<Item = &Registration> {
        self.by_column.values()
    }
}

impl Watch for Registry {
    fn watches(&self, column: &[u8]) -> bool {
        self.by_column.get(column).is_some_and(|r| r.kind == NotifyKind::Strong)
    }
}
