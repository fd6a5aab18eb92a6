//! forward: anchor forwarding to the canonical (spec §6.4): the canonical page carries the
//! inlinks of every member of its cluster (and of their aliases).
//!
//! - Runs: after a cluster's choice, in its transaction (what forwarding reads is what the
//!   choice read): a run of cluster, or a new cluster's first choice in its page's parse
//!   run; and, for a cluster of one, in its member's indegree run when the member's names
//!   changed (the names it forwards are its own). [`crate::runs`] composes these.
//! - Reads: nothing of its own: each member's `indeg:names` and `fwd:names` come from
//!   cluster's read.
//! - Writes: on the canonical, `fwd:names` = the union of the members' names (pages and
//!   aliases), sorted; on every other member, removes it. A page that left the cluster is
//!   its new cluster's member (which sets or removes its names) or no page at all (whose
//!   line nobody reads). The inlinks themselves stay in their `e:` rows, where invert keeps
//!   them current; readers join them through these names, so an inlink that changes costs
//!   no rewrite here, however many the page has.
//! - Queues: the canonical for the search index ([`crate::search`]) when its `fwd:names`
//!   changed (its document's anchors are those of the names' inlinks).
//! - Notifies: nobody (the export line's inlinks are joined when it is read).
//! - Writes back each written member's `dedup:registered` unchanged, as cluster does (see
//!   [`model::signals::hold_membership`]).
//! - Twice is harmless: a function of the current rows, written only when different.

use bytes::Bytes;
use perc_notify::ObserverError;
use perc_txn::Transaction;

use crate::model::{self, col, Forward};

/// The stage, in the transaction of the cluster's choice (see [`crate::runs`]).
pub async fn run(txn: &mut Transaction, f: &Forward) -> Result<(), ObserverError> {
    let all = model::names_union(f.names.iter().flatten())?;
    for (m, had) in f.members.iter().zip(&f.forwarded) {
        let row = model::page(m);
        let wrote = if *m == f.canonical {
            let wrote = model::set_json_if_changed(txn, &row, col::FWD_NAMES, &all).await?;
            if wrote {
                crate::search::queue(txn, m);
            }
            wrote
        } else if had.is_some() {
            txn.delete(row.clone(), Bytes::from_static(col::FWD_NAMES));
            true
        } else {
            false
        };
        if wrote {
            model::signals::hold_membership(txn, &row, f.hash.clone());
        }
    }
    Ok(())
}
