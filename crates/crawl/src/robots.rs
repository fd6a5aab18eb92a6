//! robots.txt (spec §6.1, RFC 9309): fetched once per origin at a time through the same
//! fetcher as pages, redirects followed (up to five hops, across hosts), parsed by
//! texting_robots for the configured user agent (Allow/Disallow, Crawl-delay), and cached
//! with a TTL in a moka cache, whose `get_with` makes every URL of an origin wait for the one
//! fetch in flight rather than start its own.
//!
//! A 4xx robots.txt (or more than five redirects) allows everything: there is none. A 5xx or
//! an unreachable host is tried `attempts` times, `retry_ms` apart; then the host is given
//! up for a while: RFC 9309 asks a crawler to assume complete disallow when robots.txt is
//! unreachable, and each of the host's URLs is answered [`Verdict::Unreachable`] instead of
//! waiting in the frontier forever (a page fetched before keeps its last version). A host
//! given up is tried again after `give_up_ms`, then after twice as long each time it is
//! given up again in a row, up to the TTL of rules; robots.txt read again ends the streak.

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
    /// Why, and for how long the host is given up.
    Unreachable(String, Duration),
}

/// How long an origin's rules are kept: a give-up its own time, the others the TTL.
struct Keep;

impl moka::Expiry<String, Rules> for Keep {
    fn expire_after_create(
        &self,
        _origin: &String,
        rules: &Rules,
        _at: std::time::Instant,
    ) -> Option<Duration> {
        match rules {
            Rules::Unreachable(_, for_how_long) => Some(*for_how_long),
            Rules::AllowAll | Rules::Parsed(_) => None,
        }
    }
}

/// The most redirects followed to reach a robots.txt (RFC 9309 §2.3.1.2).
const REDIRECTS_MAX: usize = 5;

/// How much of a robots.txt is read and parsed: RFC 9309 §2.5 asks for at least 500 KiB,
/// and a larger file is read up to there, not given up.
pub const ROBOTS_BYTES_MAX: u64 = 500 * 1024;

/// The most origins whose rules are kept.
const ORIGINS_MAX: u64 = 100_000;

pub struct RobotsCache {
    fetcher: Arc<dyn Fetcher>,
    agent: String,
    attempts: u32,
    retry: Duration,
    give_up: Duration,
    ttl: Duration,
    entries: moka::future::Cache<String, Rules>,
    /// The origins given up now, and how many times in a row each was.
    streaks: std::sync::Mutex<std::collections::HashMap<String, u32>>,
}

impl RobotsCache {
    /// Rules are kept `ttl_ms`; an unreachable robots.txt is tried `attempts` times,
    /// `retry_ms` apart, before its host is given up for `give_up_ms` (doubled for each
    /// give-up in a row, up to `ttl_ms`).
    pub fn new(
        fetcher: Arc<dyn Fetcher>,
        agent: impl Into<String>,
        ttl_ms: u64,
        retry_ms: u64,
        attempts: u32,
        give_up_ms: u64,
    ) -> RobotsCache {
        let ttl = Duration::from_millis(ttl_ms.max(1));
        RobotsCache {
            fetcher,
            agent: agent.into(),
            attempts: attempts.max(1),
            retry: Duration::from_millis(retry_ms),
            give_up: Duration::from_millis(give_up_ms.max(1)).min(ttl),
            ttl,
            entries: moka::future::Cache::builder()
                .max_capacity(ORIGINS_MAX)
                .time_to_live(ttl)
                .expire_after(Keep)
                .build(),
            streaks: Default::default(),
        }
    }

    pub async fn check(&self, url: &Url) -> Verdict {
        let origin = url.origin().ascii_serialization();
        match self.entries.get_with(origin, self.load(url)).await {
            Rules::AllowAll => Verdict::Allowed { crawl_delay_ms: None },
            Rules::Unreachable(why, _) => Verdict::Unreachable(why),
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
            Rules::AllowAll | Rules::Unreachable(..) => Vec::new(),
        }
    }

    async fn load(&self, url: &Url) -> Rules {
        let Ok(robots_url) = url.join("/robots.txt") else {
            return Rules::AllowAll;
        };
        let origin = url.origin().ascii_serialization();
        let mut why = String::new();
        for attempt in 0..self.attempts {
            if attempt > 0 {
                tokio::time::sleep(self.retry).await;
            }
            match self.fetch(&robots_url).await {
                Ok(rules) => {
                    self.streaks.lock().unwrap_or_else(|p| p.into_inner()).remove(&origin);
                    return rules;
                }
                Err(e) => why = e,
            }
        }
        let tries = if self.attempts == 1 {
            "1 attempt".to_string()
        } else {
            format!("{} attempts", self.attempts)
        };
        let streak = {
            let mut streaks = self.streaks.lock().unwrap_or_else(|p| p.into_inner());
            let n = streaks.entry(origin).or_insert(0);
            *n = n.saturating_add(1);
            *n
        };
        let for_how_long = self.give_up.saturating_mul(1 << (streak - 1).min(20)).min(self.ttl);
        Rules::Unreachable(
            format!("{why} ({tries}; tried again in {})", seconds(for_how_long)),
            for_how_long,
        )
    }

    /// How many origins are given up now (their rules unreachable), for tests and reports.
    pub fn given_up(&self) -> usize {
        self.streaks.lock().unwrap_or_else(|p| p.into_inner()).len()
    }

    /// One attempt: the rules, or why robots.txt could not be had.
    async fn fetch(&self, robots_url: &Url) -> Result<Rules, String> {
        let mut at = robots_url.clone();
        for _ in 0..=REDIRECTS_MAX {
            let r = self
                .fetcher
                .fetch_prefix(&at, ROBOTS_BYTES_MAX)
                .await
                .map_err(|e| format!("robots.txt: {e}"))?;
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

/// A duration as a person reads it: whole seconds, or ms under one.
fn seconds(d: Duration) -> String {
    match d.as_secs() {
        0 => format!("{} ms", d.as_millis()),
        s => format!("{s} s"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fetch::{FetchError, Response};
    use async_trait::async_trait;
    use bytes::Bytes;
    use std::sync::atomic::{AtomicU16, AtomicUsize, Ordering};

    /// Answers every URL with `status` and `body`, or redirects `/robots.txt` to `/moved`
    /// when `status` is 301; counts its fetches.
    struct Fake(AtomicU16, &'static str, AtomicUsize);

    fn fake(status: u16, body: &'static str) -> Arc<Fake> {
        Arc::new(Fake(AtomicU16::new(status), body, AtomicUsize::new(0)))
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
            let answer = self.0.load(Ordering::SeqCst);
            if answer == 0 {
                return Err(FetchError::Timeout { after_ms: 5 });
            }
            let (status, location) = match (answer, url.path()) {
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
        let cache = RobotsCache::new(fake(200, txt), "perc", 60_000, 1, 3, 60_000);
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
        let cache = RobotsCache::new(f.clone(), "perc", 60_000, 1, 3, 60_000);
        let urls: Vec<Url> = (0..17).map(|i| u(&format!("http://h.test/p{i}"))).collect();
        let verdicts = futures::future::join_all(urls.iter().map(|x| cache.check(x))).await;
        assert!(verdicts.iter().all(|v| matches!(v, Verdict::Allowed { .. })));
        assert_eq!(f.2.load(Ordering::SeqCst), 1, "one fetch for 17 URLs in flight");
    }

    #[tokio::test]
    async fn robots_txt_redirects_are_followed() {
        let f = fake(301, "User-agent: *\nDisallow: /private/");
        let cache = RobotsCache::new(f.clone(), "perc", 60_000, 1, 3, 60_000);
        assert_eq!(cache.check(&u("http://h.test/private/a")).await, Verdict::Disallowed);
        assert_eq!(f.2.load(Ordering::SeqCst), 2, "robots.txt, then where it moved");
    }

    #[tokio::test]
    async fn missing_allows_and_an_unreachable_host_is_given_up_after_its_attempts() {
        let none = RobotsCache::new(fake(404, ""), "perc", 60_000, 1, 3, 60_000);
        assert_eq!(
            none.check(&u("http://h.test/a")).await,
            Verdict::Allowed { crawl_delay_ms: None }
        );
        let f = fake(503, "");
        let down = RobotsCache::new(f.clone(), "perc", 60_000, 1, 3, 60_000);
        assert_eq!(
            down.check(&u("http://h.test/a")).await,
            Verdict::Unreachable(
                "robots.txt answered HTTP 503 (3 attempts; tried again in 60 s)".into()
            )
        );
        assert_eq!(
            down.check(&u("http://h.test/b")).await,
            down.check(&u("http://h.test/a")).await
        );
        assert_eq!(f.2.load(Ordering::SeqCst), 3, "given up: not fetched again");
        let gone = RobotsCache::new(fake(0, ""), "perc", 60_000, 1, 2, 60_000);
        assert!(
            matches!(gone.check(&u("http://h.test/a")).await, Verdict::Unreachable(ref w) if w.contains("timed out")),
        );
    }

    /// A host given up is asked again once its give-up is over (twice as long after each
    /// give-up in a row), and robots.txt read again ends the streak.
    #[tokio::test]
    async fn a_host_given_up_is_tried_again_after_a_growing_give_up() {
        let f = fake(503, "User-agent: *\nDisallow: /private/");
        let cache = RobotsCache::new(f.clone(), "perc", 60_000, 1, 1, 200);
        let a = u("http://h.test/a");
        let until = |want: fn(&Verdict) -> bool| {
            let (cache, a) = (&cache, &a);
            async move {
                let started = std::time::Instant::now();
                loop {
                    let v = cache.check(a).await;
                    if want(&v) {
                        return (v, started.elapsed());
                    }
                    assert!(started.elapsed() < Duration::from_secs(30), "still {v:?}");
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
            }
        };
        let first = cache.check(&a).await;
        assert!(
            matches!(&first, Verdict::Unreachable(w) if w.ends_with("tried again in 200 ms)")),
            "{first:?}"
        );
        assert_eq!(cache.given_up(), 1);
        // The second give-up in a row is twice as long.
        let (second, after) =
            until(|v| matches!(v, Verdict::Unreachable(w) if w.contains("400 ms"))).await;
        assert!(after >= Duration::from_millis(150), "asked again after {after:?}: {second:?}");
        // The host is back: asked again when the give-up ends, it is read.
        f.0.store(200, Ordering::SeqCst);
        let (_, after) = until(|v| *v == Verdict::Allowed { crawl_delay_ms: None }).await;
        assert!(after >= Duration::from_millis(300), "read again after {after:?}");
        assert_eq!(cache.given_up(), 0, "the streak ended");
        assert_eq!(cache.check(&u("http://h.test/private/x")).await, Verdict::Disallowed);
        assert_eq!(f.2.load(Ordering::SeqCst), 3, "two give-ups, then read");
    }
}
