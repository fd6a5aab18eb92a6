//! Where the fetch observer gets pages from: the live web through a polite fetcher and
//! robots.txt ([`Crawler`]), or anything else that implements [`Source`] (a fake in tests).

use std::sync::Arc;

use async_trait::async_trait;
use url::Url;

use crate::fetch::{FetchError, Fetcher, Polite, Response};
use crate::robots::{RobotsCache, Verdict};

/// The outcome of asking for one URL.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Fetched {
    Response(Response),
    /// No response; the reason is recorded on the page.
    Failed(String),
    /// robots.txt forbids it (recorded on the page).
    Disallowed,
}

#[async_trait]
pub trait Source: Send + Sync + 'static {
    async fn get(&self, url: &Url) -> Fetched;
}

#[async_trait]
impl<F: Fetcher + ?Sized> Fetcher for Arc<F> {
    async fn fetch(&self, url: &Url) -> Result<Response, FetchError> {
        (**self).fetch(url).await
    }
}

/// The live web: robots.txt first, then a polite fetch.
pub struct Crawler<F: Fetcher> {
    fetcher: Arc<Polite<F>>,
    robots: RobotsCache,
}

impl<F: Fetcher> Crawler<F> {
    pub fn new(fetcher: Arc<Polite<F>>, robots: RobotsCache) -> Crawler<F> {
        Crawler { fetcher, robots }
    }
}

#[async_trait]
impl<F: Fetcher> Source for Crawler<F> {
    async fn get(&self, url: &Url) -> Fetched {
        match self.robots.check(url).await {
            Verdict::Disallowed => return Fetched::Disallowed,
            Verdict::Unreachable(why) => {
                return Fetched::Failed(format!(
                    "robots.txt unreachable: {why}; the host is given up (RFC 9309: complete \
                     disallow)"
                ))
            }
            Verdict::Allowed { crawl_delay_ms } => {
                if let Some(ms) = crawl_delay_ms {
                    self.fetcher.set_host_delay(url, ms).await;
                }
            }
        }
        match self.fetcher.fetch(url).await {
            Ok(r) => Fetched::Response(r),
            Err(e) => Fetched::Failed(e.to_string()),
        }
    }
}
