//! The loaders: what users put into the index. A crawl's seeds and scope, a refetch of known
//! URLs, and recorded responses from a WARC; each a few transactions of many rows, retried
//! on conflict.

use bytes::Bytes;
use perc_txn::{Client, TxnError};
use url::Url;

use crate::model::{self, col, rows, CrawlScope, Want};
use crate::IndexError;

/// Rows written per loader transaction.
const LOAD_BATCH: usize = 100;

/// Starts (or restarts) a crawl: records its scope, and puts the seeds in the frontier with a
/// new generation, so that seeds already fetched are fetched again.
pub async fn seed(client: &Client, seeds: &[Url], scope: &CrawlScope) -> Result<(), TxnError> {
    client
        .retrying(|c| async move {
            let mut t = c.begin().await?;
            t.set(
                Bytes::from_static(model::CONFIG_ROW),
                Bytes::from_static(col::SCOPE),
                serde_json::to_vec(scope).expect("serializable"),
            );
            t.commit().await
        })
        .await?;
    want(client, seeds).await
}

/// Wants `seeds` (again) at depth 0.
async fn want(client: &Client, seeds: &[Url]) -> Result<(), TxnError> {
    for chunk in seeds.chunks(LOAD_BATCH) {
        client
            .retrying(|c| async move {
                let mut t = c.begin().await?;
                let gen = t.start_ts().0;
                for s in chunk {
                    let want = Want { depth: 0, gen, hops: 0 };
                    t.set(
                        model::fetch_row(s.as_str()),
                        Bytes::from_static(col::WANT),
                        serde_json::to_vec(&want).expect("serializable"),
                    );
                }
                t.commit().await
            })
            .await?;
    }
    Ok(())
}

/// Adds `seeds` to the crawl: the stored scope becomes its union with `scope` (read and
/// written in one transaction, so concurrent additions both stay), and the seeds are
/// wanted (again) at depth 0.
pub async fn seed_more(
    client: &Client,
    seeds: &[Url],
    scope: &CrawlScope,
) -> Result<(), IndexError> {
    client
        .retrying(|c| async move {
            let mut t = c.begin().await?;
            let current: Option<CrawlScope> =
                model::get_json(&t, model::CONFIG_ROW, col::SCOPE).await?;
            let merged = current.map_or_else(|| scope.clone(), |cur| cur.union(scope));
            t.set(
                Bytes::from_static(model::CONFIG_ROW),
                Bytes::from_static(col::SCOPE),
                serde_json::to_vec(&merged).expect("serializable"),
            );
            t.commit().await?;
            Ok::<_, IndexError>(())
        })
        .await?;
    want(client, seeds).await?;
    Ok(())
}

/// Asks again for the URLs whose next fetch is due at `now_ms` (the due-time index written
/// by fetch), at most `limit` of them, in one transaction: each due row is deleted and the
/// URL's want gets a new generation (its fetch writes the next due row). Returns how many.
pub async fn recrawl_due(client: &Client, now_ms: u64, limit: usize) -> Result<usize, IndexError> {
    client
        .retrying(|c| async move {
            let mut t = c.begin().await?;
            let gen = t.start_ts().0;
            let (start, end) = model::due_until(now_ms);
            let due = t.scan_first(&start, &end, col::DUE, limit).await?;
            let mut n = 0;
            for (row, _) in due {
                t.delete(row.clone(), Bytes::from_static(col::DUE));
                let Some(url) = model::child_key(&row) else { continue };
                let fetch = model::fetch_row(url);
                if let Some(mut want) = model::get_json::<Want>(&t, &fetch, col::WANT).await? {
                    want.gen = gen;
                    t.set(
                        fetch,
                        Bytes::from_static(col::WANT),
                        serde_json::to_vec(&want).expect("serializable"),
                    );
                    n += 1;
                }
            }
            t.commit().await?;
            Ok::<_, IndexError>(n)
        })
        .await
}

/// The first `n` URLs of the recrawl's due-time index, soonest first, with their due times
/// (ms): those already due (not fetched yet) and the next ones.
pub async fn next_due(client: &Client, n: usize) -> Result<Vec<(u64, String)>, IndexError> {
    let t = client.begin().await?;
    let (start, _) = model::due_until(0);
    let mut out = Vec::new();
    for (row, _) in t.scan_first(&start, b"n;", col::DUE, n).await? {
        let Some(url) = model::child_key(&row) else { continue };
        let ms =
            std::str::from_utf8(&row[2..18]).ok().and_then(|h| u64::from_str_radix(h, 16).ok());
        if let Some(ms) = ms {
            out.push((ms, url.to_string()));
        }
    }
    Ok(out)
}

/// Fetches known pages again (their want gets a new generation, keeping its depth). Returns
/// the URLs that are not known.
pub async fn refetch(client: &Client, urls: &[Url]) -> Result<Vec<Url>, IndexError> {
    let mut unknown = Vec::new();
    for chunk in urls.chunks(LOAD_BATCH) {
        let missing = client
            .retrying(|c| async move {
                let mut t = c.begin().await?;
                let gen = t.start_ts().0;
                let mut missing = Vec::new();
                for u in chunk {
                    let row = model::fetch_row(u.as_str());
                    match model::get_json::<Want>(&t, &row, col::WANT).await? {
                        Some(mut want) => {
                            want.gen = gen;
                            t.set(
                                row,
                                Bytes::from_static(col::WANT),
                                serde_json::to_vec(&want).expect("serializable"),
                            );
                        }
                        None => missing.push(u.clone()),
                    }
                }
                t.commit().await?;
                Ok::<_, IndexError>(missing)
            })
            .await?;
        unknown.extend(missing);
    }
    Ok(unknown)
}

/// Every URL in the frontier, in order.
pub async fn known_urls(client: &Client) -> Result<Vec<Url>, TxnError> {
    let t = client.begin().await?;
    Ok(t.scan(rows::FETCHES.start(), rows::FETCHES.end(), col::WANT)
        .await?
        .into_iter()
        .filter_map(|(row, _)| model::url_of_fetch(&row).and_then(|u| Url::parse(u).ok()))
        .collect())
}

/// Loads recorded responses as if just fetched (depth 0): `perc replay`.
pub async fn load_recorded(
    client: &Client,
    recorded: &[perc_crawl::warc::Recorded],
) -> Result<(), TxnError> {
    for chunk in recorded.chunks(LOAD_BATCH) {
        client
            .retrying(|c| async move {
                let mut t = c.begin().await?;
                for r in chunk {
                    let head = model::RawHead {
                        status: Some(r.response.status),
                        content_type: r.response.content_type.clone(),
                        charset: r.response.charset.clone(),
                        location: r.response.location.as_ref().map(Url::to_string),
                        ..model::RawHead::default()
                    };
                    t.set(
                        model::page(r.url.as_str()),
                        Bytes::from_static(col::RAW),
                        model::encode_raw(&head, &r.response.body),
                    );
                }
                t.commit().await
            })
            .await?;
    }
    Ok(())
}
