//! Where the fetch observer gets pages from: the live web through a polite fetcher and
//! robots.txt ([`Crawler`]), or anything else that implements [`Source`] (a fake in tests);
//! and the wrappers a run puts around them: a per-run [`Budget`], a [`Recording`] of every
//! response into a WARC, and [`Offline`] for a run that only replays.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use url::Url;

use crate::fetch::{FetchError, Fetcher, Polite, Response, Validators};
use crate::robots::{RobotsCache, Verdict};
use crate::warc::Recorder;

/// The outcome of asking for one URL.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Fetched {
    Response(Response),
    /// No response, for a reason that asking again will not change (a body over the size
    /// limit); the reason is recorded on the page.
    Failed(String),
    /// No response this time: the host, the network or this machine failed (no connection,
    /// a timeout, a reset, robots.txt unreachable, no file descriptor left), or this run
    /// may not fetch it. A page fetched before keeps its last version and is asked again
    /// later; a URL never fetched is recorded with the reason.
    Unavailable(String),
    /// robots.txt forbids it (recorded on the page).
    Disallowed,
}

impl Fetched {
    /// What happened to a fetch that has no response: a [`FetchError`] that asking again may
    /// mend is [`Fetched::Unavailable`], one it will not is [`Fetched::Failed`].
    pub fn from_error(e: &FetchError) -> Fetched {
        match e {
            FetchError::TooLarge { .. } => Fetched::Failed(e.to_string()),
            _ => Fetched::Unavailable(e.to_string()),
        }
    }
}

#[async_trait]
pub trait Source: Send + Sync + 'static {
    async fn get(&self, url: &Url) -> Fetched;

    /// A refetch, conditional on `validators` where the source can (a 304 answers an
    /// unchanged page); a source that cannot fetches as [`Source::get`] does.
    async fn get_if(&self, url: &Url, _validators: &Validators) -> Fetched {
        self.get(url).await
    }

    /// The sitemaps that the robots.txt of `url`'s origin names (its `Sitemap:` lines), as
    /// written there; none for a source that reads no robots.txt.
    async fn sitemaps_of(&self, _url: &Url) -> Vec<String> {
        Vec::new()
    }

    /// A sitemap file, fetched as a page is but not counted as one (a page budget does not
    /// pay for it).
    async fn get_sitemap(&self, url: &Url) -> Fetched {
        self.get(url).await
    }
}

#[async_trait]
impl<F: Fetcher + ?Sized> Fetcher for Arc<F> {
    async fn fetch_if(&self, url: &Url, v: &Validators) -> Result<Response, FetchError> {
        (**self).fetch_if(url, v).await
    }

    async fn fetch_prefix(&self, url: &Url, bytes_max: u64) -> Result<Response, FetchError> {
        (**self).fetch_prefix(url, bytes_max).await
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
        self.get_if(url, &Validators::default()).await
    }

    async fn get_if(&self, url: &Url, validators: &Validators) -> Fetched {
        match self.robots.check(url).await {
            Verdict::Disallowed => return Fetched::Disallowed,
            Verdict::Unreachable(why) => {
                return Fetched::Unavailable(format!(
                    "robots.txt unreachable: {why}; the host is given up until then (RFC 9309: \
                     complete disallow)"
                ))
            }
            Verdict::Allowed { crawl_delay_ms } => {
                if let Some(ms) = crawl_delay_ms {
                    self.fetcher.set_host_delay(url, ms).await;
                }
            }
        }
        match self.fetcher.fetch_if(url, validators).await {
            Ok(r) => Fetched::Response(r),
            Err(e) => Fetched::from_error(&e),
        }
    }

    async fn sitemaps_of(&self, url: &Url) -> Vec<String> {
        self.robots.sitemaps(url).await
    }
}

/// Fetches nothing: a URL not already loaded is recorded as not available (`perc replay`).
pub struct Offline;

#[async_trait]
impl Source for Offline {
    async fn get(&self, _url: &Url) -> Fetched {
        Fetched::Unavailable("not fetched: this run only replays recorded responses".into())
    }
}

/// A source with a budget: after `max` fetches in this run, the rest are recorded as not
/// fetched (`crawl.max_pages`).
pub struct Budget {
    inner: Arc<dyn Source>,
    left: AtomicU64,
    max: u64,
}

impl Budget {
    pub fn new(inner: Arc<dyn Source>, max: u64) -> Budget {
        Budget { inner, left: AtomicU64::new(max), max }
    }
}

#[async_trait]
impl Source for Budget {
    async fn get(&self, url: &Url) -> Fetched {
        self.get_if(url, &Validators::default()).await
    }

    async fn get_if(&self, url: &Url, validators: &Validators) -> Fetched {
        let granted = self
            .left
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .is_ok();
        if !granted {
            return Fetched::Unavailable(format!(
                "not fetched: this run reached crawl.max_pages = {}",
                self.max
            ));
        }
        self.inner.get_if(url, validators).await
    }

    async fn sitemaps_of(&self, url: &Url) -> Vec<String> {
        self.inner.sitemaps_of(url).await
    }

    async fn get_sitemap(&self, url: &Url) -> Fetched {
        self.inner.get_sitemap(url).await
    }
}

/// A fetcher that writes every response it gets into a WARC (`--warc-out`). A record that
/// cannot be written is logged; the crawl goes on.
pub struct Recording<F> {
    inner: F,
    recorder: Mutex<Recorder>,
    user_agent: String,
}

impl<F: Fetcher> Recording<F> {
    pub fn new(inner: F, recorder: Recorder, user_agent: String) -> Recording<F> {
        Recording { inner, recorder: Mutex::new(recorder), user_agent }
    }
}

#[async_trait]
impl<F: Fetcher> Fetcher for Recording<F> {
    async fn fetch_if(&self, url: &Url, v: &Validators) -> Result<Response, FetchError> {
        let r = self.inner.fetch_if(url, v).await?;
        self.record(url, &r);
        Ok(r)
    }

    async fn fetch_prefix(&self, url: &Url, bytes_max: u64) -> Result<Response, FetchError> {
        let r = self.inner.fetch_prefix(url, bytes_max).await?;
        self.record(url, &r);
        Ok(r)
    }
}

impl<F> Recording<F> {
    fn record(&self, url: &Url, r: &Response) {
        let mut rec = self.recorder.lock().unwrap_or_else(|e| e.into_inner());
        if let Err(e) = rec.record(url, &self.user_agent, r) {
            tracing::error!(file = %rec.path().display(), error = %e, "cannot write the WARC");
        }
    }
}
