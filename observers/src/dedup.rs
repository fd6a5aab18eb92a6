//! dedup: content hash and duplicate-cluster membership.
//!
//! - Runs: in the page's parse run, after parse wrote `page:hash`.
//! - Reads: the hash, and `dedup:registered` (the hash this page is registered under).
//! - Writes: the membership rows `c:<hash>\0<url>` (removes the old one, adds the new one,
//!   whose value is the body's simhash in hex, "" if it has none: the cluster's, since its
//!   members share the body; unchecked, see [`model::reregister`]), and `dedup:registered`.
//! - Then, when the page is the first member of a new cluster, [`cluster::found`] chooses
//!   for it in this transaction.
//! - Notifies: the old cluster head and, unless `found` chose for it, the new one
//!   (`cluster:dirty`, weakly), so canonical choice runs for both.
//! - Twice is harmless: when the registered hash equals the current one there is nothing to
//!   move and nothing is written.

use bytes::Bytes;
use perc_notify::ObserverError;
use perc_txn::Transaction;

use crate::cluster;
use crate::model::{self, col};

/// The stage, in the transaction of the page's parse run: `simhash` is the page's body's.
pub async fn run(
    txn: &mut Transaction,
    row: &Bytes,
    simhash: Option<u64>,
) -> Result<(), ObserverError> {
    let Some(url) = model::url_of(row) else { return Ok(()) };
    let value = Bytes::from(simhash.map(model::simhash_hex).unwrap_or_default());
    let membership = model::Registration {
        key: col::HASH,
        registered: col::HASH_REGISTERED,
        child: model::member,
        child_column: col::MEMBER,
        value: value.clone(),
    };
    let Some(moved) = model::reregister(txn, row, url, &membership).await? else {
        return Ok(());
    };
    let tell = |txn: &mut Transaction, hash: &str| {
        txn.notify(model::cluster_head(hash), Bytes::from_static(col::CLUSTER_DIRTY));
    };
    if !moved.from.is_empty() {
        tell(txn, &moved.from);
    }
    if !moved.to.is_empty() && !cluster::found(txn, &moved.to, url, &value).await? {
        tell(txn, &moved.to);
    }
    Ok(())
}
