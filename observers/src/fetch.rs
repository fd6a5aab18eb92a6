//! fetch: the crawl frontier becomes raw pages.
//!
//! - Trigger: `crawl:want` of `p:<url>` (strong), written by the loader and by discover.
//! - Reads: the want (depth, hops).
//! - Writes: `crawl:raw` (status, headers, body; or the reason there is none), through the
//!   [`Source`] it is handed (robots.txt and politeness live there).
//! - Notifies: parse, through `crawl:raw`.
//! - Twice is harmless: it fetches the page again and writes what it got; parse and all after
//!   it change nothing when nothing changed. A host whose robots.txt stays unreachable is
//!   given up by the source, and its URLs are recorded with that reason.

use crate::IndexError;
use std::sync::Arc;

use async_trait::async_trait;
use bytes::Bytes;
use perc_crawl::{Fetched, Source};
use perc_notify::{Observer, ObserverError};
use perc_txn::Transaction;

use crate::model::{self, col, RawHead, Want};

pub struct Fetch {
    pub source: Arc<dyn Source>,
}

#[async_trait]
impl Observer for Fetch {
    async fn observe(
        &self,
        txn: &mut Transaction,
        row: &Bytes,
        _column: &Bytes,
    ) -> Result<(), ObserverError> {
        let Some(url) = model::url_of(row) else { return Ok(()) };
        let Some(want) = model::get_json::<Want>(txn, row, col::WANT).await? else { return Ok(()) };
        let url = url::Url::parse(url).map_err(|e| IndexError::BadRow {
            row: url.into(),
            problem: format!("not a URL: {e}"),
        })?;
        let mut head = RawHead { depth: want.depth, hops: want.hops, ..RawHead::default() };
        let body = match self.source.get(&url).await {
            Fetched::Response(r) => {
                head.status = Some(r.status);
                head.content_type = r.content_type;
                head.charset = r.charset;
                head.location = r.location.map(|l| l.to_string());
                r.body
            }
            Fetched::Failed(why) => {
                head.error = Some(why);
                Bytes::new()
            }
            Fetched::Disallowed => {
                head.error = Some("disallowed by robots.txt".into());
                Bytes::new()
            }
        };
        txn.set(row.clone(), Bytes::from_static(col::RAW), model::encode_raw(&head, &body));
        Ok(())
    }
}
