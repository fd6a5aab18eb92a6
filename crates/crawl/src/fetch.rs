//! Fetching one URL (spec §6.2): one GET, no redirect followed (the pipeline follows them, so
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
    /// The HTTP head as received (a live fetch's; none for a response perc made up or
    /// replayed), for `--warc-out`.
    pub received: Option<Box<Received>>,
}

/// An HTTP response head as received: the status line's version and every header field in
/// order (names as the HTTP library gives them, lower-cased; values as bytes).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Received {
    pub version: String,
    pub headers: Vec<(String, Vec<u8>)>,
}

impl Response {
    /// A response perc makes up (a test's web, a fake source): `status`, `text/html`, `body`,
    /// no head as received.
    pub fn html(status: u16, body: impl Into<Bytes>) -> Response {
        Response {
            status,
            content_type: Some("text/html".into()),
            charset: None,
            location: None,
            retry_after_s: None,
            body: body.into(),
            received: None,
        }
    }

    /// The `ETag` and `Last-Modified` it was received with, for a conditional refetch.
    pub fn validators(&self) -> Validators {
        let field = |name: &str| {
            let head = self.received.as_ref()?;
            let (_, v) = head.headers.iter().find(|(n, _)| n.eq_ignore_ascii_case(name))?;
            std::str::from_utf8(v).ok().map(|v| v.trim().to_string())
        };
        Validators { etag: field("etag"), last_modified: field("last-modified") }
    }

    pub fn is_html(&self) -> bool {
        matches!(self.content_type.as_deref(), Some("text/html") | Some("application/xhtml+xml"))
    }
}

/// A Content-Type header's media type (lower-cased) and `charset` parameter. A header the
/// media-type grammar refuses keeps what precedes its first `;` as the type, no charset.
pub fn split_content_type(header: Option<String>) -> (Option<String>, Option<String>) {
    let Some(ct) = header else { return (None, None) };
    match ct.trim().parse::<mime::Mime>() {
        Ok(m) => {
            let charset = m.get_param(mime::CHARSET).map(|c| c.as_str().to_string());
            (Some(m.essence_str().to_ascii_lowercase()), charset)
        }
        Err(_) => {
            let media = ct.split(';').next().map(|m| m.trim().to_ascii_lowercase());
            (media.filter(|m| !m.is_empty()), None)
        }
    }
}

/// A `Retry-After` value in seconds from `now`: delay-seconds, or an HTTP-date (RFC 9110
/// §10.2.3; a date in the past is 0). Anything else is ignored.
pub fn retry_after_seconds(value: &str, now: std::time::SystemTime) -> Option<u64> {
    let value = value.trim();
    if let Ok(s) = value.parse::<u64>() {
        return Some(s);
    }
    let at = httpdate::parse_http_date(value).ok()?;
    Some(at.duration_since(now).map_or(0, |d| d.as_secs_f64().ceil() as u64))
}

/// Why a fetch produced no response.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum FetchError {
    #[error("cannot connect to {host}: {detail}")]
    Unreachable { host: String, detail: String },
    #[error("timed out after {after_ms} ms")]
    Timeout { after_ms: u64 },
    /// This machine, not the host, failed the request (no file descriptor or memory left):
    /// never counted against the host.
    #[error("this machine could not make the request: {detail}")]
    Local { detail: String },
    #[error("body exceeds the {max_bytes}-byte limit")]
    TooLarge { max_bytes: u64 },
    #[error("HTTP error: {0}")]
    Http(String),
}

#[async_trait]
pub trait Fetcher: Send + Sync + 'static {
    /// Fetches `url`, conditionally when `validators` has any (a 304 answers an unchanged
    /// page: status 304, no body).
    async fn fetch_if(&self, url: &Url, validators: &Validators) -> Result<Response, FetchError>;

    async fn fetch(&self, url: &Url) -> Result<Response, FetchError> {
        self.fetch_if(url, &Validators::default()).await
    }

    /// The first `bytes_max` bytes of `url`'s body, the rest left unread: for a file read only
    /// as far as its standard says (robots.txt: at least 500 KiB, RFC 9309 §2.5), however
    /// large it is. A fetcher that cannot stop reading fetches it whole and cuts it.
    async fn fetch_prefix(&self, url: &Url, bytes_max: u64) -> Result<Response, FetchError> {
        let mut r = self.fetch(url).await?;
        r.body.truncate(usize::try_from(bytes_max).unwrap_or(usize::MAX));
        Ok(r)
    }
}

/// What a refetch sends to be answered 304 if nothing changed: the `ETag` and the
/// `Last-Modified` the last response had.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Validators {
    pub etag: Option<String>,
    pub last_modified: Option<String>,
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
    let e = e.without_url();
    let cause = root_cause(&e);
    if local_failure(&e) {
        FetchError::Local { detail: cause }
    } else if e.is_timeout() {
        FetchError::Timeout { after_ms: limits.total_timeout_ms }
    } else if e.is_connect() {
        let host = url.host_str().unwrap_or_default().to_string();
        FetchError::Unreachable { host, detail: cause }
    } else {
        // reqwest's own words say what it was doing ("error decoding response body"), the
        // innermost cause why.
        let said = e.to_string();
        FetchError::Http(if said == cause { said } else { format!("{said}: {cause}") })
    }
}

/// The innermost cause of an error (its URL taken out: the page it is recorded on names
/// it): "Connection refused (os error 111)", where reqwest's own message says only "error
/// sending request".
fn root_cause(e: &reqwest::Error) -> String {
    let mut at: &dyn std::error::Error = e;
    while let Some(cause) = at.source() {
        at = cause;
    }
    at.to_string()
}

/// Whether an error's cause is this machine's: no file descriptor (EMFILE, ENFILE), no
/// buffer or memory (ENOBUFS, ENOMEM). The host is not to blame for those.
fn local_failure(e: &reqwest::Error) -> bool {
    let mut at: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(cause) = at {
        if let Some(io) = cause.downcast_ref::<std::io::Error>() {
            if matches!(io.raw_os_error(), Some(23 | 24 | 105 | 12)) {
                return true;
            }
        }
        at = cause.source();
    }
    false
}

#[async_trait]
impl Fetcher for HttpFetcher {
    async fn fetch_if(&self, url: &Url, v: &Validators) -> Result<Response, FetchError> {
        self.get(url, v, None).await
    }

    async fn fetch_prefix(&self, url: &Url, bytes_max: u64) -> Result<Response, FetchError> {
        self.get(url, &Validators::default(), Some(bytes_max)).await
    }
}

impl HttpFetcher {
    /// One GET; its body up to `body_bytes_max` (more is an error), or, with `cut`, up to
    /// that many bytes (the rest left unread).
    async fn get(
        &self,
        url: &Url,
        v: &Validators,
        cut: Option<u64>,
    ) -> Result<Response, FetchError> {
        let mut request = self.client.get(url.clone());
        if let Some(etag) = &v.etag {
            request = request.header(reqwest::header::IF_NONE_MATCH, etag);
        }
        if let Some(date) = &v.last_modified {
            request = request.header(reqwest::header::IF_MODIFIED_SINCE, date);
        }
        let mut resp = request.send().await.map_err(|e| classify(url, e, &self.limits))?;
        let headers = resp.headers();
        let header = |name: reqwest::header::HeaderName| {
            headers.get(name).and_then(|v| v.to_str().ok()).map(str::to_string)
        };
        let (content_type, charset) = split_content_type(header(reqwest::header::CONTENT_TYPE));
        let location = header(reqwest::header::LOCATION).and_then(|l| url.join(&l).ok());
        let retry_after_s = header(reqwest::header::RETRY_AFTER)
            .and_then(|r| retry_after_seconds(&r, std::time::SystemTime::now()));
        let status = resp.status().as_u16();
        let received = Received {
            version: format!("{:?}", resp.version()),
            headers: headers
                .iter()
                .map(|(name, value)| (name.as_str().to_string(), value.as_bytes().to_vec()))
                .collect(),
        };
        let mut body = BytesMut::new();
        while let Some(chunk) = resp.chunk().await.map_err(|e| classify(url, e, &self.limits))? {
            if let Some(cut) = cut {
                let room = usize::try_from(cut).unwrap_or(usize::MAX).saturating_sub(body.len());
                body.extend_from_slice(&chunk[..chunk.len().min(room)]);
                if chunk.len() >= room {
                    break;
                }
                continue;
            }
            if (body.len() + chunk.len()) as u64 > self.limits.body_bytes_max {
                return Err(FetchError::TooLarge { max_bytes: self.limits.body_bytes_max });
            }
            body.extend_from_slice(&chunk);
        }
        Ok(Response {
            status,
            content_type,
            charset,
            location,
            retry_after_s,
            body: body.freeze(),
            received: Some(Box::new(received)),
        })
    }
}

/// Politeness settings.
#[derive(Clone, Debug)]
pub struct PolitenessConfig {
    /// Requests in flight across all hosts.
    pub concurrency_max: usize,
    /// Requests in flight to one host, when it asks for no delay between them.
    pub per_host: usize,
    /// Pause between two requests to one host, unless robots.txt asks for more.
    pub host_delay_ms: u64,
    /// The most a Crawl-delay or Retry-After may make us wait.
    pub delay_cap_ms: u64,
}

impl Default for PolitenessConfig {
    fn default() -> Self {
        PolitenessConfig {
            concurrency_max: 16,
            per_host: 1,
            host_delay_ms: 0,
            delay_cap_ms: 30_000,
        }
    }
}

/// Per-host politeness around a fetcher: up to `per_host` requests in flight to a host (one
/// when there is a delay between its requests: a Crawl-delay, `host_delay_ms`), spaced by
/// that delay; `Retry-After` on 429/503 pushes the host's next request back.
pub struct Polite<F> {
    inner: F,
    config: PolitenessConfig,
    global: tokio::sync::Semaphore,
    hosts: Mutex<HashMap<String, Arc<Host>>>,
}

/// What one host was asked, for the crawl-rate report (`perc status`): requests made, those
/// that failed (no response, or a 4xx or 5xx), and the wall-clock ms of the first and the
/// last.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct HostCount {
    pub requests: u64,
    pub failed: u64,
    pub first_ms: u64,
    pub last_ms: u64,
}

/// What politeness does with one host now ([`Polite::host_states`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HostState {
    /// `scheme://authority`.
    pub host: String,
    pub in_flight: usize,
    /// The pause between two of its requests (its Crawl-delay, or `host_delay_ms`).
    pub delay_ms: u64,
    /// How long until it may be asked again (a delay, a Retry-After).
    pub wait_ms: u64,
}

struct Host {
    permits: tokio::sync::Semaphore,
    slot: tokio::sync::Mutex<HostSlot>,
    count: Mutex<HostCount>,
}

impl Host {
    fn count(&self, failed: bool) {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64);
        let mut c = self.count.lock().unwrap_or_else(|e| e.into_inner());
        if c.requests == 0 {
            c.first_ms = now;
        }
        c.requests += 1;
        c.failed += u64::from(failed);
        c.last_ms = c.last_ms.max(now);
    }
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

    /// Every host asked so far, by `scheme://authority`.
    pub fn host_counts(&self) -> HashMap<String, HostCount> {
        let hosts = self.hosts.lock().unwrap_or_else(|e| e.into_inner());
        hosts
            .iter()
            .map(|(key, h)| (key.clone(), *h.count.lock().unwrap_or_else(|e| e.into_inner())))
            .filter(|(_, c)| c.requests > 0)
            .collect()
    }

    /// What politeness does with each host asked so far, now: requests in flight, the
    /// delay between its requests, and how long until it may be asked again.
    pub fn host_states(&self) -> Vec<HostState> {
        let hosts = self.hosts.lock().unwrap_or_else(|e| e.into_inner());
        let per_host = self.config.per_host.max(1);
        let now = Instant::now();
        let mut out: Vec<HostState> = hosts
            .iter()
            .map(|(key, h)| {
                let in_flight = per_host.saturating_sub(h.permits.available_permits());
                // The slot is held through a spaced request (in flight): its wait is after it.
                let (delay_ms, wait_ms) = match h.slot.try_lock() {
                    Ok(slot) => (
                        slot.delay_ms.max(self.config.host_delay_ms),
                        slot.next_at
                            .map_or(0, |at| at.saturating_duration_since(now).as_millis() as u64),
                    ),
                    Err(_) => (self.config.host_delay_ms, 0),
                };
                HostState { host: key.clone(), in_flight, delay_ms, wait_ms }
            })
            .collect();
        out.sort_by(|a, b| a.host.cmp(&b.host));
        out
    }

    fn host(&self, url: &Url) -> Arc<Host> {
        let key = format!("{}://{}", url.scheme(), url.authority());
        let mut hosts = self.hosts.lock().unwrap_or_else(|e| e.into_inner());
        let per_host = self.config.per_host.max(1);
        hosts
            .entry(key)
            .or_insert_with(|| {
                Arc::new(Host {
                    permits: tokio::sync::Semaphore::new(per_host),
                    slot: tokio::sync::Mutex::new(HostSlot::default()),
                    count: Mutex::new(HostCount::default()),
                })
            })
            .clone()
    }

    /// Sets a host's delay between requests (robots.txt's Crawl-delay), capped.
    pub async fn set_host_delay(&self, url: &Url, delay_ms: u64) {
        let capped = delay_ms.min(self.config.delay_cap_ms);
        self.host(url).slot.lock().await.delay_ms = capped;
    }
}

#[async_trait]
impl<F: Fetcher> Fetcher for Polite<F> {
    async fn fetch_if(&self, url: &Url, v: &Validators) -> Result<Response, FetchError> {
        self.politely(url, self.inner.fetch_if(url, v)).await
    }

    async fn fetch_prefix(&self, url: &Url, bytes_max: u64) -> Result<Response, FetchError> {
        self.politely(url, self.inner.fetch_prefix(url, bytes_max)).await
    }
}

impl<F: Fetcher> Polite<F> {
    /// Makes `request` to `url`'s host when politeness lets it, and notes what it got.
    async fn politely(
        &self,
        url: &Url,
        request: impl std::future::Future<Output = Result<Response, FetchError>>,
    ) -> Result<Response, FetchError> {
        let host = self.host(url);
        let _host_permit = host.permits.acquire().await.expect("semaphore never closed");
        let slot = host.slot.lock().await;
        if let Some(at) = slot.next_at {
            tokio::time::sleep_until(at.into()).await;
        }
        // A delay between requests means one at a time: the slot is held for the whole
        // request. Without one, the host's permits alone bound what is in flight.
        let spaced = slot.delay_ms.max(self.config.host_delay_ms) > 0;
        let held = if spaced {
            Some(slot)
        } else {
            drop(slot);
            None
        };
        let result = {
            let _permit = self.global.acquire().await.expect("semaphore never closed");
            request.await
        };
        // This machine's failures are not the host's: they are not counted as its requests.
        if !matches!(result, Err(FetchError::Local { .. })) {
            host.count(result.as_ref().map_or(true, |r| r.status >= 400));
        }
        let mut slot = match held {
            Some(slot) => slot,
            None => host.slot.lock().await,
        };
        let mut delay = slot.delay_ms.max(self.config.host_delay_ms);
        if let Ok(r) = &result {
            if matches!(r.status, 429 | 503) {
                delay = delay.max(r.retry_after_s.unwrap_or(1).saturating_mul(1000));
            }
        }
        let next = Instant::now() + Duration::from_millis(delay.min(self.config.delay_cap_ms));
        // Requests in flight together end in any order: the latest pushback wins.
        slot.next_at = Some(slot.next_at.map_or(next, |at| at.max(next)));
        result
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::{Duration, SystemTime};

    #[test]
    fn content_types_by_the_media_type_grammar() {
        let split = |h: &str| split_content_type(Some(h.to_string()));
        let s = |v: &str| Some(v.to_string());
        assert_eq!(split("text/html"), (s("text/html"), None));
        assert_eq!(split("Text/HTML; Charset=\"ISO-8859-1\""), (s("text/html"), s("iso-8859-1")));
        assert_eq!(split("text/html;q=1;charset=utf-8"), (s("text/html"), s("utf-8")));
        // Refused by the grammar: the type before the first `;`, no charset.
        assert_eq!(split("text/html; charset"), (s("text/html"), None));
        assert_eq!(split("html"), (s("html"), None));
        assert_eq!(split(""), (None, None));
        assert_eq!(split_content_type(None), (None, None));
    }

    #[test]
    fn retry_after_in_seconds_or_as_an_http_date() {
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(784_111_777); // 1994-11-06 08:49:37
        assert_eq!(retry_after_seconds("120", now), Some(120));
        assert_eq!(retry_after_seconds(" 7 ", now), Some(7));
        assert_eq!(retry_after_seconds("Sun, 06 Nov 1994 08:51:37 GMT", now), Some(120));
        // The two obsolete date formats HTTP still accepts.
        assert_eq!(retry_after_seconds("Sunday, 06-Nov-94 08:50:37 GMT", now), Some(60));
        assert_eq!(retry_after_seconds("Sun Nov  6 08:49:47 1994", now), Some(10));
        assert_eq!(retry_after_seconds("Sun, 06 Nov 1994 08:00:00 GMT", now), Some(0), "past");
        assert_eq!(retry_after_seconds("soon", now), None);
        assert_eq!(retry_after_seconds("-5", now), None);
    }
}
