//! dedup: content hash and duplicate-cluster membership.
//!
//! - Runs: in the page's parse run, after parse wrote `page:hash`.
//! - Reads: the hash, and `dedup:registered` (the hash this page is registered under).
//! - Writes: the membership rows `c:<hash>\0<url>` (removes the old one, adds the new one,
//!   whose value is the body's simhash in hex, "" if it has none: the cluster's, since its
//!   members share the body; unchecked, see [`model::reregister`]), and `dedup:registered`.
//! - Returns the cluster the page joined, if it moved: the parse run ([`crate::runs`]) then
//!   makes a new cluster's first choice in this transaction ([`crate::cluster::found`]), or
//!   tells the cluster.
//! - Notifies: the old cluster head (`cluster:dirty`, weakly), so canonical choice runs
//!   for it.
//! - Twice is harmless: when the registered hash equals the current one there is nothing to
//!   move and nothing is written.

use bytes::Bytes;
use perc_notify::ObserverError;
use perc_txn::Transaction;

use crate::model::{self, col};

/// The cluster a page joined: its content `hash`, and the member row's value (the body's
/// simhash in hex, "" if it has none).
pub struct Joined {
    pub hash: String,
    pub simhash: Bytes,
}

/// The stage, in the transaction of the page's parse run: `simhash` is the page's body's.
pub async fn run(
    txn: &mut Transaction,
    row: &Bytes,
    simhash: Option<u64>,
) -> Result<Option<Joined>, ObserverError> {
    let Some(url) = model::url_of(row) else { return Ok(None) };
    let value = Bytes::from(simhash.map(model::simhash_hex).unwrap_or_default());
    let membership = model::Registration {
        key: col::HASH,
        registered: col::HASH_REGISTERED,
        child: model::member,
        child_column: col::MEMBER,
        value: value.clone(),
    };
    let Some(moved) = model::reregister(txn, row, url, &membership).await? else {
        return Ok(None);
    };
    if !moved.from.is_empty() {
        model::signals::tell_cluster(txn, &moved.from);
    }
    Ok((!moved.to.is_empty()).then_some(Joined { hash: moved.to, simhash: value }))
}
