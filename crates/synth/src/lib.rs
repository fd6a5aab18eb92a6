//! A deterministic synthetic web, for the scaling benchmarks and for trying perc on a site of
//! any size (`perc generate`); [`write`] puts one on disk and [`site`] serves a directory
//! on 127.0.0.1 (the demo, the test fixtures, the benchmarks' sites).
//!
//! Page `i` of a web is a pure function of `(seed, i, version)`: nothing is kept in memory, so
//! a web of a million pages streams out page by page. What a web has, by default:
//!
//! - link targets drawn from a Zipf distribution (exponent 1): a few pages get most in-links,
//!   page 0 most of all (a page nearly every page links to), the long tail almost none;
//! - pages of 5-50 KB: a title, paragraphs of text, 10-40 links with anchor text spread
//!   through them;
//! - 5% exact duplicates of an earlier page, 2% redirects (301) to another page, 2% pages of
//!   broken HTML (cut short, tags left open), and 2% of links to pages that do not exist (404);
//! - change sets: `version` v > 0 of a page is that page after its v-th change, one of new
//!   text, new links, or becoming a duplicate of another page ([`Change`]).

use bytes::Bytes;
use perc_crawl::Response;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use rand_distr::{Distribution, Zipf};
use url::Url;

/// The shape of a web.
#[derive(Clone, Debug)]
pub struct Spec {
    pub pages: usize,
    pub seed: u64,
    /// Every URL is under this (`http://synth.test/` by default; a served copy uses its own).
    pub base: Url,
    pub duplicate_share: f64,
    pub redirect_share: f64,
    pub broken_share: f64,
    /// Links to pages that do not exist.
    pub missing_link_share: f64,
    /// Links per page, and page size in KB: uniform in `min..=max`.
    pub links: (usize, usize),
    pub body_kb: (usize, usize),
    pub zipf_exponent: f64,
}

impl Spec {
    pub fn new(pages: usize, seed: u64) -> Spec {
        Spec {
            pages,
            seed,
            base: Url::parse("http://synth.test/").expect("valid"),
            duplicate_share: 0.05,
            redirect_share: 0.02,
            broken_share: 0.02,
            missing_link_share: 0.02,
            links: (10, 40),
            body_kb: (5, 50),
            zipf_exponent: 1.0,
        }
    }
}

/// What page `i` is (in its original version).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Kind {
    Page,
    /// Byte for byte the body of an earlier page.
    Duplicate,
    /// A 301 to another page.
    Redirect,
    /// A page whose HTML is cut short and leaves tags open.
    Broken,
}

/// How a page changes in a change set.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Change {
    /// New text and new links (the update the latency benchmark makes).
    ContentAndLinks,
    /// Same links, new text.
    Content,
    /// Same text, new links.
    Links,
    /// Becomes an exact duplicate of another page.
    Duplicate,
}

pub struct Web {
    spec: Spec,
    zipf: Zipf<f64>,
}

// Salts that keep the page's random streams apart.
const KIND: u64 = 1;
const TEXT: u64 = 2;
const LINKS: u64 = 3;
const SOURCE: u64 = 4;
const CHANGE: u64 = 5;

fn splitmix(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

/// The words of the pages' text (and so what a search of a synthetic web finds).
pub const WORDS: [&str; 64] = [
    "index", "page", "widget", "gadget", "crawl", "order", "shipping", "price", "review", "about",
    "news", "story", "market", "garden", "river", "stone", "city", "light", "winter", "summer",
    "north", "south", "paper", "engine", "table", "window", "music", "history", "travel", "recipe",
    "science", "health", "school", "energy", "forest", "island", "bridge", "castle", "coffee",
    "harbor", "letter", "museum", "planet", "silver", "theory", "valley", "weather", "yellow",
    "account", "balance", "channel", "digital", "economy", "feature", "general", "journal",
    "library", "machine", "network", "process", "quality", "release", "support", "version",
];

impl Web {
    pub fn new(spec: Spec) -> Web {
        assert!(spec.pages > 0, "a web has at least one page");
        let zipf = Zipf::new(spec.pages as f64, spec.zipf_exponent).expect("valid Zipf");
        Web { spec, zipf }
    }

    pub fn spec(&self) -> &Spec {
        &self.spec
    }

    pub fn len(&self) -> usize {
        self.spec.pages
    }

    pub fn is_empty(&self) -> bool {
        self.spec.pages == 0
    }

    /// The path of page `i` (also of the missing pages, `i >= len`).
    pub fn path(i: usize) -> String {
        format!("/p/{i}.html")
    }

    pub fn url(&self, i: usize) -> Url {
        self.spec.base.join(&Web::path(i)).expect("valid path")
    }

    fn rng(&self, i: usize, salt: u64, version: u32) -> StdRng {
        let x = splitmix(
            self.spec.seed ^ splitmix(i as u64 ^ splitmix(salt ^ (u64::from(version) << 32))),
        );
        StdRng::seed_from_u64(x)
    }

    pub fn kind(&self, i: usize) -> Kind {
        if i == 0 {
            return Kind::Page;
        }
        let s = &self.spec;
        let u: f64 = self.rng(i, KIND, 0).random();
        if u < s.redirect_share {
            Kind::Redirect
        } else if u < s.redirect_share + s.duplicate_share {
            Kind::Duplicate
        } else if u < s.redirect_share + s.duplicate_share + s.broken_share {
            Kind::Broken
        } else {
            Kind::Page
        }
    }

    /// A popular page: Zipf-distributed over the existing pages.
    fn popular(&self, rng: &mut StdRng) -> usize {
        (self.zipf.sample(rng) as usize).clamp(1, self.spec.pages) - 1
    }

    /// The page whose body a duplicate (or a page turned into one) copies: an earlier page
    /// that has a body of its own.
    fn source(&self, i: usize, version: u32) -> usize {
        let mut j = self.rng(i, SOURCE, version).random_range(0..i.max(1));
        while j > 0 && matches!(self.kind(j), Kind::Duplicate | Kind::Redirect) {
            j -= 1;
        }
        j
    }

    /// Page `i` as a server would answer for it, in its original version.
    pub fn response(&self, i: usize) -> Response {
        match self.kind(i) {
            Kind::Redirect => {
                let target = self.popular(&mut self.rng(i, LINKS, 0));
                Response {
                    status: 301,
                    content_type: Some("text/html".into()),
                    charset: None,
                    location: Some(self.url(target)),
                    retry_after_s: None,
                    received: None,
                    body: Bytes::new(),
                }
            }
            Kind::Duplicate => html(self.body(self.source(i, 0), 0, 0)),
            Kind::Page => html(self.body(i, 0, 0)),
            Kind::Broken => html(broken(self.body(i, 0, 0), &mut self.rng(i, KIND, 1))),
        }
    }

    /// Page `i` after its `version`-th change (`version >= 1`), changed as `change` says. A
    /// redirect that changes becomes a page.
    pub fn changed(&self, i: usize, version: u32, change: Change) -> Response {
        assert!(version >= 1, "version 0 is the original: use response()");
        let (text, links) = match change {
            Change::ContentAndLinks => (version, version),
            Change::Content => (version, 0),
            Change::Links => (0, version),
            Change::Duplicate => return html(self.body(self.source(i, version), 0, 0)),
        };
        html(self.body(i, text, links))
    }

    /// `k` distinct pages to change (pages and broken pages, not duplicates or redirects),
    /// chosen by `seed`, with the changes cycling through content, links and duplicate.
    pub fn change_set(&self, k: usize, seed: u64) -> Vec<(usize, Change)> {
        let mut rng = self.rng(seed as usize, CHANGE, 0);
        let mut picked = std::collections::BTreeSet::new();
        let candidates = self.spec.pages;
        let mut out = Vec::new();
        let mut tries = 0;
        while out.len() < k && tries < 100 * k.max(1) {
            tries += 1;
            let i = rng.random_range(0..candidates);
            if matches!(self.kind(i), Kind::Page | Kind::Broken) && picked.insert(i) {
                let change = [Change::Content, Change::Links, Change::Duplicate][out.len() % 3];
                out.push((i, change));
            }
        }
        out
    }

    /// Every page in order, original versions: what a crawl of the whole web would get.
    pub fn responses(&self) -> impl Iterator<Item = (Url, Response)> + '_ {
        (0..self.spec.pages).map(|i| (self.url(i), self.response(i)))
    }

    /// The HTML of page `i` with text version `text` and link version `links`.
    fn body(&self, i: usize, text: u32, links: u32) -> String {
        let s = &self.spec;
        let mut trng = self.rng(i, TEXT, text);
        let mut lrng = self.rng(i, LINKS, links);
        let size = trng.random_range(s.body_kb.0..=s.body_kb.1) * 1024;
        let n_links = lrng.random_range(s.links.0..=s.links.1);
        let targets: Vec<usize> = (0..n_links)
            .map(|_| {
                if lrng.random_bool(s.missing_link_share) {
                    s.pages + lrng.random_range(0..s.pages)
                } else {
                    self.popular(&mut lrng)
                }
            })
            .collect();
        let word = |r: &mut StdRng| WORDS[r.random_range(0..WORDS.len())];
        let title = format!("{} {} {i}", word(&mut trng), word(&mut trng));
        let mut out = String::with_capacity(size + 1024);
        out.push_str("<!doctype html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">");
        out.push_str(&format!("<title>{title}</title></head>\n<body><h1>{title}</h1>\n"));
        // Links go into paragraphs spread over the page; the rest of the size is text.
        let paragraphs = (size / 700).max(1);
        let per = targets.len().div_ceil(paragraphs).max(1);
        let mut links = targets.iter();
        for _ in 0..paragraphs {
            out.push_str("<p>");
            for _ in 0..trng.random_range(80..120) {
                out.push_str(word(&mut trng));
                out.push(' ');
            }
            for t in links.by_ref().take(per) {
                out.push_str(&format!(
                    "<a href=\"{}\">{} {}</a> ",
                    Web::path(*t),
                    word(&mut trng),
                    WORDS[t % WORDS.len()]
                ));
            }
            out.push_str("</p>\n");
        }
        for t in links {
            out.push_str(&format!("<a href=\"{}\">{}</a>\n", Web::path(*t), word(&mut trng)));
        }
        out.push_str("</body></html>\n");
        out
    }
}

fn html(body: String) -> Response {
    Response {
        status: 200,
        content_type: Some("text/html".into()),
        charset: Some("utf-8".into()),
        location: None,
        retry_after_s: None,
        received: None,
        body: Bytes::from(body),
    }
}

/// Cuts the page at 70-95% of its length (inside a tag, as often as not) and drops the
/// closing tags: what a truncated transfer or a careless generator leaves.
fn broken(body: String, rng: &mut StdRng) -> String {
    let cut = body.len() * rng.random_range(70..95) / 100;
    let mut cut = cut.min(body.len());
    while !body.is_char_boundary(cut) {
        cut -= 1;
    }
    let mut out = body[..cut].to_string();
    out.push_str("<div><p><b>unclosed <a href=\"/p/0.html\">home");
    out
}

pub mod site;
pub mod write;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_web_is_a_pure_function_of_its_seed() {
        let a = Web::new(Spec::new(500, 7));
        let b = Web::new(Spec::new(500, 7));
        let c = Web::new(Spec::new(500, 8));
        for i in [0, 1, 77, 499] {
            assert_eq!(a.response(i).body, b.response(i).body);
        }
        assert!((0..50).any(|i| a.response(i).body != c.response(i).body));
    }

    #[test]
    fn the_web_has_the_shape_it_promises() {
        let n = 2000;
        let web = Web::new(Spec::new(n, 1));
        let mut kinds = std::collections::HashMap::new();
        let mut inlinks = vec![0usize; n];
        let mut sizes = Vec::new();
        let mut missing = 0;
        let mut links = 0;
        for (i, (url, r)) in web.responses().enumerate() {
            *kinds.entry(web.kind(i)).or_insert(0usize) += 1;
            if r.status == 200 {
                sizes.push(r.body.len());
                let parsed = perc_crawl::parse(&url, &r.body, Some("utf-8"));
                for l in &parsed.links {
                    links += 1;
                    let id: usize = l.target.path()[3..].trim_end_matches(".html").parse().unwrap();
                    if id >= n {
                        missing += 1;
                    } else {
                        inlinks[id] += 1;
                    }
                }
            }
        }
        let share = |k| kinds.get(&k).copied().unwrap_or(0) as f64 / n as f64;
        assert!((0.035..0.065).contains(&share(Kind::Duplicate)), "{kinds:?}");
        assert!((0.01..0.03).contains(&share(Kind::Redirect)), "{kinds:?}");
        assert!((0.01..0.03).contains(&share(Kind::Broken)), "{kinds:?}");
        assert!(sizes.iter().all(|s| (4 * 1024..56 * 1024).contains(s)), "5-50 KB pages");
        let missing = missing as f64 / links as f64;
        assert!((0.01..0.03).contains(&missing), "{missing}");
        // Power law: the top 1% of pages get a large share of the links; most pages few.
        let mut sorted = inlinks.clone();
        sorted.sort_unstable_by(|a, b| b.cmp(a));
        let top: usize = sorted[..n / 100].iter().sum();
        let all: usize = sorted.iter().sum();
        assert!(top * 4 > all, "top 1% get over a quarter: {top} of {all}");
        assert_eq!(inlinks.iter().enumerate().max_by_key(|(_, c)| **c).unwrap().0, 0);
        let mean = all / n;
        assert!(sorted[n / 2] * 3 < mean, "median {} against mean {mean}", sorted[n / 2]);
    }

    #[test]
    fn duplicates_copy_an_earlier_page_and_changes_change_what_they_say() {
        let web = Web::new(Spec::new(1000, 3));
        let d = (1..1000).find(|i| web.kind(*i) == Kind::Duplicate).unwrap();
        let body = web.response(d).body;
        assert!((0..d).any(|j| web.response(j).body == body));
        let p = (1..1000).find(|i| web.kind(*i) == Kind::Page).unwrap();
        let v0 = web.response(p).body;
        let url = web.url(p);
        let links = |b: &Bytes| perc_crawl::parse(&url, b, None).links;
        let title = |b: &Bytes| perc_crawl::parse(&url, b, None).title;
        let content = web.changed(p, 1, Change::Content).body;
        assert_ne!(title(&content), title(&v0));
        assert_eq!(links(&content).len(), links(&v0).len());
        let relinked = web.changed(p, 1, Change::Links).body;
        assert_eq!(title(&relinked), title(&v0));
        assert_ne!(links(&relinked), links(&v0));
        let dup = web.changed(p, 1, Change::Duplicate).body;
        assert!((0..p).any(|j| web.response(j).body == dup) || p == 0);
        let set = web.change_set(30, 9);
        assert_eq!(set.len(), 30);
        assert_eq!(set, web.change_set(30, 9));
    }
}
