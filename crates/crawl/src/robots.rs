//! robots.txt (SPEC §6.1): fetched once per origin through the same fetcher as pages, parsed
//! by texting_robots for the configured user agent (Allow/Disallow, Crawl-delay), and cached
//! with a TTL. A 4xx robots.txt allows everything (there is none); a 5xx or an unreachable
//! host defers the host: the caller tries again later rather than crawling blind.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use url::Url;

use crate::fetch::Fetcher;

/// What robots.txt says about one URL.
#[derive(Clone, Debug, PartialEq)]
pub enum Verdict {
    Allowed {
        crawl_delay_ms: Option<u64>,
    },
    Disallowed,
    /// robots.txt could not be had (5xx, unreachable): try the host again later.
    Deferred(String),
}

#[derive(Clone)]
enum Rules {
    AllowAll,
    Parsed(Arc<texting_robots::Robot>),
    Deferred(String),
}

pub struct RobotsCache {
    fetcher: Arc<dyn Fetcher>,
    agent: String,
    ttl: Duration,
    /// A deferral is remembered for less time than rules are.
    retry: Duration,
    entries: Mutex<HashMap<String, (Rules, Instant)>>,
}

impl RobotsCache {
    pub fn new(
        fetcher: Arc<dyn Fetcher>,
        agent: impl Into<String>,
        ttl_ms: u64,
        retry_ms: u64,
    ) -> RobotsCache {
        RobotsCache {
            fetcher,
            agent: agent.into(),
            ttl: Duration::from_millis(ttl_ms),
            retry: Duration::from_millis(retry_ms),
            entries: Mutex::new(HashMap::new()),
        }
    }

    fn cached(&self, origin: &str) -> Option<Rules> {
        let entries = self.entries.lock().unwrap_or_else(|e| e.into_inner());
        let (rules, at) = entries.get(origin)?;
        let life = if matches!(rules, Rules::Deferred(_)) { self.retry } else { self.ttl };
        (at.elapsed() < life).then(|| rules.clone())
    }

    pub async fn check(&self, url: &Url) -> Verdict {
        let origin = url.origin().ascii_serialization();
        let rules = match self.cached(&origin) {
            Some(r) => r,
            None => {
                let r = self.load(url).await;
                let mut entries = self.entries.lock().unwrap_or_else(|e| e.into_inner());
                entries.insert(origin, (r.clone(), Instant::now()));
                r
            }
        };
        match rules {
            Rules::AllowAll => Verdict::Allowed { crawl_delay_ms: None },
            Rules::Deferred(why) => Verdict::Deferred(why),
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

    async fn load(&self, url: &Url) -> Rules {
        let Ok(robots_url) = url.join("/robots.txt") else {
            return Rules::AllowAll;
        };
        match self.fetcher.fetch(&robots_url).await {
            Ok(r) if (200..300).contains(&r.status) => {
                match texting_robots::Robot::new(&self.agent, &r.body) {
                    Ok(robot) => Rules::Parsed(Arc::new(robot)),
                    // Unparseable rules are treated like none, as crawlers commonly do.
                    Err(_) => Rules::AllowAll,
                }
            }
            Ok(r) if (400..500).contains(&r.status) => Rules::AllowAll,
            Ok(r) => Rules::Deferred(format!("robots.txt answered HTTP {}", r.status)),
            Err(e) => Rules::Deferred(format!("robots.txt: {e}")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fetch::{FetchError, Response};
    use async_trait::async_trait;
    use bytes::Bytes;

    struct Fake(u16, &'static str);

    #[async_trait]
    impl Fetcher for Fake {
        async fn fetch(&self, _url: &Url) -> Result<Response, FetchError> {
            if self.0 == 0 {
                return Err(FetchError::Timeout { after_ms: 5 });
            }
            Ok(Response {
                status: self.0,
                content_type: Some("text/plain".into()),
                charset: None,
                location: None,
                retry_after_s: None,
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
        let cache = RobotsCache::new(Arc::new(Fake(200, txt)), "perc", 60_000, 1_000);
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
    async fn missing_allows_and_errors_defer() {
        let none = RobotsCache::new(Arc::new(Fake(404, "")), "perc", 60_000, 1_000);
        assert_eq!(
            none.check(&u("http://h.test/a")).await,
            Verdict::Allowed { crawl_delay_ms: None }
        );
        let down = RobotsCache::new(Arc::new(Fake(503, "")), "perc", 60_000, 1_000);
        assert_eq!(
            down.check(&u("http://h.test/a")).await,
            Verdict::Deferred("robots.txt answered HTTP 503".into())
        );
        let gone = RobotsCache::new(Arc::new(Fake(0, "")), "perc", 60_000, 1_000);
        assert!(
            matches!(gone.check(&u("http://h.test/a")).await, Verdict::Deferred(ref w) if w.contains("timed out"))
        );
    }
}
