//! URLs as perc keeps them, and the crawl's scope (spec §6.1).
//!
//! A URL is parsed the WHATWG way (the `url` crate), resolved against the page or its
//! `<base href>`, its fragment dropped; only `http` and `https` are kept. The serialized form
//! is the key everywhere (rows, links, the export), so two spellings of one URL are one page:
//! the host is lower-cased, a default port dropped, dot segments removed.
//!
//! Userinfo (`user:pass@`) is removed: a credential never reaches the store, the export, a
//! log line or a server perc did not mean to send it to.
//!
//! Length: a URL longer than [`URL_BYTES_MAX`] is not kept (spec §6.1 asks for at least
//! 2 KiB; 2048 bytes is the sitemaps.org limit, and what browsers and search engines reliably
//! handle). Row keys that hold two URLs (an edge: target and source) must fit the store's
//! 4080-byte key limit, so a link is also dropped when it and its page together exceed
//! [`PAIR_BYTES_MAX`]; both need URLs near the limit.
//!
//! Scope: by default the origins (scheme, host, port) of the seeds; configured prefixes narrow
//! it. A prefix matches a URL with the same scheme, host and port whose path starts with the
//! prefix's path at a segment boundary: `http://h/docs` matches `/docs`, `/docs/` and
//! `/docs/a`, never `/docs.evil/`. Out-of-scope links are still inverted (they are facts about
//! the pages that link), but never fetched.

use url::Url;

/// The longest URL perc keeps, in bytes of its serialized form.
pub const URL_BYTES_MAX: usize = 2048;

/// The most bytes two URLs sharing one row key may have together: the store's key limit
/// (`perc_store::ROW_KEY_BYTES_MAX`, 4080) less the 3 bytes of a two-URL key's prefix and
/// separator, `e:<target>\0<source>`.
pub const PAIR_BYTES_MAX: usize = 4077;

/// Parses an absolute URL into perc's form, or says why it is not one. Userinfo is removed
/// ([`had_userinfo`] tells whether there was any).
pub fn normalize(raw: &str) -> Result<Url, String> {
    let mut url = Url::parse(raw.trim()).map_err(|e| format!("invalid URL {raw:?}: {e}"))?;
    if !matches!(url.scheme(), "http" | "https") {
        return Err(format!(
            "unsupported URL scheme {:?} in {raw:?}: only http and https",
            url.scheme()
        ));
    }
    if url.host_str().is_none_or(str::is_empty) {
        return Err(format!("URL {raw:?} has no host"));
    }
    url.set_fragment(None);
    strip_userinfo(&mut url);
    if url.as_str().len() > URL_BYTES_MAX {
        return Err(format!(
            "URL of {} bytes is longer than the {URL_BYTES_MAX}-byte limit: {}...",
            url.as_str().len(),
            &url.as_str()[..80] // a serialized URL is ASCII
        ));
    }
    Ok(url)
}

/// Whether `raw` carries a user name or password (which [`normalize`] removes).
pub fn had_userinfo(raw: &str) -> bool {
    Url::parse(raw.trim()).is_ok_and(|u| !u.username().is_empty() || u.password().is_some())
}

fn strip_userinfo(url: &mut Url) {
    if !url.username().is_empty() || url.password().is_some() {
        // Infallible for http(s) URLs with a host, which is all perc keeps.
        let _ = url.set_username("");
        let _ = url.set_password(None);
    }
}

/// Resolves a link's `href` against `base`: `None` for what is not a fetchable http(s) URL
/// (`mailto:`, `javascript:`, garbage).
pub fn resolve(base: &Url, href: &str) -> Option<Url> {
    let href = href.trim();
    if href.is_empty() {
        // An empty href points at the document itself.
        let mut u = base.clone();
        u.set_fragment(None);
        return Some(u);
    }
    let mut url = base.join(href).ok()?;
    if !matches!(url.scheme(), "http" | "https") || url.host_str().is_none_or(str::is_empty) {
        return None;
    }
    url.set_fragment(None);
    strip_userinfo(&mut url);
    Some(url)
}

/// Whether a link from `source` to `target` may be kept: the target is not longer than
/// [`URL_BYTES_MAX`], and the two fit one row key together.
pub fn link_fits(source: &Url, target: &Url) -> bool {
    let t = target.as_str().len();
    t <= URL_BYTES_MAX && t + source.as_str().len() <= PAIR_BYTES_MAX
}

/// Which URLs the crawler may fetch.
#[derive(Clone, Debug, Default)]
pub struct Scope {
    origins: Vec<url::Origin>,
    prefixes: Vec<Prefix>,
}

/// A URL prefix, parsed: its origin and its path. It contains a URL of the same origin whose
/// path starts with its path at a segment boundary (`/docs` contains `/docs` and `/docs/a`,
/// not `/docsearch`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Prefix {
    origin: url::Origin,
    path: String,
}

impl Prefix {
    /// An absolute http(s) URL as a prefix (its query and fragment are ignored); an error
    /// naming it otherwise.
    pub fn parse(raw: &str) -> Result<Prefix, String> {
        let u = parse_prefix(raw)?;
        Ok(Prefix { origin: u.origin(), path: u.path().to_string() })
    }

    /// The length of its path: of two prefixes that contain a URL, the longer is the closer.
    pub fn path_len(&self) -> usize {
        self.path.len()
    }

    pub fn contains(&self, url: &Url) -> bool {
        if url.origin() != self.origin {
            return false;
        }
        let path = url.path();
        if self.path.ends_with('/') {
            return path.starts_with(&self.path);
        }
        path.strip_prefix(self.path.as_str())
            .is_some_and(|rest| rest.is_empty() || rest.starts_with('/'))
    }
}

/// Parses a scope prefix: an absolute http(s) URL (its query and fragment are ignored).
pub fn parse_prefix(raw: &str) -> Result<Url, String> {
    normalize(raw)
        .map_err(|e| format!("the scope prefix {raw:?} is not an absolute http(s) URL ({e})"))
}

impl Scope {
    /// The seeds' origins, narrowed by `prefixes` when any are given. A prefix that is not an
    /// absolute http(s) URL is an error naming it.
    pub fn new<'a>(
        seeds: impl IntoIterator<Item = &'a Url>,
        prefixes: &[String],
    ) -> Result<Scope, String> {
        let mut origins: Vec<url::Origin> = Vec::new();
        for s in seeds {
            let o = s.origin();
            if !origins.contains(&o) {
                origins.push(o);
            }
        }
        let prefixes = prefixes.iter().map(|p| Prefix::parse(p)).collect::<Result<_, String>>()?;
        Ok(Scope { origins, prefixes })
    }

    pub fn contains(&self, url: &Url) -> bool {
        if !self.prefixes.is_empty() {
            return self.prefixes.iter().any(|p| p.contains(url));
        }
        self.origins.contains(&url.origin())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn normalizes_the_whatwg_way() {
        let u = normalize("HTTP://Example.COM:80/a/./b/../c?q=1#frag").unwrap();
        assert_eq!(u.as_str(), "http://example.com/a/c?q=1");
        assert_eq!(normalize("https://example.com").unwrap().as_str(), "https://example.com/");
        assert!(normalize("ftp://example.com/").unwrap_err().contains("only http and https"));
        assert!(normalize("not a url").unwrap_err().contains("invalid URL"));
        assert!(normalize("http://").is_err());
    }

    #[test]
    fn resolves_links() {
        let base = normalize("http://h.test/dir/page.html").unwrap();
        let r = |h| resolve(&base, h).map(|u| u.to_string());
        assert_eq!(r("other.html").as_deref(), Some("http://h.test/dir/other.html"));
        assert_eq!(r("../up.html#x").as_deref(), Some("http://h.test/up.html"));
        assert_eq!(r("//elsewhere.test/p").as_deref(), Some("http://elsewhere.test/p"));
        assert_eq!(r("#top").as_deref(), Some("http://h.test/dir/page.html"));
        assert_eq!(r("").as_deref(), Some("http://h.test/dir/page.html"));
        assert_eq!(r("mailto:a@b.c"), None);
        assert_eq!(r("javascript:void(0)"), None);
        assert_eq!(r("  spaced.html  ").as_deref(), Some("http://h.test/dir/spaced.html"));
    }

    #[test]
    fn scope_is_seed_origins_narrowed_by_prefixes() {
        let seeds =
            [normalize("http://a.test/start").unwrap(), normalize("https://b.test:8443/").unwrap()];
        let s = Scope::new(&seeds, &[]).unwrap();
        assert!(s.contains(&normalize("http://a.test/anything").unwrap()));
        assert!(s.contains(&normalize("https://b.test:8443/x").unwrap()));
        assert!(
            !s.contains(&normalize("https://a.test/").unwrap()),
            "another scheme is another origin"
        );
        assert!(!s.contains(&normalize("http://c.test/").unwrap()));
        let narrow = Scope::new(&seeds, &["http://a.test/docs/".to_string()]).unwrap();
        assert!(narrow.contains(&normalize("http://a.test/docs/x").unwrap()));
        assert!(!narrow.contains(&normalize("http://a.test/other").unwrap()));
    }

    #[test]
    fn prefix_matches_at_segment_boundaries_and_same_origin_only() {
        let seeds = [normalize("http://127.0.0.1/").unwrap()];
        let docs = Scope::new(&seeds, &["http://h.test/docs".to_string()]).unwrap();
        let has = |s: &Scope, u: &str| s.contains(&normalize(u).unwrap());
        assert!(has(&docs, "http://h.test/docs"));
        assert!(has(&docs, "http://h.test/docs/"));
        assert!(has(&docs, "http://h.test/docs/a?q=1"));
        assert!(!has(&docs, "http://h.test/docs.evil/"));
        assert!(!has(&docs, "http://h.test/docsx"));
        assert!(!has(&docs, "http://h.test:8080/docs/"), "another port");
        assert!(!has(&docs, "https://h.test/docs/"), "another scheme");
        let host = Scope::new(&seeds, &["http://127.0.0.1".to_string()]).unwrap();
        assert!(has(&host, "http://127.0.0.1/anything"));
        assert!(!has(&host, "http://127.0.0.1:8202/"), "a host prefix does not admit other ports");
        let e = Scope::new(&seeds, &["docs/".to_string()]).unwrap_err();
        assert!(e.contains("the scope prefix \"docs/\" is not an absolute http(s) URL"), "{e}");
        assert!(Scope::new(&seeds, &["ftp://h.test/".to_string()]).is_err());
    }

    #[test]
    fn credentials_are_stripped_and_long_urls_refused() {
        assert_eq!(normalize("http://user:pw@h.test/a").unwrap().as_str(), "http://h.test/a");
        assert!(had_userinfo("http://user:pw@h.test/a"));
        assert!(!had_userinfo("http://h.test/a"));
        let base = normalize("http://h.test/").unwrap();
        assert_eq!(resolve(&base, "https://u@x.test/p").unwrap().as_str(), "https://x.test/p");
        let long = format!("http://h.test/{}", "a".repeat(URL_BYTES_MAX));
        assert!(normalize(&long).unwrap_err().contains("longer than the 2048-byte limit"));
        let target = resolve(&base, &long).unwrap();
        assert!(!link_fits(&base, &target));
        let sized = |c: &str, n: usize| {
            normalize(&format!("http://h.test/{}", c.repeat(n - "http://h.test/".len()))).unwrap()
        };
        assert!(link_fits(&sized("a", 2038), &sized("b", 2039)));
        assert!(!link_fits(&sized("a", 2039), &sized("b", 2039)));
        assert!(link_fits(&base, &sized("b", URL_BYTES_MAX)));
        assert!(!link_fits(&sized("a", URL_BYTES_MAX), &sized("b", URL_BYTES_MAX)));
    }
}
