//! alias: a redirect's source becomes an alias of its target.
//!
//! - Trigger: `page:redirect` of `p:<source>` (strong).
//! - Reads: the redirect target ("" if none), and `alias:done` (the target recorded last time).
//! - Writes: `r:<target>\0<source>` (removing the old target's row), and `alias:done`.
//! - Notifies: the old and new targets' `rank:dirty` (weakly): their alias sets, and so their
//!   in-degrees and inlinks, changed (parse tells the source's own rank). Chains (a → b → c) resolve in rank, hop by hop.
//! - Twice is harmless: nothing changes when the target equals `alias:done`.

use async_trait::async_trait;
use bytes::Bytes;
use perc_notify::{Observer, ObserverError};
use perc_txn::Transaction;

use crate::model::{self, col};

pub struct Alias;

#[async_trait]
impl Observer for Alias {
    async fn observe(
        &self,
        txn: &mut Transaction,
        row: &Bytes,
        _column: &Bytes,
    ) -> Result<(), ObserverError> {
        let Some(source) = model::url_of(row) else { return Ok(()) };
        let target = txn.get(row, col::REDIRECT).await?.unwrap_or_default();
        let done = txn.get(row, col::ALIAS_DONE).await?.unwrap_or_default();
        if target == done {
            return Ok(());
        }
        let (old, new) = (
            String::from_utf8_lossy(&done).into_owned(),
            String::from_utf8_lossy(&target).into_owned(),
        );
        if !old.is_empty() {
            txn.delete(model::redirect_in(&old, source), Bytes::from_static(col::ALIAS_FROM));
            txn.notify(model::page(&old), Bytes::from_static(col::RANK_DIRTY));
        }
        if !new.is_empty() {
            txn.set(
                model::redirect_in(&new, source),
                Bytes::from_static(col::ALIAS_FROM),
                Bytes::new(),
            );
            txn.notify(model::page(&new), Bytes::from_static(col::RANK_DIRTY));
        }
        txn.set(row.clone(), Bytes::from_static(col::ALIAS_DONE), target);
        Ok(())
    }
}
