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
        let redirect = model::Registration {
            key: col::REDIRECT,
            registered: col::ALIAS_DONE,
            child: model::redirect_in,
            child_column: col::ALIAS_FROM,
            notify: model::page,
            notify_column: col::RANK_DIRTY,
        };
        model::reregister(txn, row, source, &redirect).await?;
        Ok(())
    }
}
