//! dedup: content hash and duplicate-cluster membership.
//!
//! - Trigger: `page:hash` of `p:<url>` (strong).
//! - Reads: the hash, and `dedup:registered` (the hash this page is registered under).
//! - Writes: the membership rows `c:<hash>\0<url>` (removes the old one, adds the new one),
//!   and `dedup:registered`.
//! - Notifies: the old and the new cluster heads (`cluster:dirty`, weakly), so canonical
//!   choice runs for both.
//! - Twice is harmless: when the registered hash equals the current one there is nothing to
//!   move and nothing is written.

use async_trait::async_trait;
use bytes::Bytes;
use perc_notify::{Observer, ObserverError};
use perc_txn::Transaction;

use crate::model::{self, col};

pub struct Dedup;

#[async_trait]
impl Observer for Dedup {
    async fn observe(
        &self,
        txn: &mut Transaction,
        row: &Bytes,
        _column: &Bytes,
    ) -> Result<(), ObserverError> {
        let Some(url) = model::url_of(row) else { return Ok(()) };
        let membership = model::Registration {
            key: col::HASH,
            registered: col::HASH_REGISTERED,
            child: model::member,
            child_column: col::MEMBER,
            notify: Some((model::cluster_head, col::CLUSTER_DIRTY)),
        };
        model::reregister(txn, row, url, &membership).await?;
        Ok(())
    }
}
