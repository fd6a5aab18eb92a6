//! Fetching one URL (SPEC §6.2): one GET, no redirect followed (the pipeline follows them, so
//! that each hop is scope- and robots-checked and recorded as an alias), with a connect
//! timeout, a total timeout, and a body cap enforced while the body streams in, after
//! decompression, so a gzip bomb is cut off rather than inflated.
//!
//! [`Fetcher`] is the trait the fetch observer is handed; [`HttpFetcher`] implements it with
//! reqwest, and [`Polite`] wraps any fetcher with per-host politeness (one request in flight
//! per host, a delay between requests, `Retry-After` on 429/503) under a global limit.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use bytes::{Bytes, BytesMut};
use url::Url;

/// A response, as far as perc cares.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Response {
    pub status: u16,
    /// The media type, lower-cased, without parameters (`text/html`).
    pub content_type: Option<String>,
    /// The `charset` parameter of Content-Type, if any.
    pub charset: Option<String>,
    /// `Location`, resolved against the request URL (for 3xx).
    pub location: Option<Url>,
    /// `Retry-After` in seconds (for 429/503).
    pub retry_after_s: Option<u64>,
    pub body: Bytes,
}

impl Response {
    pub fn is_html(&self) -> bool {
        matches!(self.content_type.as_deref(), Some("text/html") | Some("application/xhtml+xml"))
    }
}

/// A Content-Type header's media type (lower-cased) and `charset` parameter.
pub fn split_content_type(header: Option<String>) -> (Option<String>, Option<String>) {
    let Some(ct) = header else { return (None, None) };
    let mut parts = ct.split(';');
    let media = parts.next().map(|m| m.trim().to_ascii_lowercase());
    let charset = parts
        .filter_map(|p| p.trim().split_once('='))
        .find(|(k, _)| k.trim().eq_ignore_ascii_case("charset"))
        .map(|(_, v)| v.trim().trim_matches('"').to_string());
    (media, charset)
}

/// Why a fetch produced no response.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum FetchError {
    #[error("cannot connect to {host}: {detail}")]
    Unreachable { host: String, detail: String },
    #[error("timed out after {after_ms} ms")]
    Timeout { after_ms: u64 },
    #[error("body exceeds the {max_bytes}-byte limit")]
    TooLarge { max_bytes: u64 },
    #[error("HTTP error: {0}")]
    Http(String),
}

#[async_trait]
pub trait Fetcher: Send + Sync + 'static {
    async fn fetch(&self, url: &Url) -> Result<Response, FetchError>;
}

/// Limits of one fetch; each a config key.
#[derive(Clone, Debug)]
pub struct FetchLimits {
    pub connect_timeout_ms: u64,
    pub total_timeout_ms: u64,
    pub body_bytes_max: u64,
    pub user_agent: String,
}

impl Default for FetchLimits {
    fn default() -> Self {
        FetchLimits {
            connect_timeout_ms: 10_000,
            total_timeout_ms: 30_000,
            body_bytes_max: 10 * 1024 * 1024,
            user_agent: "perc/0.1 (+https://example.invalid/perc)".into(),
        }
    }
}

/// The real fetcher, on reqwest.
pub struct HttpFetcher {
    client: reqwest::Client,
    limits: FetchLimits,
}

impl HttpFetcher {
    pub fn new(limits: FetchLimits) -> Result<HttpFetcher, FetchError> {
        let client = reqwest::Client::builder()
            .redirect(reqwest::redirect::Policy::none())
            .connect_timeout(Duration::from_millis(limits.connect_timeout_ms))
            .timeout(Duration::from_millis(limits.total_timeout_ms))
            .user_agent(limits.user_agent.clone())
            .build()
            .map_err(|e| FetchError::Http(e.to_string()))?;
        Ok(HttpFetcher { client, limits })
    }
}

fn classify(url: &Url, e: reqwest::Error, limits: &FetchLimits) -> FetchError {
    if e.is_timeout() {
        FetchError::Timeout { after_ms: limits.total_timeout_ms }
    } else if e.is_connect() {
        let detail = std::error::Error::source(&e).map_or_else(|| e.to_string(), |s| s.to_string());
        FetchError::Unreachable { host: url.host_str().unwrap_or_default().to_string(), detail }
    } else {
        FetchError::Http(e.to_string())
    }
}

#[async_trait]
impl Fetcher for HttpFetcher {
    async fn fetch(&self, url: &Url) -> Result<Response, FetchError> {
        let mut resp = self
            .client
            .get(url.clone())
            .send()
            .await
            .map_err(|e| classify(url, e, &self.limits))?;
        let headers = resp.headers();
        let header = |name: reqwest::header::HeaderName| {
            headers.get(name).and_then(|v| v.to_str().ok()).map(str::to_string)
        };
        let (content_type, charset) = split_content_type(header(reqwest::header::CONTENT_TYPE));
        let location = header(reqwest::header::LOCATION).and_then(|l| url.join(&l).ok());
        let retry_after_s =
            header(reqwest::header::RETRY_AFTER).and_then(|r| r.trim().parse().ok());
        let status = resp.status().as_u16();
        let mut body = BytesMut::new();
        while let Some(chunk) = resp.chunk().await.map_err(|e| classify(url, e, &self.limits))? {
            if (body.len() + chunk.len()) as u64 > self.limits.body_bytes_max {
                return Err(FetchError::TooLarge { max_bytes: self.limits.body_bytes_max });
            }
            body.extend_from_slice(&chunk);
        }
        Ok(Response { status, content_type, charset, location, retry_after_s, body: body.freeze() })
    }
}

/// Politeness settings.
#[derive(Clone, Debug)]
pub struct PolitenessConfig {
    /// Requests in flight across all hosts.
    pub concurrency_max: usize,
    /// Pause between two requests to one host, unless robots.txt asks for more.
    pub host_delay_ms: u64,
    /// The most a Crawl-delay or Retry-After may make us wait.
    pub delay_cap_ms: u64,
}

impl Default for PolitenessConfig {
    fn default() -> Self {
        PolitenessConfig { concurrency_max: 16, host_delay_ms: 0, delay_cap_ms: 30_000 }
    }
}

/// Per-host politeness around a fetcher: one request in flight per host, spaced by the
/// host's delay; `Retry-After` on 429/503 pushes the host's next slot back.
pub struct Polite<F> {
    inner: F,
    config: PolitenessConfig,
    global: tokio::sync::Semaphore,
    hosts: Mutex<HashMap<String, Arc<tokio::sync::Mutex<HostSlot>>>>,
}

#[derive(Default)]
struct HostSlot {
    next_at: Option<Instant>,
    delay_ms: u64,
}

impl<F: Fetcher> Polite<F> {
    pub fn new(inner: F, config: PolitenessConfig) -> Polite<F> {
        let global = tokio::sync::Semaphore::new(config.concurrency_max.max(1));
        Polite { inner, config, global, hosts: Mutex::new(HashMap::new()) }
    }

    fn slot(&self, url: &Url) -> Arc<tokio::sync::Mutex<HostSlot>> {
        let key = format!("{}://{}", url.scheme(), url.authority());
        let mut hosts = self.hosts.lock().unwrap_or_else(|e| e.into_inner());
        hosts.entry(key).or_default().clone()
    }

    /// Sets a host's delay between requests (robots.txt's Crawl-delay), capped.
    pub async fn set_host_delay(&self, url: &Url, delay_ms: u64) {
        let capped = delay_ms.min(self.config.delay_cap_ms);
        self.slot(url).lock().await.delay_ms = capped;
    }
}

#[async_trait]
impl<F: Fetcher> Fetcher for Polite<F> {
    async fn fetch(&self, url: &Url) -> Result<Response, FetchError> {
        let slot = self.slot(url);
        // The host's lock is held for the whole request: one in flight per host.
        let mut host = slot.lock().await;
        if let Some(at) = host.next_at {
            tokio::time::sleep_until(at.into()).await;
        }
        let _permit = self.global.acquire().await.expect("semaphore never closed");
        let result = self.inner.fetch(url).await;
        let mut delay = host.delay_ms.max(self.config.host_delay_ms);
        if let Ok(r) = &result {
            if matches!(r.status, 429 | 503) {
                delay = delay.max(r.retry_after_s.unwrap_or(1).saturating_mul(1000));
            }
        }
        host.next_at =
            Some(Instant::now() + Duration::from_millis(delay.min(self.config.delay_cap_ms)));
        result
    }
}
