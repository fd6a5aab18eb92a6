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
        let hash = txn.get(row, col::HASH).await?.unwrap_or_default();
        let registered = txn.get(row, col::DEDUP_DONE).await?.unwrap_or_default();
        if hash == registered {
            return Ok(());
        }
        let (old, new) = (
            String::from_utf8_lossy(&registered).into_owned(),
            String::from_utf8_lossy(&hash).into_owned(),
        );
        if !old.is_empty() {
            txn.delete(model::member(&old, url), Bytes::from_static(col::MEMBER));
            txn.notify(model::cluster_head(&old), Bytes::from_static(col::CLUSTER_DIRTY));
        }
        if !new.is_empty() {
            txn.set(model::member(&new, url), Bytes::from_static(col::MEMBER), Bytes::new());
            txn.notify(model::cluster_head(&new), Bytes::from_static(col::CLUSTER_DIRTY));
        }
        txn.set(row.clone(), Bytes::from_static(col::DEDUP_DONE), hash);
        Ok(())
    }
}
