//! forward: anchor forwarding to the canonical (SPEC §6.4): the canonical page carries the
//! inlinks of every member of its cluster (and of their aliases).
//!
//! - Trigger: `fwd:dirty` of `p:<url>` (weak: set by cluster when the page's canonical, or
//!   the canonical and the names this reads, changed).
//! - Reads: the page's `page:canonical` and `dedup:registered` (the cluster dedup put it in:
//!   cluster tells us about registrations, not about a passing `page:hash` dedup has not
//!   handled yet), the cluster's members, and each member's `indeg:names`.
//! - Writes: `fwd:names` = the union of the members' names (pages and aliases), sorted, if
//!   the page is its cluster's canonical; otherwise removes it. The inlinks themselves stay in
//!   their `e:` rows, where invert keeps them current; readers join them through these
//!   names, so an inlink that changes costs no rewrite here, however many the page has.
//! - Notifies: nobody (the export line's inlinks are joined when it is read).
//! - Twice is harmless: a function of the current rows, written only when different.

use async_trait::async_trait;
use bytes::Bytes;
use perc_notify::{Observer, ObserverError};
use perc_txn::Transaction;

use crate::cluster::members;
use crate::model::{self, col};

pub struct Forward;

#[async_trait]
impl Observer for Forward {
    async fn observe(
        &self,
        txn: &mut Transaction,
        row: &Bytes,
        _column: &Bytes,
    ) -> Result<(), ObserverError> {
        let Some(url) = model::url_of(row) else { return Ok(()) };
        let canonical = txn.get(row, col::CANONICAL).await?.unwrap_or_default();
        // The cluster dedup registered the page in, which is the one cluster reads and tells
        // us about: the page's current hash may be a passing one dedup has not seen yet.
        let hash =
            String::from_utf8_lossy(&txn.get(row, col::HASH_REGISTERED).await?.unwrap_or_default())
                .into_owned();
        if hash.is_empty() || canonical != url.as_bytes() {
            model::delete_if_present(txn, row, col::FWD_NAMES).await?;
            return Ok(());
        }
        let members = members(txn, &hash).await?;
        let keys: Vec<(Bytes, Bytes)> =
            members.iter().map(|m| (model::page(m), Bytes::from_static(col::NAMES))).collect();
        let all = model::names_union(txn.get_many(&keys).await?.iter().flatten())?;
        model::set_json_if_changed(txn, row, col::FWD_NAMES, &all).await?;
        Ok(())
    }
}
