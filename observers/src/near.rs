//! near: near-duplicate lists (spec §6.4a), kept current through a band index.
//!
//! The band index: four `s:<b><block>` rows per simhash, one per 16-bit block, whose
//! `near:block` cell lists every cluster whose simhash has that block (hash, simhash and
//! canonical URL: the entry). Clusters within 3 bits share a block (pigeonhole), so a
//! cluster's near-duplicates are in its four cells. The entries are written by
//! [`crate::cluster`], which also computes its own cluster's list when its entry changes and
//! tells the clusters near it.
//!
//! - Trigger: `near:dirty` of `c:<hash>` (weak: set by the cluster run of a near-duplicate
//!   whose entry changed: it registered or left, or its canonical moved).
//! - Reads: the head's `near:registered` (its entry) and `near:list`; the `near:block`
//!   cells of its four blocks, in one call.
//! - Writes: `near:list`, the canonical URLs of the other clusters within 3 bits, sorted, the
//!   20 smallest (removed when there are none; readers join it into the canonical's line,
//!   see [`crate::model::full_line`]); only when it changed. Notifies nothing.
//! - Why nothing is missed: every change to an entry is a cluster's choice (a run of
//!   cluster, or [`crate::cluster::found`] in a parse run) that rewrites the block cells
//!   holding it, and those cells are checked, so of two overlapping runs
//!   changing near-duplicate clusters (which share a cell) only one commits: the other
//!   retries and reads the first's entry. A run that changes an entry tells every cluster
//!   near it that it read, and a list read before that change committed belonged to a
//!   cluster whose own entry was committed before the change began (or the two would have
//!   conflicted on their shared cell), so the change read it and told it: its near run runs
//!   again, after the change.
//! - Twice is harmless: the list is a function of the current cells, written only when it
//!   differs.

use async_trait::async_trait;
use bytes::Bytes;
use perc_notify::{Observer, ObserverError};
use perc_txn::Transaction;

use crate::model::{self, col, rows, BlockEntry};

pub struct Near;

#[async_trait]
impl Observer for Near {
    async fn observe(
        &self,
        txn: &mut Transaction,
        row: &Bytes,
        _column: &Bytes,
    ) -> Result<(), ObserverError> {
        let Some(hash) = rows::CLUSTERS.key_of(row) else {
            return Ok(());
        };
        let keys =
            [col::NEAR_REGISTERED, col::NEAR_LIST].map(|c| (row.clone(), Bytes::from_static(c)));
        let [registered, list] =
            <[Option<Bytes>; 2]>::try_from(txn.get_many(&keys).await?).expect("two cells");
        let me = registered.and_then(|r| BlockEntry::from_registered(hash, &r));
        let mut near = Vec::new();
        if let Some(me) = &me {
            let keys = model::blocks(me.simhash).map(|b| (b, Bytes::from_static(col::BLOCK)));
            for cell in txn.get_many(&keys).await?.iter().flatten() {
                model::add_near(&mut near, me, &model::block_entries(cell));
            }
        }
        model::write_near_list(txn, row, list.as_ref(), &near)?;
        Ok(())
    }
}
