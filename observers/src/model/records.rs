//! The records stored in the pipeline's cells: a frontier entry, a fetch outcome, what a
//! page is, the links to follow, the crawl's scope and an export line (spec §7).

use bytes::Bytes;
use serde::{Deserialize, Serialize};

/// A frontier entry: fetch this URL. `gen` changes when a fetch is asked for again.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Want {
    pub depth: u32,
    pub gen: u64,
    /// Redirect hops that led here.
    pub hops: u32,
}

/// What a fetch produced.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RawHead {
    pub status: Option<u16>,
    pub content_type: Option<String>,
    pub charset: Option<String>,
    pub location: Option<String>,
    /// Why there is no response (unreachable, timeout, too large, robots…).
    pub error: Option<String>,
    pub depth: u32,
    pub hops: u32,
    /// The body's length as received when it is stored zstd-compressed (records written
    /// before bodies were compressed have none: their body follows as received).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub zstd_of: Option<u64>,
}

/// A fetched URL's recrawl state (`crawl:state`), written by every fetch.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct FetchState {
    /// When it was last fetched, and when it is due again (ms since the epoch).
    pub last_ms: u64,
    pub next_ms: u64,
    /// The interval that set `next_ms`: doubled by an unchanged fetch, halved by a change.
    pub interval_s: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub etag: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_modified: Option<String>,
    /// blake3 (hex) of what the server last sent (the head without the crawl's depth and
    /// hops, and the body): a fetch that finds it different found a change, which halves
    /// the interval (a shorter path to the page is no change of it). Empty in states written
    /// before it was kept: `written` stands in.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub content: String,
    /// blake3 (hex) of the `crawl:raw` head and body it last wrote: a fetch that would write
    /// the same writes nothing (no new version, no parse run).
    pub written: String,
    /// Fetches so far that found a change, and that found none.
    pub changed: u32,
    pub unchanged: u32,
    /// Fetches in a row that got no answer worth keeping (no response, a 5xx, a 429), and
    /// the last one's reason: the stored answer stands meanwhile, and the next fetch comes
    /// sooner ([`Recrawl::retry`]). A fetch that gets an answer ends the streak.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub failures: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failure: Option<String>,
}

/// The recrawl's intervals (`[recrawl]`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Recrawl {
    pub interval_s: u64,
    pub min_interval_s: u64,
    pub max_interval_s: u64,
}

impl Default for Recrawl {
    fn default() -> Recrawl {
        Recrawl { interval_s: 86_400, min_interval_s: 3_600, max_interval_s: 30 * 86_400 }
    }
}

impl Recrawl {
    /// The next interval after a fetch: the first, or the last one halved by a change or
    /// doubled by none, within the bounds.
    pub fn next(&self, last: Option<u64>, changed: bool) -> u64 {
        let (lo, hi) =
            (self.min_interval_s.max(1), self.max_interval_s.max(self.min_interval_s.max(1)));
        match last {
            None => self.interval_s,
            Some(i) if changed => i / 2,
            Some(i) => i.saturating_mul(2),
        }
        .clamp(lo, hi)
    }

    /// When to ask again after the `failures`-th failed fetch in a row: the minimum
    /// interval, doubled for each failure before it, never later than the URL's interval
    /// (`interval_s`) would have asked.
    pub fn retry(&self, interval_s: u64, failures: u32) -> u64 {
        let first = self.min_interval_s.max(1);
        first.saturating_mul(1 << failures.saturating_sub(1).min(30)).min(interval_s.max(first))
    }
}

/// The recrawl's intervals for every URL: the global ones, and those of URL prefixes
/// (`[[recrawl.prefix]]`); the longest prefix that contains a URL gives its intervals.
#[derive(Clone, Debug, Default)]
pub struct Schedule {
    pub default: Recrawl,
    pub prefixes: Vec<(perc_crawl::Prefix, Recrawl)>,
}

impl Schedule {
    pub fn for_url(&self, url: &url::Url) -> &Recrawl {
        self.prefixes
            .iter()
            .filter(|(p, _)| p.contains(url))
            .max_by_key(|(p, _)| p.path_len())
            .map_or(&self.default, |(_, r)| r)
    }
}

/// The zstd level bodies are stored at: most of zstd's ratio on HTML at a few hundred MB/s.
const BODY_ZSTD_LEVEL: i32 = 3;

/// `crawl:raw` = JSON head, a newline, then the body: zstd-compressed (the head says so and
/// gives its length), or as received when it is empty.
pub fn encode_raw(head: &RawHead, body: &[u8]) -> Bytes {
    let mut head = head.clone();
    let stored = if body.is_empty() {
        head.zstd_of = None;
        None
    } else {
        head.zstd_of = Some(body.len() as u64);
        Some(zstd::bulk::compress(body, BODY_ZSTD_LEVEL).expect("compressing into memory"))
    };
    let mut out = serde_json::to_vec(&head).expect("serializable");
    out.push(b'\n');
    out.extend_from_slice(stored.as_deref().unwrap_or(body));
    Bytes::from(out)
}

/// The head and the body as received.
pub fn decode_raw(raw: &Bytes) -> Result<(RawHead, Bytes), String> {
    let at = raw.iter().position(|b| *b == b'\n').ok_or("raw record without a head")?;
    let head: RawHead =
        serde_json::from_slice(&raw[..at]).map_err(|e| format!("raw record head: {e}"))?;
    let stored = raw.slice(at + 1..);
    let body = match head.zstd_of {
        None => stored,
        Some(len) => {
            let len = usize::try_from(len).map_err(|_| "raw record: body length too large")?;
            let body = zstd::bulk::decompress(&stored, len)
                .map_err(|e| format!("raw record body: not zstd of {len} bytes: {e}"))?;
            if body.len() != len {
                return Err(format!("raw record body: {} bytes, not {len}", body.len()));
            }
            Bytes::from(body)
        }
    };
    Ok((head, body))
}

/// What a fetched URL turned out to be (stored as "page", "redirect" or "other").
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum PageKind {
    /// A 2xx `text/html` answer: a page of the export.
    Page,
    /// An HTTP redirect or a meta refresh of delay 0: an alias of where its chain ends.
    Redirect,
    /// Anything else (a 404, an image, a failure, robots.txt said no), with its reason.
    #[default]
    #[serde(other)]
    Other,
}

impl PageKind {
    /// Whether its inlinks are counted (spec §6.3: in-degree counts fetched pages, and a
    /// redirect passes its own on to where it ends).
    pub fn counts_inlinks(self) -> bool {
        matches!(self, PageKind::Page | PageKind::Redirect)
    }
}

/// What the page is, as `perc page` shows it.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Meta {
    pub kind: PageKind,
    /// For anything but a page: why not.
    pub reason: String,
    pub status: Option<u16>,
    pub title: String,
    pub noindex: bool,
    pub content_hash: String,
    pub redirect_to: Option<String>,
    pub encoding: String,
    /// Links left out for their length (spec §6.1: longer than the URL limit, or too long
    /// to share a row key with this page's URL).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub long_links_dropped: u32,
    /// Links to distinct targets past the most one page keeps (`perc_crawl::parse::LINKS_MAX`).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub links_over_max: u32,
    /// The page's `<link rel=canonical>`, resolved: its vote (spec §6.4).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub declared_canonical: Option<String>,
    /// The simhash of the page's text, in hex (spec §6.4a; none under 3 tokens).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub simhash: Option<String>,
    /// The language of the page's main text, ISO 639-3 (spec §6.4b; none when undetermined).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lang: Option<String>,
    /// A page's refresh that is not a redirect (a delay above 0), as recorded: "after 5 s
    /// to <url>".
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub refresh: Option<String>,
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}

/// Targets for link discovery.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Follow {
    pub depth: u32,
    pub hops: u32,
    /// Links to follow (one hop deeper).
    pub links: Vec<String>,
    /// A redirect's target (same depth, one more hop).
    pub redirect: Option<String>,
}

#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Inlink {
    pub from: String,
    pub to: String,
    pub anchor: String,
}

/// One line of the export (spec §7), fields in the documented order.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ExportLine {
    pub url: String,
    pub canonical: String,
    pub content_hash: String,
    pub title: String,
    pub in_degree: u64,
    pub noindex: bool,
    /// On the canonical's line: the canonical URLs of its cluster's near-duplicate clusters,
    /// sorted, at most [`NEAR_LISTED_MAX`]; `[]` on every other line.
    #[serde(default)]
    pub near_duplicates: Vec<String>,
    /// Its PageRank (spec §6.4b), joined from `rank:rank` when read; 0 in the stored line.
    #[serde(default)]
    pub pagerank: f64,
    /// The language of the page's main text, ISO 639-3, or `None` (spec §6.4b).
    #[serde(default)]
    pub lang: Option<String>,
    pub inlinks: Vec<Inlink>,
}

/// One edge of the link graph (`perc export --links`, spec §7): `from` links to `to` with
/// this anchor; `target` is the page of the export the edge counts for (`to` itself, or the
/// end of its redirect chain), `None` when there is none (a 404, a URL not fetched, a
/// redirect that ends nowhere).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LinkLine {
    pub from: String,
    pub to: String,
    pub target: Option<String>,
    pub anchor: String,
}

/// The most near-duplicates a line lists (spec §6.4a: the 20 smallest).
pub const NEAR_LISTED_MAX: usize = 20;

/// Crawl settings the observers need, stored once per store.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CrawlScope {
    pub seeds: Vec<String>,
    pub prefixes: Vec<String>,
    pub max_depth: u32,
    pub max_redirects: u32,
}

impl CrawlScope {
    /// The prefixes that bound this scope: its own, or its seeds' origins when it has none.
    fn bounds(&self) -> Vec<String> {
        if !self.prefixes.is_empty() {
            return self.prefixes.clone();
        }
        self.seeds
            .iter()
            .filter_map(|s| url::Url::parse(s).ok())
            .map(|u| format!("{}/", u.origin().ascii_serialization()))
            .collect()
    }

    /// The scope holding both this one's URLs and `other`'s (its limits are `other`'s): the
    /// seeds of both, bounded by the prefixes of both (a scope without prefixes by its seeds'
    /// origins).
    pub fn union(&self, other: &CrawlScope) -> CrawlScope {
        let mut seeds = self.seeds.clone();
        seeds.extend(other.seeds.iter().filter(|s| !self.seeds.contains(s)).cloned());
        let mut prefixes = self.bounds();
        for p in other.bounds() {
            if !prefixes.contains(&p) {
                prefixes.push(p);
            }
        }
        CrawlScope {
            seeds,
            prefixes,
            max_depth: other.max_depth,
            max_redirects: other.max_redirects,
        }
    }
}

/// What forwarding (`crate::forward`) needs, as a cluster's choice read it: the `members`
/// of the cluster of `hash`, each member's `indeg:names` and `fwd:names`, and the
/// `canonical` chosen.
pub struct Forward {
    pub hash: String,
    pub members: Vec<String>,
    pub names: Vec<Option<Bytes>>,
    pub forwarded: Vec<Option<Bytes>>,
    pub canonical: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn raw_records_round_trip_compressed_and_read_the_old_format() {
        let head = RawHead { status: Some(200), ..RawHead::default() };
        let body = "<html><title>t</title>".repeat(200);
        let raw = encode_raw(&head, body.as_bytes());
        assert!(raw.len() < body.len() / 4, "{} bytes stored for {}", raw.len(), body.len());
        let (got, back) = decode_raw(&raw).unwrap();
        assert_eq!((got.status, got.zstd_of), (Some(200), Some(body.len() as u64)));
        assert_eq!(back, body.as_bytes());
        // Empty bodies are stored as they are.
        let (got, back) = decode_raw(&encode_raw(&head, b"")).unwrap();
        assert_eq!((got.zstd_of, back.len()), (None, 0));
        // A record written before bodies were compressed.
        let old = Bytes::from(format!("{}\n{body}", serde_json::to_string(&head).unwrap()));
        assert_eq!(decode_raw(&old).unwrap().1, body.as_bytes());
        // A damaged body is an error, not a wrong page.
        let mut bad = raw.to_vec();
        let n = bad.len();
        bad[n - 4] ^= 0xff;
        bad.truncate(n - 2);
        assert!(decode_raw(&Bytes::from(bad)).is_err());
    }
}
