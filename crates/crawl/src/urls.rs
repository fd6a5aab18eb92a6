//! URLs as perc keeps them, and the crawl's scope (SPEC §6.1).
//!
//! A URL is parsed the WHATWG way (the `url` crate), resolved against the page or its
//! `<base href>`, its fragment dropped; only `http` and `https` are kept. The serialized form
//! is the key everywhere (rows, links, the export), so two spellings of one URL are one page:
//! the host is lower-cased, a default port dropped, dot segments removed.
//!
//! Scope: by default the origins (scheme, host, port) of the seeds; configured prefixes narrow
//! it to URLs starting with one of them. Out-of-scope links are still inverted (they are
//! facts about the pages that link), but never fetched.

use url::Url;

/// Parses an absolute URL into perc's form, or says why it is not one.
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
    Ok(url)
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
    Some(url)
}

/// Which URLs the crawler may fetch.
#[derive(Clone, Debug, Default)]
pub struct Scope {
    origins: Vec<url::Origin>,
    prefixes: Vec<String>,
}

impl Scope {
    /// The seeds' origins, narrowed by `prefixes` when any are given.
    pub fn new<'a>(seeds: impl IntoIterator<Item = &'a Url>, prefixes: &[String]) -> Scope {
        let mut origins: Vec<url::Origin> = Vec::new();
        for s in seeds {
            let o = s.origin();
            if !origins.contains(&o) {
                origins.push(o);
            }
        }
        Scope { origins, prefixes: prefixes.to_vec() }
    }

    pub fn contains(&self, url: &Url) -> bool {
        if !self.prefixes.is_empty() {
            return self.prefixes.iter().any(|p| url.as_str().starts_with(p.as_str()));
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
        let s = Scope::new(&seeds, &[]);
        assert!(s.contains(&normalize("http://a.test/anything").unwrap()));
        assert!(s.contains(&normalize("https://b.test:8443/x").unwrap()));
        assert!(
            !s.contains(&normalize("https://a.test/").unwrap()),
            "another scheme is another origin"
        );
        assert!(!s.contains(&normalize("http://c.test/").unwrap()));
        let narrow = Scope::new(&seeds, &["http://a.test/docs/".to_string()]);
        assert!(narrow.contains(&normalize("http://a.test/docs/x").unwrap()));
        assert!(!narrow.contains(&normalize("http://a.test/other").unwrap()));
    }
}
