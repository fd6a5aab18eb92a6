//! What a page says (spec §6.3, §6.4): its text decoded with the right charset, its title,
//! its links with their anchors, the robots meta, and the canonical and refresh hints.
//!
//! Decoding: a byte-order mark wins, then the HTTP `charset`, then a `<meta charset>` (or
//! `http-equiv` Content-Type) in the first 1024 bytes, then detection (chardetng). Malformed
//! bytes become U+FFFD; malformed HTML is parsed the way browsers do (html5ever, through
//! scraper), so neither is an error.
//!
//! Links: every `<a href>`, resolved against the page URL or its `<base href>`, fragment
//! dropped, http(s) only. One [`Link`] per distinct target other than the page itself, in the
//! order targets first appear; its anchor is the first non-empty anchor text among the links
//! to that target (textContent, whitespace runs collapsed, trimmed), or "". A target is
//! followed unless every link to it says `rel=nofollow` or the page's robots meta says
//! `nofollow`/`none`.

use std::collections::HashMap;

use encoding_rs::Encoding;
use scraper::{ElementRef, Html, Selector};
use url::Url;

use crate::urls::{link_fits, resolve};

/// One edge of the link graph, as the source page states it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Link {
    pub target: Url,
    pub anchor: String,
    /// Whether the crawler may follow it.
    pub follow: bool,
}

/// A declarative refresh (`<meta http-equiv="refresh" content="0; url=/next">`), parsed by
/// the HTML standard's shared declarative refresh steps.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Refresh {
    /// The delay's integer part, in seconds (saturating).
    pub delay_s: u64,
    /// Where to go, resolved against the page (its `<base href>`): `None` when the content
    /// names no URL (the page reloads itself) or one perc cannot fetch.
    pub target: Option<Url>,
}

impl Refresh {
    /// The target of a refresh that is a redirect (spec §6.2): delay 0 and a URL.
    pub fn redirect(&self) -> Option<&Url> {
        self.target.as_ref().filter(|_| self.delay_s == 0)
    }
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ParsedPage {
    pub title: String,
    pub links: Vec<Link>,
    /// Robots meta `noindex` or `none`.
    pub noindex: bool,
    /// Robots meta `nofollow` or `none` (then no link is followed).
    pub nofollow: bool,
    /// The first `<link rel="canonical">`, resolved like a link: the page's declared
    /// canonical, a hint for the canonical choice (spec §6.4).
    pub canonical: Option<Url>,
    /// The first `<meta http-equiv="refresh">`, when its content parses ([`Refresh`]).
    pub refresh: Option<Refresh>,
    /// Links left out for their length ([`crate::urls::link_fits`]).
    pub long_links: usize,
    /// Links to targets past the first [`LINKS_MAX`], left out.
    pub links_over_max: usize,
    /// The depth past [`crate::nesting::NESTING_MAX`] its elements reach, when they do: the
    /// page was not parsed, and says nothing else.
    pub too_deep: Option<usize>,
    /// The simhash of the body's text ([`crate::simhash`]); `None` under 3 tokens, or
    /// when not asked for ([`parse`] leaves it out, [`parse_for_index`] computes it).
    pub simhash: Option<u64>,
    /// The language of its main text ([`crate::text`]), ISO 639-3; `None` when undetermined
    /// or not asked for ([`parse`] leaves it out, [`parse_for_index`] detects it).
    pub lang: Option<&'static str>,
    /// The encoding the text was decoded with.
    pub encoding: &'static str,
}

/// blake3 of the body bytes (after transfer decoding), in hex.
pub fn content_hash(body: &[u8]) -> String {
    blake3::hash(body).to_hex().to_string()
}

/// Collapses whitespace runs to one space and trims.
pub fn collapse(text: &str) -> String {
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// The charset a `<meta>` declares in the first 1024 bytes, if any.
fn meta_charset(body: &[u8]) -> Option<&'static Encoding> {
    let head = &body[..body.len().min(1024)];
    let lower: Vec<u8> = head.iter().map(u8::to_ascii_lowercase).collect();
    let mut from = 0;
    while let Some(i) = find(&lower[from..], b"<meta") {
        let start = from + i;
        let end = find(&lower[start..], b">").map_or(lower.len(), |e| start + e);
        let tag = &lower[start..end];
        if let Some(c) = find(tag, b"charset=") {
            let value: Vec<u8> = tag[c + 8..]
                .iter()
                .copied()
                .skip_while(|b| *b == b'"' || *b == b'\'' || b.is_ascii_whitespace())
                .take_while(|b| {
                    !matches!(b, b'"' | b'\'' | b';' | b'/' | b'>') && !b.is_ascii_whitespace()
                })
                .collect();
            if let Some(enc) = Encoding::for_label(&value) {
                // A page cannot declare itself UTF-16 in ASCII; browsers read that as UTF-8.
                return Some(if enc == encoding_rs::UTF_16LE || enc == encoding_rs::UTF_16BE {
                    encoding_rs::UTF_8
                } else {
                    enc
                });
            }
        }
        from = end;
    }
    None
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

/// Decodes a body: BOM, then the HTTP charset, then `<meta charset>`, then detection.
pub fn decode(body: &[u8], http_charset: Option<&str>) -> (String, &'static Encoding) {
    let encoding = Encoding::for_bom(body)
        .map(|(e, _)| e)
        .or_else(|| {
            http_charset.and_then(|c| Encoding::for_label(c.trim().trim_matches('"').as_bytes()))
        })
        .or_else(|| meta_charset(body))
        .unwrap_or_else(|| {
            let mut detector =
                chardetng::EncodingDetector::new(chardetng::Iso2022JpDetection::Deny);
            detector.feed(body, true);
            detector.guess(None, chardetng::Utf8Detection::Allow)
        });
    // `decode` sniffs and strips a BOM itself and replaces malformed sequences.
    let (text, used, _malformed) = encoding.decode(body);
    (text.into_owned(), used)
}

/// The most distinct link targets of one page that become edges: a page of a quarter of a
/// million links (a 10 MB sitemap as HTML, a trap) would otherwise make as many rows in one
/// transaction. Link farms and index pages stay well below it.
pub const LINKS_MAX: usize = 10_000;

fn selector(s: &str) -> Selector {
    Selector::parse(s).expect("static selector")
}

fn tokens(value: &str) -> impl Iterator<Item = String> + '_ {
    value
        .split(|c: char| c == ',' || c.is_whitespace())
        .filter(|t| !t.is_empty())
        .map(str::to_ascii_lowercase)
}

/// Parses a page fetched from `url`: what it says, without its text's simhash.
pub fn parse(url: &Url, body: &[u8], http_charset: Option<&str>) -> ParsedPage {
    parse_document(url, body, http_charset).0
}

/// [`parse`], the simhash of the page's text (near-duplicates, spec §6.4a) and the language
/// of its main text: what the index needs.
pub fn parse_for_index(url: &Url, body: &[u8], http_charset: Option<&str>) -> ParsedPage {
    let (text, encoding) = decode(body, http_charset);
    let (mut page, doc) = parse_decoded(url, &text, encoding);
    if page.too_deep.is_none() {
        let body_text = crate::simhash::body_text(&doc);
        page.simhash = crate::simhash::simhash(&body_text);
        page.lang = crate::text::main_text(url, &text, || body_text).lang;
    }
    page
}

/// The main text of a page ([`crate::text::article`]), decoded as [`parse`] decodes it:
/// what a search index holds of its body. Its language is the one parse found.
pub fn main_text(url: &Url, body: &[u8], http_charset: Option<&str>) -> String {
    let (text, _) = decode(body, http_charset);
    if crate::nesting::too_deep(&text).is_some() {
        return String::new();
    }
    crate::text::article(url, &text, || crate::simhash::body_text(&Html::parse_document(&text)))
}

fn parse_document(url: &Url, body: &[u8], http_charset: Option<&str>) -> (ParsedPage, Html) {
    let (text, encoding) = decode(body, http_charset);
    parse_decoded(url, &text, encoding)
}

fn parse_decoded(url: &Url, text: &str, encoding: &'static Encoding) -> (ParsedPage, Html) {
    let mut page = ParsedPage { encoding: encoding.name(), ..ParsedPage::default() };
    if let Some(depth) = crate::nesting::too_deep(text) {
        page.too_deep = Some(depth);
        return (page, Html::new_document());
    }
    let doc = Html::parse_document(text);

    page.title = doc
        .select(&selector("title"))
        .next()
        .map(|t| collapse(&t.text().collect::<String>()))
        .unwrap_or_default();

    for meta in doc.select(&selector("meta[name]")) {
        let name = meta.value().attr("name").unwrap_or_default();
        if !name.eq_ignore_ascii_case("robots") {
            continue;
        }
        for t in tokens(meta.value().attr("content").unwrap_or_default()) {
            match t.as_str() {
                "noindex" => page.noindex = true,
                "nofollow" => page.nofollow = true,
                "none" => {
                    page.noindex = true;
                    page.nofollow = true;
                }
                _ => {}
            }
        }
    }

    let base = doc
        .select(&selector("base[href]"))
        .next()
        .and_then(|b| b.value().attr("href"))
        .and_then(|h| url.join(h.trim()).ok())
        .filter(|u| matches!(u.scheme(), "http" | "https"))
        .unwrap_or_else(|| url.clone());

    page.canonical = doc
        .select(&selector("link[rel][href]"))
        .find(|l| tokens(l.value().attr("rel").unwrap_or_default()).any(|t| t == "canonical"))
        .and_then(|l| resolve(&base, l.value().attr("href").unwrap_or_default()));

    page.refresh = doc
        .select(&selector("meta[http-equiv]"))
        .find(|m| m.value().attr("http-equiv").is_some_and(|h| h.eq_ignore_ascii_case("refresh")))
        .and_then(|m| parse_refresh(&base, m.value().attr("content").unwrap_or_default()));

    let mut index: HashMap<Url, usize> = HashMap::new();
    for a in doc.select(&selector("a[href]")) {
        let Some(target) = resolve(&base, a.value().attr("href").unwrap_or_default()) else {
            continue;
        };
        if target == *url {
            continue; // not an edge: source and target are the same page
        }
        if !link_fits(url, &target) {
            page.long_links += 1;
            continue;
        }
        let anchor = anchor_text(&a);
        let follow = !page.nofollow
            && !tokens(a.value().attr("rel").unwrap_or_default()).any(|t| t == "nofollow");
        match index.get(&target) {
            Some(&i) => {
                let link = &mut page.links[i];
                if link.anchor.is_empty() {
                    link.anchor = anchor;
                }
                link.follow |= follow;
            }
            None if page.links.len() >= LINKS_MAX => page.links_over_max += 1,
            None => {
                index.insert(target.clone(), page.links.len());
                page.links.push(Link { target, anchor, follow });
            }
        }
    }
    (page, doc)
}

fn anchor_text(a: &ElementRef<'_>) -> String {
    collapse(&a.text().collect::<String>())
}

/// Parses a refresh's content by the HTML standard's "shared declarative refresh steps":
/// `None` when it does not parse (then there is no refresh at all).
///
/// A delay (digits, then any digits and dots), then optionally `;` or `,` and whitespace,
/// then optionally `url` (any case) and `=`, then the URL, optionally quoted (a quoted URL
/// ends at its closing quote).
pub fn parse_refresh(base: &Url, content: &str) -> Option<Refresh> {
    let ws = |c: char| matches!(c, '\t' | '\n' | '\x0C' | '\r' | ' ');
    let rest = content.trim_start_matches(ws);
    let digits = rest.len() - rest.trim_start_matches(|c: char| c.is_ascii_digit()).len();
    if digits == 0 && !rest.starts_with('.') {
        return None;
    }
    let delay_s = rest[..digits]
        .bytes()
        .fold(0u64, |n, d| n.saturating_mul(10).saturating_add(u64::from(d - b'0')));
    let rest = rest.trim_start_matches(|c: char| c.is_ascii_digit() || c == '.');
    if rest.is_empty() {
        return Some(Refresh { delay_s, target: None });
    }
    if !rest.starts_with([';', ',']) && !rest.starts_with(ws) {
        return None;
    }
    let rest = rest.trim_start_matches(ws);
    let rest = rest.strip_prefix([';', ',']).unwrap_or(rest).trim_start_matches(ws);
    if rest.is_empty() {
        return Some(Refresh { delay_s, target: None });
    }
    // "url" and "=" are optional: without both, the whole rest is the URL.
    let unprefixed = (|| {
        let (key, after) = rest.split_at_checked(3)?;
        if !key.eq_ignore_ascii_case("url") {
            return None;
        }
        after.trim_start_matches(ws).strip_prefix('=').map(|v| v.trim_start_matches(ws))
    })();
    let mut value = unprefixed.unwrap_or(rest);
    if unprefixed.is_some() || rest.starts_with(['"', '\'']) {
        if let Some(quote) = value.chars().next().filter(|c| *c == '"' || *c == '\'') {
            value = &value[1..];
            if let Some(end) = value.find(quote) {
                value = &value[..end];
            }
        }
    }
    let target = if value.trim().is_empty() { None } else { resolve(base, value) };
    Some(Refresh { delay_s, target })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn url(s: &str) -> Url {
        Url::parse(s).unwrap()
    }

    #[test]
    fn links_anchors_and_dedup() {
        let html = br#"<html><head><title>  The
            Title </title></head><body>
            <a href="/b">   </a>
            <a href="/b#x"> Bee
               page</a>
            <a href="c.html" rel="nofollow">see</a>
            <a href="c.html">again</a>
            <a href="/self">me</a>
            <a href="mailto:x@y.z">mail</a>
            <a href="http://other.test/">out</a>
            <a>no href</a>
        </body></html>"#;
        let p = parse(&url("http://h.test/self"), html, Some("utf-8"));
        assert_eq!(p.title, "The Title");
        let got: Vec<(&str, &str, bool)> =
            p.links.iter().map(|l| (l.target.as_str(), l.anchor.as_str(), l.follow)).collect();
        assert_eq!(
            got,
            vec![
                ("http://h.test/b", "Bee page", true),
                ("http://h.test/c.html", "see", true),
                ("http://other.test/", "out", true),
            ]
        );
    }

    #[test]
    fn a_page_keeps_its_first_links_up_to_the_most_and_counts_the_rest() {
        let mut html = String::from("<a href=\"/l0\"></a>");
        for i in 0..LINKS_MAX + 5 {
            html.push_str(&format!("<a href=\"/l{i}\">x</a>"));
        }
        // A link to a kept target still gives it its anchor.
        html.push_str("<a href=\"/l0\">first</a>");
        let p = parse(&url("http://h.test/"), html.as_bytes(), Some("utf-8"));
        assert_eq!((p.links.len(), p.links_over_max), (LINKS_MAX, 5));
        assert_eq!(p.links[0].anchor, "x");
        assert_eq!(
            p.links[LINKS_MAX - 1].target.as_str(),
            format!("http://h.test/l{}", LINKS_MAX - 1)
        );
    }

    #[test]
    fn base_href_robots_canonical_refresh() {
        let html = br#"<html><head>
            <base href="http://h.test/deep/dir/">
            <meta name="ROBOTS" content="NoIndex, nofollow">
            <link rel="Canonical" href="/canon">
            <meta http-equiv="Refresh" content="3; URL='next.html'">
            </head><body><a href="rel.html" rel="nofollow">r</a><a href="x">x</a></body></html>"#;
        let p = parse(&url("http://h.test/page"), html, None);
        assert!(p.noindex && p.nofollow);
        assert_eq!(p.canonical.unwrap().as_str(), "http://h.test/canon");
        let refresh = p.refresh.unwrap();
        assert_eq!(refresh.delay_s, 3);
        assert_eq!(refresh.target.unwrap().as_str(), "http://h.test/deep/dir/next.html");
        assert_eq!(p.links[0].target.as_str(), "http://h.test/deep/dir/rel.html");
        assert!(p.links.iter().all(|l| !l.follow), "meta nofollow: nothing is followed");
        let none = parse(
            &url("http://h.test/"),
            br#"<meta name="robots" content="none"><a href="/a">a</a>"#,
            None,
        );
        assert!(none.noindex && none.nofollow && !none.links[0].follow);
    }

    #[test]
    fn refresh_content_by_the_html_standard() {
        let base = url("http://h.test/dir/page");
        // content → (delay, target), or None when it does not parse.
        type Parsed = Option<(u64, Option<&'static str>)>;
        let cases: &[(&str, Parsed)] = &[
            ("0; url=/next", Some((0, Some("http://h.test/next")))),
            ("0;URL='a b.html'x", Some((0, Some("http://h.test/dir/a%20b.html")))),
            ("0, url = \"q.html\"", Some((0, Some("http://h.test/dir/q.html")))),
            ("  0.5  next.html", Some((0, Some("http://h.test/dir/next.html")))),
            ("0 'quoted.html' rest", Some((0, Some("http://h.test/dir/quoted.html")))),
            ("0; urlish.html", Some((0, Some("http://h.test/dir/urlish.html")))),
            ("0; url", Some((0, Some("http://h.test/dir/url")))),
            (".5; url=/x", Some((0, Some("http://h.test/x")))),
            ("5; url=/later", Some((5, Some("http://h.test/later")))),
            ("99999999999999999999999;/x", Some((u64::MAX, Some("http://h.test/x")))),
            ("0", Some((0, None))),
            ("0;  ", Some((0, None))),
            ("3; url=mailto:x@y.z", Some((3, None))),
            ("x; url=/x", None),
            ("", None),
            ("0x; url=/x", None),
            ("-1; url=/x", None),
        ];
        for (content, want) in cases {
            let got = parse_refresh(&base, content);
            let got = got.as_ref().map(|r| (r.delay_s, r.target.as_ref().map(Url::as_str)));
            assert_eq!(got, *want, "content {content:?}");
        }
        let redirect = |c| parse_refresh(&base, c).and_then(|r| r.redirect().cloned());
        assert!(redirect("0;url=/n").is_some());
        assert!(redirect("1;url=/n").is_none() && redirect("0").is_none());
        // Only the first refresh counts, parsed or not.
        let p = parse(
            &base,
            br#"<meta http-equiv=refresh content="junk"><meta http-equiv=refresh content="0;url=/n">"#,
            None,
        );
        assert_eq!(p.refresh, None);
    }

    #[test]
    fn charsets_bom_http_meta_detection() {
        // "café" in Latin-1, declared by a meta tag.
        let mut latin1 = b"<html><head><meta charset=\"iso-8859-1\"><title>caf".to_vec();
        latin1.extend_from_slice(&[0xE9]);
        latin1.extend_from_slice(b"</title></head></html>");
        assert_eq!(parse(&url("http://h.test/"), &latin1, None).title, "café");
        // The HTTP charset wins over the meta tag.
        let p = parse(&url("http://h.test/"), &latin1, Some("windows-1251"));
        assert_eq!(p.encoding, "windows-1251");
        // A BOM wins over both.
        let mut bom = vec![0xEF, 0xBB, 0xBF];
        bom.extend_from_slice("<title>naïve</title>".as_bytes());
        assert_eq!(parse(&url("http://h.test/"), &bom, Some("iso-8859-1")).title, "naïve");
        // A mislabelled page (says UTF-8, is not): replacement characters, no error.
        let p = parse(&url("http://h.test/"), &latin1, Some("utf-8"));
        assert_eq!(p.title, "caf\u{FFFD}");
        // No label at all: detection.
        let shift_jis = encoding_rs::SHIFT_JIS
            .encode("<title>日本語のページ</title><p>これは日本語で書かれた文章です。</p>")
            .0;
        assert_eq!(parse(&url("http://h.test/"), &shift_jis, None).title, "日本語のページ");
    }

    #[test]
    fn broken_html_still_parses() {
        let p = parse(
            &url("http://h.test/"),
            b"<title>Broken</title><body><a href=/x>x<a href=/y>y</div></span><p><b>unclosed",
            None,
        );
        assert_eq!(p.title, "Broken");
        assert_eq!(p.links.len(), 2);
        assert_eq!(
            parse(&url("http://h.test/"), b"", None),
            ParsedPage { encoding: p.encoding, ..ParsedPage::default() }
        );
    }

    #[test]
    fn content_hash_is_blake3_hex() {
        assert_eq!(
            content_hash(b""),
            "af1349b9f5f9a1a6a0404dea36dcc9499bcb25c9adc112b7cc9a93cae41f3262"
        );
    }
}
