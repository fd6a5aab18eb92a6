//! parse: a raw page becomes what the index needs to know about it.
//!
//! - Trigger: `crawl:raw` of `p:<url>` (strong).
//! - Reads: the raw record, and the cells it and its stages write (the engine prefetches
//!   them with the record, having seen earlier runs read them).
//! - Writes (each only if it changed): `page:meta` (kind, reason, title, noindex, hash),
//!   `page:links` (one `[target, anchor]` per distinct target, sorted), `page:follow`
//!   (what discovery may follow; only for a page in the frontier, which a replayed page is
//!   not), `page:hash` (content hash, "" unless a page),
//!   `page:redirect` (the redirect target, "" if none), `page:declared` (the declared
//!   canonical, "" if none).
//! - Returns what the page-local stages that follow it in the same transaction need
//!   ([`Parsed`]; [`crate::runs`] composes them): export (`page:meta`), dedup
//!   (`page:hash`), invert (`page:links`) and alias (`page:redirect`); each has its contract
//!   in its module, and each does nothing when its input did not change.
//! - Queues: a page for the search index ([`crate::search`]): its body is the record's.
//! - Notifies: discover (`page:follow`); weakly, the page's own indegree when its redirect
//!   changed or it started or stopped being a page or a redirect (indegree branches on both;
//!   alias only notifies the targets), its cluster when its declared canonical changed; and
//!   what the three stages notify.
//! - Twice is harmless: the same raw record gives the same values, and unchanged values are
//!   not written, so nothing downstream runs (the page is queued for the search index again,
//!   whose indexer reads the same document).
//!
//! A page is a 2xx `text/html` response; a 3xx with a Location is a redirect (its source
//! becomes an alias of the target), and so is a page whose first `<meta http-equiv=refresh>`
//! has delay 0 and a URL (spec §6.2: its links are neither followed nor inverted); anything
//! else is recorded with its reason. A page's declared canonical (`<link rel=canonical>`) is
//! its vote in its cluster's canonical choice (spec §6.4): `page:declared`.

use crate::IndexError;
use bytes::Bytes;
use perc_notify::ObserverError;
use perc_txn::Transaction;

use crate::model::{self, col, Follow, Meta, PageKind};

/// What a parse changed, for the stages that follow it in its transaction.
pub struct Parsed {
    /// `page:meta` was written: the export line may show it.
    pub meta_changed: bool,
    /// It became a page again, or stopped being one: what its sources' links resolve to
    /// changed. (A URL parsed for the first time is not counted: the in-degree run that
    /// counts its sources, which waited for it, tells rank of each.)
    pub page_changed: bool,
    /// The body's simhash (a page's, of 3 tokens or more), for dedup's member row.
    pub simhash: Option<u64>,
    /// The links as the last run left them (what the last inversion inverted), and now.
    pub links_before: Vec<(String, String)>,
    pub links: Vec<(String, String)>,
}

/// The stage, as a run of parse on the page row `row`: `None` for a row that is not a
/// page's or has no raw record (nothing follows).
pub async fn run(txn: &mut Transaction, row: &Bytes) -> Result<Option<Parsed>, ObserverError> {
    let Some(url_text) = model::url_of(row) else { return Ok(None) };
    let Some(raw) = txn.get(row, col::RAW).await? else { return Ok(None) };
    let (head, body) = model::decode_raw(&raw)
        .map_err(|e| IndexError::corrupt(format!("crawl:raw of {url_text}"), e))?;
    let url = url::Url::parse(url_text).map_err(|e| IndexError::BadRow {
        row: url_text.into(),
        problem: format!("not a URL: {e}"),
    })?;
    let Read { meta, links, follow, simhash } = read(&url, &head, &body);
    let kind_before = model::get_json::<Meta>(txn, row, col::META).await?.map(|m| m.kind);
    let counted_before = kind_before.is_some_and(PageKind::counts_inlinks);
    let page_changed =
        kind_before.is_some_and(|k| (k == PageKind::Page) != (meta.kind == PageKind::Page));
    if counted_before != meta.kind.counts_inlinks() {
        // indegree counts the inlinks of pages and redirects only (see its module).
        txn.notify(row.clone(), Bytes::from_static(col::INDEG_DIRTY));
    }
    let meta_changed = model::set_json_if_changed(txn, row, col::META, &meta).await?;
    if meta.kind == PageKind::Page {
        // A search document's body is the record an indexer reads when it drains, and
        // the loader that wrote the record queued nothing. An indexer that read a body
        // that was then replaced before its export ran, by one whose line is the same (a
        // page gone back to its earlier body), would keep the body it read: so every
        // parsed page is queued, in the run that follows its record's last change.
        crate::search::queue(txn, url_text);
    }
    // The links as the last run left them: what the last inversion inverted.
    let links_before: Vec<(String, String)> =
        model::get_json(txn, row, col::LINKS).await?.unwrap_or_default();
    model::set_json_if_changed(txn, row, col::LINKS, &links).await?;
    // Only a page the crawl reached (it is in the frontier) has links to follow: a replayed
    // page's run of discover would find no scope and do nothing.
    if txn.get(&model::fetch_row(url_text), col::WANT).await?.is_some() {
        model::set_json_if_changed(txn, row, col::FOLLOW, &follow).await?;
    }
    model::set_if_changed(txn, row, col::HASH, Bytes::from(meta.content_hash.clone())).await?;
    let declared = meta.declared_canonical.clone().unwrap_or_default();
    if model::set_if_changed(txn, row, col::DECLARED, Bytes::from(declared)).await?
        && !meta.content_hash.is_empty()
        && txn.get(row, col::HASH_REGISTERED).await?.as_deref()
            == Some(meta.content_hash.as_bytes())
    {
        // The page's vote moved: its cluster chooses again (spec §6.4). A page that also
        // moves to another cluster has both told (or chosen for) by dedup.
        model::signals::tell_cluster(txn, &meta.content_hash);
    }
    let redirect = meta.redirect_to.clone().unwrap_or_default();
    if model::set_if_changed(txn, row, col::REDIRECT, Bytes::from(redirect)).await? {
        // indegree decides from this whether the page is an alias (and alias tells it again
        // once the redirect's registration is written).
        txn.notify(row.clone(), Bytes::from_static(col::INDEG_DIRTY));
    }
    Ok(Some(Parsed { meta_changed, page_changed, simhash, links_before, links }))
}

/// What the raw record says of the page: its meta, its links (target, anchor), what
/// discovery may follow, and its body's simhash.
struct Read {
    meta: Meta,
    links: Vec<(String, String)>,
    follow: Follow,
    simhash: Option<u64>,
}

fn read(url: &url::Url, head: &model::RawHead, body: &[u8]) -> Read {
    let mut meta = Meta { status: head.status, ..Meta::default() };
    let mut links: Vec<(String, String)> = Vec::new();
    let mut follow = Follow { depth: head.depth, hops: head.hops, ..Follow::default() };
    let mut simhash = None;
    let status = head.status.unwrap_or(0);
    let html =
        matches!(head.content_type.as_deref(), Some("text/html") | Some("application/xhtml+xml"));
    if let Some(error) = &head.error {
        meta.kind = PageKind::Other;
        meta.reason = error.clone();
    } else if (300..400).contains(&status) && head.location.is_some() {
        let target = head.location.as_deref().map(perc_crawl::normalize).and_then(Result::ok);
        redirect(&mut meta, &mut follow, url, target, &format!("HTTP {status}"));
    } else if !(200..300).contains(&status) {
        meta.kind = PageKind::Other;
        meta.reason = format!("HTTP {status}");
    } else if !html {
        meta.kind = PageKind::Other;
        meta.reason =
            format!("not HTML ({})", head.content_type.as_deref().unwrap_or("no Content-Type"));
    } else {
        let parsed = perc_crawl::parse_for_index(url, body, head.charset.as_deref());
        let refresh = parsed.refresh.as_ref();
        if let Some(depth) = parsed.too_deep {
            meta.kind = PageKind::Other;
            meta.reason = format!(
                "HTML nested more than {} elements deep ({depth} and more): not parsed",
                perc_crawl::nesting::NESTING_MAX
            );
        } else if let Some(target) = refresh.and_then(perc_crawl::Refresh::redirect) {
            // A delay-0 refresh is a redirect, exactly as an HTTP one (spec §6.2).
            redirect(&mut meta, &mut follow, url, Some(target.clone()), "refresh");
        } else {
            meta.kind = PageKind::Page;
            meta.title = parsed.title;
            meta.noindex = parsed.noindex;
            meta.content_hash = perc_crawl::content_hash(body);
            meta.encoding = parsed.encoding.to_string();
            meta.long_links_dropped = parsed.long_links as u32;
            meta.links_over_max = parsed.links_over_max as u32;
            meta.declared_canonical = parsed.canonical.map(String::from);
            meta.simhash = parsed.simhash.map(model::simhash_hex);
            simhash = parsed.simhash;
            meta.lang = parsed.lang.map(str::to_string);
            meta.refresh = refresh.map(|r| match &r.target {
                Some(t) => format!("after {} s to {t}", r.delay_s),
                None => format!("after {} s, this page again", r.delay_s),
            });
            for link in parsed.links {
                if link.follow {
                    follow.links.push(link.target.to_string());
                }
                links.push((link.target.to_string(), link.anchor));
            }
            links.sort();
            follow.links.sort();
        }
    }
    Read { meta, links, follow, simhash }
}

/// Makes `meta` a redirect to `target` (by `how`: "HTTP 301", "refresh"), or, for a target
/// that cannot be kept (invalid, too long, the page itself), a page of no kind that says why.
fn redirect(
    meta: &mut Meta,
    follow: &mut Follow,
    url: &url::Url,
    target: Option<url::Url>,
    how: &str,
) {
    match target {
        Some(t) if !perc_crawl::urls::link_fits(url, &t) => {
            meta.kind = PageKind::Other;
            meta.reason =
                format!("{how} redirect to a URL of {} bytes, too long to keep", t.as_str().len());
        }
        Some(t) if t != *url => {
            meta.kind = PageKind::Redirect;
            meta.reason = format!("{how} redirect to {t}");
            meta.redirect_to = Some(t.to_string());
            follow.redirect = Some(t.to_string());
        }
        _ => {
            meta.kind = PageKind::Other;
            meta.reason = format!("{how} redirect to an invalid or identical location");
        }
    }
}
