//! export: keeps the serving copy of each page current (SPEC §6.6).
//!
//! - Trigger: `export:dirty` of `p:<url>` (weak: set by parse, indegree and cluster).
//! - Reads: `page:meta`, `page:canonical`, `indeg:indeg`.
//! - Writes: `export:line`, the page's JSON line without its inlinks and near-duplicates
//!   (readers join those from the `e:` rows and the cluster's `near:list`, see
//!   [`crate::model::full_line`]), or removes it when the URL is not (or no longer) a page.
//! - Queues: the URL for the search index ([`crate::search`]) when its line changed.
//! - Notifies: nobody; `perc export` reads these lines in URL order.
//! - Twice is harmless: the line is a function of the current cells, written only if changed.

use async_trait::async_trait;
use bytes::Bytes;
use perc_notify::{Observer, ObserverError};
use perc_txn::Transaction;

use crate::model::{self, col, ExportLine, Meta};

pub struct Export;

#[async_trait]
impl Observer for Export {
    async fn observe(
        &self,
        txn: &mut Transaction,
        row: &Bytes,
        _column: &Bytes,
    ) -> Result<(), ObserverError> {
        let Some(url) = model::url_of(row) else { return Ok(()) };
        let meta = model::get_json::<Meta>(txn, row, col::META).await?.unwrap_or_default();
        if meta.kind != "page" {
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
            inlinks: Vec::new(),
        };
        if model::set_json_if_changed(txn, row, col::EXPORT_LINE, &line).await? {
            crate::search::queue(txn, url);
        }
        Ok(())
    }
}
