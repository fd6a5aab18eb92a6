//! The web side of perc: what a URL is and whether it is in scope ([`urls`]), what a page
//! says ([`parse`]: title, links and their anchors, robots meta, canonical and refresh
//! hints, decoded with the right charset), its main text and language ([`text`]), and its
//! content hash. Fetching, robots.txt and WARC come beside these; the observers use them
//! through the pipeline's crate and never see a socket.

pub mod fetch;
pub mod nesting;
pub mod parse;
pub mod robots;
pub mod simhash;
pub mod sitemap;
pub mod source;
pub mod text;
pub mod urls;
pub mod warc;

pub use fetch::{
    FetchError, FetchLimits, Fetcher, HostCount, HostState, HttpFetcher, Polite, PolitenessConfig,
    Received, Response, Validators,
};
pub use parse::{content_hash, decode, parse, parse_for_index, Link, ParsedPage, Refresh};
pub use robots::{RobotsCache, Verdict};
pub use source::{Budget, Crawler, Fetched, Offline, Recording, Source};
pub use urls::{normalize, resolve, Prefix, Scope};
