//! Outcomes of a transaction that are not its success.
//!
//! Two kinds, kept apart (sled's and toyDB's habit): conflicts and lock waits are ordinary
//! outcomes of concurrency, which the caller retries with a new transaction
//! ([`TxnError::is_retryable`]); store, oracle and corruption errors stop the operation.

use bytes::Bytes;
use perc_oracle::OracleError;
use perc_store::{StoreError, Ts};

use crate::record::ClientId;

/// Bytes shown as text where they are text, escaped where they are not.
pub(crate) fn show(b: &Bytes) -> String {
    b.escape_ascii().to_string()
}

#[derive(Debug, thiserror::Error)]
pub enum TxnError {
    #[error(
        "write conflict on {}/{}: the transaction started at {start_ts} but a write committed \
         at {conflicting_commit_ts}",
        show(row),
        show(column)
    )]
    WriteConflict { row: Bytes, column: Bytes, start_ts: Ts, conflicting_commit_ts: Ts },

    #[error(
        "lock conflict on {}/{}: the transaction started at {start_ts} met a lock of \
         {lock_ts} held by {owner}",
        show(row),
        show(column)
    )]
    LockConflict { row: Bytes, column: Bytes, start_ts: Ts, lock_ts: Ts, owner: ClientId },

    #[error(
        "gave up waiting after {waited_ms} ms for the lock of {lock_ts} on {}/{} held by the \
         live worker {owner}",
        show(row),
        show(column)
    )]
    LockWaitTimeout { row: Bytes, column: Bytes, lock_ts: Ts, owner: ClientId, waited_ms: u64 },

    #[error("the transaction that started at {start_ts} was rolled back before it committed")]
    RolledBack { start_ts: Ts },

    #[error(transparent)]
    Store(#[from] StoreError),

    #[error(transparent)]
    Oracle(#[from] OracleError),

    #[error("corrupt transaction record: {0}")]
    Corrupt(String),
}

impl TxnError {
    /// The store's device is full (directly, or under the oracle): no retry helps until
    /// space is freed, so whoever meets it stops the run.
    pub fn out_of_space(&self) -> Option<&StoreError> {
        match self {
            TxnError::Store(e @ StoreError::OutOfSpace { .. })
            | TxnError::Oracle(OracleError::Store(e @ StoreError::OutOfSpace { .. })) => Some(e),
            _ => None,
        }
    }

    /// True for the outcomes of concurrency: retrying in a new transaction may succeed.
    pub fn is_retryable(&self) -> bool {
        matches!(
            self,
            TxnError::WriteConflict { .. }
                | TxnError::LockConflict { .. }
                | TxnError::LockWaitTimeout { .. }
                | TxnError::RolledBack { .. }
        )
    }
}

/// An error that may say "try again in a new transaction": [`TxnError`], and the errors of
/// layers above that wrap it ([`Client::retrying`](crate::Client::retrying) retries them).
pub trait Retryable {
    fn is_retryable(&self) -> bool;
}

impl Retryable for TxnError {
    fn is_retryable(&self) -> bool {
        TxnError::is_retryable(self)
    }
}
