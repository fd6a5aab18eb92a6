//! The records stored in the pipeline's cells: a frontier entry, a fetch outcome, what a
//! page is, the links to follow, the crawl's scope and an export line (SPEC §6.6).

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
}

/// `crawl:raw` = JSON head, a newline, then the body bytes as received.
pub fn encode_raw(head: &RawHead, body: &[u8]) -> Bytes {
    let mut out = serde_json::to_vec(head).expect("serializable");
    out.push(b'\n');
    out.extend_from_slice(body);
    Bytes::from(out)
}

pub fn decode_raw(raw: &Bytes) -> Result<(RawHead, Bytes), String> {
    let at = raw.iter().position(|b| *b == b'\n').ok_or("raw record without a head")?;
    let head = serde_json::from_slice(&raw[..at]).map_err(|e| format!("raw record head: {e}"))?;
    Ok((head, raw.slice(at + 1..)))
}

/// What the page is, as `perc page` shows it.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Meta {
    /// "page", "redirect" or "other".
    pub kind: String,
    /// For anything but a page: why not.
    pub reason: String,
    pub status: Option<u16>,
    pub title: String,
    pub noindex: bool,
    pub content_hash: String,
    pub redirect_to: Option<String>,
    pub encoding: String,
    /// Links left out for their length (SPEC §6.1: longer than the URL limit, or too long
    /// to share a row key with this page's URL).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub long_links_dropped: u32,
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

/// One line of the export (SPEC §6.6), fields in the documented order.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExportLine {
    pub url: String,
    pub canonical: String,
    pub content_hash: String,
    pub title: String,
    pub in_degree: u64,
    pub noindex: bool,
    pub inlinks: Vec<Inlink>,
}

/// Crawl settings the observers need, stored once per store.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CrawlScope {
    pub seeds: Vec<String>,
    pub prefixes: Vec<String>,
    pub max_depth: u32,
    pub max_redirects: u32,
}
