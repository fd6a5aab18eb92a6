//! robots.txt (SPEC §6.1, RFC 9309): fetched once per origin at a time through the same
//! fetcher as pages, redirects followed (up to five hops, across hosts), parsed by
//! texting_robots for the configured user agent (Allow/Disallow, Crawl-delay), and cached
//! with a TTL in a moka cache, whose `get_with` makes every URL of an origin wait for the one
//! fetch in flight rather than start its own.
//!
//! A 4xx robots.txt (or more than five redirects) allows everything: there is none. A 5xx or
//! an unreachable host is tried `attempts` times, `retry_ms` apart; then the host is given
//! up for the cache's TTL: RFC 9309 asks a crawler to assume complete disallow when
//! robots.txt is unreachable, and each of the host's URLs is recorded with that reason
//! instead of waiting in the frontier forever.

use std::sync::Arc;
use std::time::Duration;

use url::Url;

use crate::fetch::Fetcher;

/// What robots.txt says about one URL.
#[derive(Clone, Debug, PartialEq)]
pub enum Verdict {
    Allowed {
        crawl_delay_ms: Option<u64>,
    },
    Disallowed,
    /// robots.txt could not be had after every attempt: the host is given up.
    Unreachable(String),
}

#[derive(Clone)]
enum Rules {
    AllowAll,
    Parsed(Arc<texting_robots::Robot>),
    Unreachable(String),
}

/// The most redirects followed to reach a robots.txt (RFC 9309 §2.3.1.2).
const REDIRECTS_MAX: usize = 5;

/// The most origins whose rules are kept.
const ORIGINS_MAX: u64 = 100_000;

pub struct RobotsCache {
    fetcher: Arc<dyn Fetcher>,
    agent: String,
    attempts: u32,
    retry: Duration,
    entries: moka::future::Cache<String, Rules>,
}

impl RobotsCache {
    /// Rules are kept `ttl_ms`; an unreachable robots.txt is tried `attempts` times,
    /// `retry_ms` apart, before its host is given up (for `ttl_ms` too).
    pub fn new(
        fetcher: Arc<dyn Fetcher>,
        agent: impl Into<String>,
        ttl_ms: u64,
        retry_ms: u64,
        attempts: u32,
    ) -> RobotsCache {
        RobotsCache {
            fetcher,
            agent: agent.into(),
            attempts: attempts.max(1),
            retry: Duration::from_millis(retry_ms),
            entries: moka::future::Cache::builder()
                .max_capacity(ORIGINS_MAX)
                .time_to_live(Duration::from_millis(ttl_ms.max(1)))
                .build(),
        }
    }

    pub async fn check(&self, url: &Url) -> Verdict {
        let origin = url.origin().ascii_serialization();
        match self.entries.get_with(origin, self.load(url)).await {
            Rules::AllowAll => Verdict::Allowed { crawl_delay_ms: None },
            Rules::Unreachable(why) => Verdict::Unreachable(why),
            Rules::Parsed(robot) => {
                if robot.allowed(url.as_str()) {
                    Verdict::Allowed {
                        crawl_delay_ms: robot.delay.map(|d| (f64::from(d) * 1000.0) as u64),
                    }
                } else {
                    Verdict::Disallowed
                }
            }
        }
    }

    /// The `Sitemap:` lines of the robots.txt of `url`'s origin (fetched once, as for
    /// [`Self::check`]).
    pub async fn sitemaps(&self, url: &Url) -> Vec<String> {
        let origin = url.origin().ascii_serialization();
        match self.entries.get_with(origin, self.load(url)).await {
            Rules::Parsed(robot) => robot.sitemaps.clone(),
            Rules::AllowAll | Rules::Unreachable(_) => Vec::new(),
        }
    }

    async fn load(&self, url: &Url) -> Rules {
        let Ok(robots_url) = url.join("/robots.txt") else {
            return Rules::AllowAll;
        };
        let mut why = String::new();
        for attempt in 0..self.attempts {
            if attempt > 0 {
                tokio::time::sleep(self.retry).await;
            }
            match self.fetch(&robots_url).await {
                Ok(rules) => return rules,
                Err(e) => why = e,
            }
        }
        let tries = if self.attempts == 1 {
            "1 attempt".to_string()
        } else {
            format!("{} attempts", self.attempts)
        };
        Rules::Unreachable(format!("{why} ({tries})"))
    }

    /// One attempt: the rules, or why robots.txt could not be had.
    async fn fetch(&self, robots_url: &Url) -> Result<Rules, String> {
        let mut at = robots_url.clone();
        for _ in 0..=REDIRECTS_MAX {
            let r = self.fetcher.fetch(&at).await.map_err(|e| format!("robots.txt: {e}"))?;
            match r.status {
                200..=299 => {
                    // Unparseable rules are treated like none, as crawlers commonly do.
                    return Ok(match texting_robots::Robot::new(&self.agent, &r.body) {
                        Ok(robot) => Rules::Parsed(Arc::new(robot)),
                        Err(_) => Rules::AllowAll,
                    });
                }
                300..=399 => match r.location {
                    Some(next) => at = next,
                    None => return Ok(Rules::AllowAll),
                },
                400..=499 => return Ok(Rules::AllowAll),
                status => return Err(format!("robots.txt answered HTTP {status}")),
            }
        }
        Ok(Rules::AllowAll)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fetch::{FetchError, Response};
    use async_trait::async_trait;
    use bytes::Bytes;
    use std::sync::atomic::{AtomicUsize, Ordering};

    /// Answers every URL with `status` and `body`, or redirects `/robots.txt` to `/moved`
    /// when `status` is 301; counts its fetches.
    struct Fake(u16, &'static str, AtomicUsize);

    fn fake(status: u16, body: &'static str) -> Arc<Fake> {
        Arc::new(Fake(status, body, AtomicUsize::new(0)))
    }

    #[async_trait]
    impl Fetcher for Fake {
        async fn fetch_if(
            &self,
            url: &Url,
            _: &crate::fetch::Validators,
        ) -> Result<Response, FetchError> {
            self.2.fetch_add(1, Ordering::SeqCst);
            // Slow enough that concurrent checks overlap.
            tokio::time::sleep(Duration::from_millis(20)).await;
            if self.0 == 0 {
                return Err(FetchError::Timeout { after_ms: 5 });
            }
            let (status, location) = match (self.0, url.path()) {
                (301, "/robots.txt") => (301, Some(url.join("/moved").unwrap())),
                (301, _) => (200, None),
                (s, _) => (s, None),
            };
            Ok(Response {
                status,
                content_type: Some("text/plain".into()),
                charset: None,
                location,
                retry_after_s: None,
                received: None,
                body: Bytes::from_static(self.1.as_bytes()),
            })
        }
    }

    fn u(s: &str) -> Url {
        Url::parse(s).unwrap()
    }

    #[tokio::test]
    async fn rules_for_our_agent() {
        let txt = "User-agent: *\nDisallow: /private/\nAllow: /private/ok\nCrawl-delay: 2\n\nUser-agent: other\nDisallow: /";
        let cache = RobotsCache::new(fake(200, txt), "perc", 60_000, 1, 3);
        assert_eq!(
            cache.check(&u("http://h.test/public")).await,
            Verdict::Allowed { crawl_delay_ms: Some(2000) }
        );
        assert_eq!(cache.check(&u("http://h.test/private/x")).await, Verdict::Disallowed);
        assert_eq!(
            cache.check(&u("http://h.test/private/ok")).await,
            Verdict::Allowed { crawl_delay_ms: Some(2000) }
        );
    }

    #[tokio::test]
    async fn robots_txt_is_fetched_once_per_host_however_many_urls_wait_for_it() {
        let f = fake(200, "User-agent: *\nDisallow: /x/");
        let cache = RobotsCache::new(f.clone(), "perc", 60_000, 1, 3);
        let urls: Vec<Url> = (0..17).map(|i| u(&format!("http://h.test/p{i}"))).collect();
        let verdicts = futures::future::join_all(urls.iter().map(|x| cache.check(x))).await;
        assert!(verdicts.iter().all(|v| matches!(v, Verdict::Allowed { .. })));
        assert_eq!(f.2.load(Ordering::SeqCst), 1, "one fetch for 17 URLs in flight");
    }

    #[tokio::test]
    async fn robots_txt_redirects_are_followed() {
        let f = fake(301, "User-agent: *\nDisallow: /private/");
        let cache = RobotsCache::new(f.clone(), "perc", 60_000, 1, 3);
        assert_eq!(cache.check(&u("http://h.test/private/a")).await, Verdict::Disallowed);
        assert_eq!(f.2.load(Ordering::SeqCst), 2, "robots.txt, then where it moved");
    }

    #[tokio::test]
    async fn missing_allows_and_an_unreachable_host_is_given_up_after_its_attempts() {
        let none = RobotsCache::new(fake(404, ""), "perc", 60_000, 1, 3);
        assert_eq!(
            none.check(&u("http://h.test/a")).await,
            Verdict::Allowed { crawl_delay_ms: None }
        );
        let f = fake(503, "");
        let down = RobotsCache::new(f.clone(), "perc", 60_000, 1, 3);
        assert_eq!(
            down.check(&u("http://h.test/a")).await,
            Verdict::Unreachable("robots.txt answered HTTP 503 (3 attempts)".into())
        );
        assert_eq!(
            down.check(&u("http://h.test/b")).await,
            down.check(&u("http://h.test/a")).await
        );
        assert_eq!(f.2.load(Ordering::SeqCst), 3, "given up: not fetched again");
        let gone = RobotsCache::new(fake(0, ""), "perc", 60_000, 1, 2);
        assert!(
            matches!(gone.check(&u("http://h.test/a")).await, Verdict::Unreachable(ref w) if w.contains("timed out")),
        );
    }
}
