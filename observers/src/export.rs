//! export: keeps the serving copy of each page current (spec §7).
//!
//! - Trigger: `export:dirty` of `p:<url>` (weak), which nothing sets any more: earlier
//!   versions of perc did (parse, indegree and cluster), and a store they wrote may still
//!   hold some. Otherwise it is a stage:
//! - Runs: in the transaction of whoever changes what a page's line shows: parse (its
//!   `page:meta`), indegree (its `indeg:indeg`) and cluster (its `page:canonical`), each
//!   right after writing it, so that no run of its own is needed (one transaction and ~4
//!   store calls a page, and a third of an update's runs).
//! - Reads: `page:meta`, `page:canonical`, `indeg:indeg`, `export:line`, as the transaction
//!   sees them (its own writes included).
//! - Writes: `export:line`, the page's JSON line without its inlinks and near-duplicates
//!   (readers join those from the `e:` rows and the cluster's `near:list`, see
//!   [`crate::model::full_line`]), or removes it when the URL is not (or no longer) a page.
//! - Queues: the URL for the search index ([`crate::search`]) when its line changed.
//! - Notifies: nobody; `perc export` reads these lines in URL order.
//! - Concurrent writers of a line's inputs both write the line whenever their change shows
//!   in it (each field comes from one input), so they conflict there and one retries: no
//!   line is left with a field another transaction overwrote.
//! - Twice is harmless: the line is a function of the current cells, written only if changed.

use async_trait::async_trait;
use bytes::Bytes;
use perc_notify::{Observer, ObserverError};
use perc_txn::Transaction;

use crate::model::{self, col, ExportLine, Meta, PageKind};

/// The cells of a page's row that its line is made from, and the line: a writer that
/// refreshes many pages' lines reads these in one call first ([`cells`]).
const CELLS: [&[u8]; 4] = [col::META, col::CANONICAL, col::INDEG, col::EXPORT_LINE];

/// The cells [`run`] reads for each of `rows`, to read them together.
pub fn cells(rows: &[Bytes]) -> Vec<(Bytes, Bytes)> {
    rows.iter()
        .flat_map(|r| CELLS.iter().map(move |c| (r.clone(), Bytes::from_static(c))))
        .collect()
}

/// The stage, in the transaction of a writer of the page `row`: its line, made again from
/// the cells as this transaction sees them, written if it changed.
pub async fn run(txn: &mut Transaction, row: &Bytes) -> Result<(), ObserverError> {
    let Some(url) = model::url_of(row) else { return Ok(()) };
    txn.get_many(&cells(std::slice::from_ref(row))).await?;
    let meta = model::get_json::<Meta>(txn, row, col::META).await?.unwrap_or_default();
    if meta.kind != PageKind::Page {
        if model::delete_if_present(txn, row, col::EXPORT_LINE).await? {
            crate::search::queue(txn, url);
        }
        return Ok(());
    }
    let canonical =
        txn.get(row, col::CANONICAL).await?.map(|c| String::from_utf8_lossy(&c).into_owned());
    let in_degree = txn
        .get(row, col::INDEG)
        .await?
        .and_then(|v| std::str::from_utf8(&v).ok()?.parse().ok())
        .unwrap_or(0);
    let line = ExportLine {
        url: url.to_string(),
        canonical: canonical.unwrap_or_else(|| url.to_string()),
        content_hash: meta.content_hash,
        title: meta.title,
        in_degree,
        noindex: meta.noindex,
        near_duplicates: Vec::new(),
        pagerank: 0.0,
        lang: meta.lang,
        inlinks: Vec::new(),
    };
    if model::set_json_if_changed(txn, row, col::EXPORT_LINE, &line).await? {
        crate::search::queue(txn, url);
    }
    Ok(())
}

pub struct Export;

#[async_trait]
impl Observer for Export {
    async fn observe(
        &self,
        txn: &mut Transaction,
        row: &Bytes,
        _column: &Bytes,
    ) -> Result<(), ObserverError> {
        run(txn, row).await
    }
}
