//! The queries: what users ask the index. Its report, the export (whole or a line at a
//! time), one URL's record, a URL's canonical. Each reads one snapshot.

use std::collections::BTreeSet;

use bytes::Bytes;
use perc_txn::{Client, RangeScan};
use url::Url;

use crate::model::{self, col, rows, ExportLine, LinkLine, Meta, PageKind, Want};
use crate::IndexError;

/// How many pages the export holds (their lines are counted, not read with their inlinks).
pub async fn page_count(client: &Client) -> Result<usize, IndexError> {
    let t = client.begin().await?;
    Ok(t.scan_rows(rows::PAGES.start(), rows::PAGES.end(), col::EXPORT_LINE).await?.len())
}

/// What the index holds, each number saying what it counts (`perc status`, the crawl's
/// summary), read in one snapshot.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Report {
    /// Pages in the export.
    pub pages: usize,
    /// Duplicate clusters of two or more pages.
    pub duplicate_clusters: usize,
    /// URLs fetched or loaded (pages or not).
    pub fetched: usize,
    /// Of those, the ones that got an HTTP response (not refused by robots.txt, unreachable,
    /// timed out or over a budget).
    pub answered: usize,
    /// URLs in the frontier that have not been fetched yet.
    pub waiting: usize,
    /// URLs fetched or loaded that are not pages, by why not (redirects included).
    pub not_pages: std::collections::BTreeMap<String, usize>,
    /// A few of them for each reason (the first in URL order), to show.
    pub not_page_examples: std::collections::BTreeMap<String, Vec<String>>,
    /// Of the URLs asked about ([`report`]'s `seeds`), how many got a response.
    pub seeds_answered: usize,
    /// URLs fetched or loaded that were wanted at or after [`report_since`]'s timestamp
    /// (all, for [`report`]): the ones a crawl started then tried, whichever process did.
    pub tried: usize,
}

/// The index's [`Report`]; `seeds` are the URLs whose answers it checks (a crawl's seeds).
pub async fn report(client: &Client, seeds: &[Url]) -> Result<Report, IndexError> {
    report_since(client, seeds, 0).await
}

/// The index's [`Report`], counting as `tried` the URLs fetched since they were wanted (by
/// a seed, a discovery or a refetch) at or after the timestamp `since`.
pub async fn report_since(
    client: &Client,
    seeds: &[Url],
    since: u64,
) -> Result<Report, IndexError> {
    let t = client.begin().await?;
    let mut r = Report {
        pages: t.scan_rows(rows::PAGES.start(), rows::PAGES.end(), col::EXPORT_LINE).await?.len(),
        ..Report::default()
    };
    // The clusters, and the pages' records and wants: one call, one walk over the pages.
    let mut scanned = t
        .scan_each(&[
            RangeScan::new(rows::CLUSTERS.start(), rows::CLUSTERS.end(), col::MEMBER),
            RangeScan::new(rows::PAGES.start(), rows::PAGES.end(), col::META),
            RangeScan::new(rows::FETCHES.start(), rows::FETCHES.end(), col::WANT),
        ])
        .await?
        .into_iter();
    let (members, metas, wants) = (
        scanned.next().unwrap_or_default(),
        scanned.next().unwrap_or_default(),
        scanned.next().unwrap_or_default(),
    );
    let mut last: Option<&[u8]> = None;
    let mut size = 0;
    for (row, _) in &members {
        let hash = row.split(|b| *b == 0).next().unwrap_or(row);
        if last != Some(hash) {
            last = Some(hash);
            size = 0;
        }
        size += 1;
        if size == 2 {
            r.duplicate_clusters += 1;
        }
    }
    let seed_rows: std::collections::BTreeSet<Bytes> =
        seeds.iter().map(|s| model::page(s.as_str())).collect();
    for (row, raw) in &metas {
        let meta: Meta = serde_json::from_slice(raw)
            .map_err(|e| IndexError::corrupt(format!("page:meta of {}", row.escape_ascii()), e))?;
        if meta.status.is_some() {
            r.answered += 1;
            r.seeds_answered += usize::from(seed_rows.contains(row));
        }
        if meta.kind != PageKind::Page {
            let class = reason_class(&meta);
            let examples = r.not_page_examples.entry(class.clone()).or_default();
            if examples.len() < NOT_PAGE_EXAMPLES {
                examples.extend(model::url_of(row).map(str::to_string));
            }
            *r.not_pages.entry(class).or_default() += 1;
        }
    }
    r.fetched = metas.len();
    let fetched: std::collections::BTreeSet<&Bytes> = metas.iter().map(|(row, _)| row).collect();
    for (row, raw) in wants {
        let page = model::url_of_fetch(&row).map(model::page).unwrap_or_default();
        if !fetched.contains(&page) {
            r.waiting += 1;
            continue;
        }
        let want: Want = serde_json::from_slice(&raw)
            .map_err(|e| IndexError::corrupt(format!("crawl:want of {}", row.escape_ascii()), e))?;
        r.tried += usize::from(want.gen >= since);
    }
    Ok(r)
}

/// How many URLs [`Report::not_page_examples`] keeps for each reason.
const NOT_PAGE_EXAMPLES: usize = 3;

/// Why a URL is not a page, as a label that groups alike reasons (no URLs in it).
fn reason_class(meta: &Meta) -> String {
    let reason = meta.reason.as_str();
    if meta.kind == PageKind::Redirect {
        return "redirect".into();
    }
    for (starts, label) in [
        ("robots.txt unreachable", "robots.txt unreachable (host given up)"),
        ("disallowed by robots.txt", "disallowed by robots.txt"),
        ("cannot connect to", "host unreachable"),
        ("timed out", "timed out"),
        ("body exceeds", "body over crawl.body_bytes_max"),
        ("not fetched: this run reached crawl.max_pages", "over crawl.max_pages"),
        ("not fetched: this run only replays", "not in the replayed WARCs"),
        ("not HTML", "not HTML"),
    ] {
        if reason.starts_with(starts) {
            return label.into();
        }
    }
    if let Some(rest) = reason.strip_prefix("HTTP ") {
        let code: String = rest.chars().take_while(char::is_ascii_digit).collect();
        if !code.is_empty() && !rest[code.len()..].starts_with(" redirect") {
            return format!("HTTP {code}");
        }
    }
    reason.chars().take(60).collect()
}

/// The export snapshot: every page's line, in URL order.
pub async fn export(client: &Client) -> Result<Vec<ExportLine>, IndexError> {
    let mut out = Vec::new();
    export_each(client, |line| {
        out.push(line);
        Ok::<_, IndexError>(())
    })
    .await?;
    Ok(out)
}

/// The export, one line at a time in URL order, each handed to `each` as soon as its inlinks
/// are joined. It reads [`EXPORT_PAGE`] lines at a time, all at one snapshot: memory holds
/// one page of lines, not the export, however big the index and however slowly `each` takes
/// them. An error from `each` stops it and is returned.
pub async fn export_each<E: From<IndexError>>(
    client: &Client,
    mut each: impl FnMut(ExportLine) -> Result<(), E>,
) -> Result<(), E> {
    let t = client.begin().await.map_err(IndexError::from)?;
    let (mut from, end) = (Bytes::from_static(rows::PAGES.start()), rows::PAGES.end());
    loop {
        let range = RangeScan::new(&from, end, col::EXPORT_LINE).first(EXPORT_PAGE);
        let page = t.scan_each(&[range]).await.map_err(IndexError::from)?.pop().unwrap_or_default();
        let Some((last, _)) = page.last() else { return Ok(()) };
        // The next page starts just after this one's last row.
        from = Bytes::from([last.as_ref(), b"\0"].concat());
        let full = page.len() == EXPORT_PAGE;
        let lines: Vec<ExportLine> = page
            .into_iter()
            .map(|(row, v)| {
                serde_json::from_slice(&v).map_err(|e| {
                    IndexError::corrupt(format!("export:line of {}", row.escape_ascii()), e)
                })
            })
            .collect::<Result<_, _>>()?;
        // The canonical pages' inlinks, joined from the e: rows of their fwd:names.
        let keys: Vec<(Bytes, Bytes)> = lines.iter().flat_map(model::join_keys).collect();
        let mut joined = t.get_many(&keys).await.map_err(IndexError::from)?.into_iter();
        for line in lines {
            let cells = [joined.next().flatten(), joined.next().flatten(), joined.next().flatten()];
            each(model::full_line(&t, line, cells).await?)?;
        }
        if !full {
            return Ok(());
        }
    }
}

/// The export lines read at a time.
const EXPORT_PAGE: usize = 512;

/// The link graph, one edge at a time in (to, from) order (the order of the `e:` rows), each
/// with the page it counts for, all at one snapshot: memory holds one page of edges
/// ([`LINKS_PAGE`]). An error from `each` stops it and is returned.
pub async fn links_each<E: From<IndexError>>(
    client: &Client,
    mut each: impl FnMut(LinkLine) -> Result<(), E>,
) -> Result<(), E> {
    let t = client.begin().await.map_err(IndexError::from)?;
    let (mut from, end) = (Bytes::from_static(rows::EDGES.start()), rows::EDGES.end());
    loop {
        let range = RangeScan::new(&from, end, col::EDGE).first(LINKS_PAGE);
        let page = t.scan_each(&[range]).await.map_err(IndexError::from)?.pop().unwrap_or_default();
        let Some((last, _)) = page.last() else { return Ok(()) };
        from = Bytes::from([last.as_ref(), b"\0"].concat());
        let full = page.len() == LINKS_PAGE;
        let edges: Vec<(&str, &str, Bytes)> = page
            .iter()
            .filter_map(|(row, anchor)| {
                let (to, source) = rows::EDGES.key_of(row)?.split_once('\0')?;
                Some((to, source, anchor.clone()))
            })
            .collect();
        let tos: BTreeSet<&str> = edges.iter().map(|(to, _, _)| *to).collect();
        let targets = model::pages_counted_for(&t, tos).await?;
        for (to, source, anchor) in edges {
            each(LinkLine {
                from: source.to_string(),
                to: to.to_string(),
                target: targets.get(to).cloned().flatten(),
                anchor: String::from_utf8_lossy(&anchor).into_owned(),
            })?;
        }
        if !full {
            return Ok(());
        }
    }
}

/// The edges read at a time.
const LINKS_PAGE: usize = 4096;

/// What perc knows about one URL.
#[derive(Clone, Debug, PartialEq)]
pub enum PageInfo {
    /// A page: its export line, and what parse recorded (its declared canonical, a refresh).
    Page(ExportLine, Meta),
    /// Fetched (or loaded) but not a page: why.
    NotAPage(Meta),
    /// In the frontier, not fetched yet.
    Pending,
    Unknown,
}

/// The recrawl state of `url` (`crawl:state`), if it was ever fetched live.
pub async fn fetch_state(
    client: &Client,
    url: &Url,
) -> Result<Option<model::FetchState>, IndexError> {
    let t = client.begin().await?;
    model::get_json(&t, &model::fetch_row(url.as_str()), col::FETCH_STATE).await
}

pub async fn page_info(client: &Client, url: &Url) -> Result<PageInfo, IndexError> {
    let t = client.begin().await?;
    let row = model::page(url.as_str());
    if let Some(line) = model::get_json::<ExportLine>(&t, &row, col::EXPORT_LINE).await? {
        let joined = t.get_many(&model::join_keys(&line)).await?;
        let cells = [joined[0].clone(), joined[1].clone(), joined[2].clone()];
        let meta = model::get_json::<Meta>(&t, &row, col::META).await?.unwrap_or_default();
        return Ok(PageInfo::Page(model::full_line(&t, line, cells).await?, meta));
    }
    if let Some(meta) = model::get_json::<Meta>(&t, &row, col::META).await? {
        return Ok(PageInfo::NotAPage(meta));
    }
    let fetch = model::fetch_row(url.as_str());
    if t.get(&fetch, col::WANT).await?.is_some() || t.get(&row, col::RAW).await?.is_some() {
        return Ok(PageInfo::Pending);
    }
    Ok(PageInfo::Unknown)
}

/// The canonical URL of a page, of a duplicate, or of an alias (following redirects).
/// `Err` names what the URL is instead when it has none.
pub async fn canonical(client: &Client, url: &Url) -> Result<Result<String, String>, IndexError> {
    let t = client.begin().await?;
    let mut current = url.to_string();
    for _ in 0..=crate::indegree::ALIAS_HOPS_MAX {
        let row = model::page(&current);
        let meta = model::get_json::<Meta>(&t, &row, col::META).await?;
        match meta {
            None => {
                return Ok(Err(if current == url.as_str() {
                    format!("{url} is not known to this index")
                } else {
                    format!("{url} redirects to {current}, which is not known to this index")
                }))
            }
            Some(m) if m.kind == PageKind::Page => {
                let c = t
                    .get(&row, col::CANONICAL)
                    .await?
                    .map(|c| String::from_utf8_lossy(&c).into_owned());
                return Ok(Ok(c.unwrap_or(current)));
            }
            Some(m) if m.kind == PageKind::Redirect => current = m.redirect_to.unwrap_or_default(),
            Some(m) => return Ok(Err(format!("{current} is not a page: {}", m.reason))),
        }
    }
    Ok(Err(format!("{url}: too many redirects")))
}
