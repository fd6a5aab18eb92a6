//! alias: a redirect's source becomes an alias of its target.
//!
//! - Runs: in the page's parse run, after parse wrote `page:redirect`.
//! - Reads: the redirect target ("" if none), and `alias:done` (the target recorded last time).
//! - Writes: `r:<target>\0<source>` (removing the old target's row; unchecked, see
//!   [`model::reregister`]), and `alias:done`.
//! - Notifies: the source's own `indeg:dirty` (weakly), when the registration moved. Indegree keeps
//!   the alias sets from the source's side (it counts an alias at the end of its chain), and
//!   uses these rows to tell the URLs redirecting to a page whose own end changed; an indegree run
//!   of the source that came before this row existed is so followed by one that sees it.
//!   Chains (a → b → c) resolve in indegree.
//! - Twice is harmless: nothing changes when the target equals `alias:done`.

use bytes::Bytes;
use perc_notify::ObserverError;
use perc_txn::Transaction;

use crate::model::{self, col};

/// The stage, in the transaction of the page's parse run.
pub async fn run(txn: &mut Transaction, row: &Bytes) -> Result<(), ObserverError> {
    let Some(source) = model::url_of(row) else { return Ok(()) };
    let redirect = model::Registration {
        key: col::REDIRECT,
        registered: col::TARGET_REGISTERED,
        child: model::redirect_in,
        child_column: col::ALIAS_FROM,
        value: Bytes::new(),
    };
    if model::reregister(txn, row, source, &redirect).await?.is_some() {
        txn.notify(row.clone(), Bytes::from_static(col::INDEG_DIRTY));
    }
    Ok(())
}
