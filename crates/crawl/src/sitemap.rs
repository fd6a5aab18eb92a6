//! Sitemaps (spec §6.1, sitemaps.org): the `<urlset>` and `<sitemapindex>` files that
//! robots.txt `Sitemap:` lines name, plain or gzip, read with quick-xml.
//!
//! A file is read up to [`FILE_BYTES_MAX`] bytes (after gunzip: a gzip bomb is cut off,
//! not inflated) and [`FILE_URLS_MAX`] entries, as sitemaps.org sets them (a relative `<loc>`,
//! which it does not allow, is read against the file's URL); what is past a cap
//! is left out with a warning. An index names sitemaps, read one level deep (an index in an
//! index is left out, with a warning), at most [`FILES_MAX`] files a crawl. A file that does
//! not parse, or is not a sitemap, or cannot be fetched, is a warning naming it, never a
//! failed crawl: its URLs read before the problem are kept.

use std::io::Read;

use quick_xml::events::Event;
use url::Url;

use crate::source::{Fetched, Source};

/// The most bytes of one sitemap file, uncompressed (sitemaps.org: 50 MiB).
pub const FILE_BYTES_MAX: u64 = 50 * 1024 * 1024;
/// The most URLs (or sitemaps, in an index) of one file (sitemaps.org: 50,000).
pub const FILE_URLS_MAX: usize = 50_000;
/// The most sitemap files one crawl reads.
pub const FILES_MAX: usize = 1_000;

/// What one sitemap file lists.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Listed {
    /// Page URLs (`<urlset>`).
    pub urls: Vec<String>,
    /// Sitemap URLs (`<sitemapindex>`).
    pub sitemaps: Vec<String>,
    /// What was left out, and why.
    pub warnings: Vec<String>,
}

/// Reads a sitemap file's body (gzip when it starts with gzip's magic bytes).
pub fn read(body: &[u8]) -> Listed {
    let mut listed = Listed::default();
    let mut text = Vec::new();
    let raw: Box<dyn Read + '_> = if body.starts_with(&[0x1f, 0x8b]) {
        Box::new(flate2::read::MultiGzDecoder::new(body))
    } else {
        Box::new(body)
    };
    match raw.take(FILE_BYTES_MAX + 1).read_to_end(&mut text) {
        Ok(_) if text.len() as u64 > FILE_BYTES_MAX => {
            text.truncate(FILE_BYTES_MAX as usize);
            listed.warnings.push(format!("larger than {FILE_BYTES_MAX} bytes: read up to there"));
        }
        Ok(_) => {}
        Err(e) => listed.warnings.push(format!("gzip: {e}: read up to there")),
    }
    parse_xml(&text, &mut listed);
    listed
}

fn parse_xml(text: &[u8], listed: &mut Listed) {
    let mut reader = quick_xml::Reader::from_reader(text);
    let mut buf = Vec::new();
    // The element path's local names, the root first; the text of the current <loc>.
    let mut path: Vec<Vec<u8>> = Vec::new();
    let mut loc: Option<String> = None;
    let mut root: Option<Vec<u8>> = None;
    loop {
        let event = match reader.read_event_into(&mut buf) {
            Ok(e) => e,
            Err(e) => {
                let at = reader.error_position();
                listed.warnings.push(format!("not well-formed XML at byte {at}: {e}"));
                break;
            }
        };
        match event {
            Event::Start(e) => {
                let name = e.local_name().as_ref().to_vec();
                if path.is_empty() {
                    root = Some(name.clone());
                }
                if name == b"loc" {
                    loc = Some(String::new());
                }
                path.push(name);
            }
            Event::End(_) => {
                let name = path.pop().unwrap_or_default();
                if name == b"loc" {
                    let value = loc.take().unwrap_or_default().trim().to_string();
                    let parent = path.last().map(Vec::as_slice);
                    let list = match (root.as_deref(), parent) {
                        (Some(b"urlset"), Some(b"url")) => &mut listed.urls,
                        (Some(b"sitemapindex"), Some(b"sitemap")) => &mut listed.sitemaps,
                        _ => continue,
                    };
                    if list.len() == FILE_URLS_MAX {
                        listed
                            .warnings
                            .push(format!("more than {FILE_URLS_MAX} entries: the rest left out"));
                        break;
                    }
                    if !value.is_empty() {
                        list.push(value);
                    }
                }
            }
            Event::Text(t) => {
                if let (Some(l), Ok(s)) = (loc.as_mut(), t.decode()) {
                    l.push_str(&s);
                }
            }
            Event::CData(t) => {
                if let (Some(l), Ok(s)) = (loc.as_mut(), t.decode()) {
                    l.push_str(&s);
                }
            }
            Event::GeneralRef(r) => {
                if let Some(l) = loc.as_mut() {
                    if let Ok(Some(c)) = r.resolve_char_ref() {
                        l.push(c);
                    } else if let Some(s) = r
                        .decode()
                        .ok()
                        .and_then(|n| quick_xml::escape::resolve_predefined_entity(&n))
                    {
                        l.push_str(s);
                    }
                }
            }
            Event::Eof => {
                if let Some(open) = path.last() {
                    let at = reader.buffer_position();
                    let open = String::from_utf8_lossy(open);
                    listed.warnings.push(format!(
                        "not well-formed XML at byte {at}: the file ends inside <{open}>"
                    ));
                }
                break;
            }
            _ => {}
        }
        buf.clear();
    }
    if !matches!(root.as_deref(), Some(b"urlset" | b"sitemapindex")) {
        let root = root.map(|r| String::from_utf8_lossy(&r).into_owned());
        listed.warnings.push(match root {
            Some(r) => format!("not a sitemap: its root element is <{r}>"),
            None => "not a sitemap: no XML element".to_string(),
        });
    }
}

/// The page URLs the sitemaps named by `roots` list that `wanted` keeps (an index's sitemaps
/// read in turn), in the order found, each once, at most `urls_max` of them (no file is
/// read once they are found: an index of a hundred files of 50,000 URLs each is no reason
/// to hold five million), and a warning naming each file that had a problem. Fetched
/// through `source` (politeness, robots.txt and any recording apply).
pub async fn collect(
    source: &dyn Source,
    roots: &[Url],
    wanted: &(dyn Fn(&Url) -> bool + Sync),
    urls_max: usize,
) -> (Vec<Url>, Vec<String>) {
    let mut urls: Vec<Url> = Vec::new();
    let mut seen_urls = std::collections::HashSet::new();
    let mut warnings = Vec::new();
    // (sitemap, whether an index named it)
    let mut queue: std::collections::VecDeque<(Url, bool)> =
        roots.iter().map(|u| (u.clone(), false)).collect();
    let mut fetched: std::collections::HashSet<Url> = std::collections::HashSet::new();
    while let Some((at, from_index)) = queue.pop_front() {
        if urls.len() >= urls_max {
            warnings.push(format!(
                "sitemaps: {urls_max} URLs found (crawl.sitemap_urls_max): {} more sitemap \
                 file(s) left unread",
                queue.len() + 1
            ));
            break;
        }
        if !fetched.insert(at.clone()) {
            continue;
        }
        if fetched.len() > FILES_MAX {
            warnings.push(format!("sitemap {at}: more than {FILES_MAX} sitemap files: left out"));
            break;
        }
        let body = match source.get_sitemap(&at).await {
            Fetched::Response(r) if (200..300).contains(&r.status) => r.body,
            Fetched::Response(r) => {
                warnings.push(format!("sitemap {at}: HTTP {}", r.status));
                continue;
            }
            Fetched::Failed(why) | Fetched::Unavailable(why) => {
                warnings.push(format!("sitemap {at}: {why}"));
                continue;
            }
            Fetched::Disallowed => {
                warnings.push(format!("sitemap {at}: disallowed by robots.txt"));
                continue;
            }
        };
        let listed = read(&body);
        for w in &listed.warnings {
            warnings.push(format!("sitemap {at}: {w}"));
        }
        // sitemaps.org wants absolute URLs; a relative one is read against the file, as
        // browsers read links.
        let resolve = |u: &str| {
            at.join(u.trim())
                .map_err(|e| e.to_string())
                .and_then(|u| crate::urls::normalize(u.as_str()))
        };
        for s in &listed.sitemaps {
            match resolve(s) {
                Ok(_) if from_index => {
                    warnings.push(format!("sitemap {at}: an index in an index ({s}): left out"))
                }
                Ok(u) => queue.push_back((u, true)),
                Err(e) => warnings.push(format!("sitemap {at}: {e}")),
            }
        }
        let mut bad = 0;
        for u in &listed.urls {
            match resolve(u) {
                Ok(u) if urls.len() < urls_max && wanted(&u) && !seen_urls.contains(&u) => {
                    seen_urls.insert(u.clone());
                    urls.push(u);
                }
                Ok(_) => {}
                Err(_) => bad += 1,
            }
        }
        if bad > 0 {
            warnings.push(format!("sitemap {at}: {bad} entries are not http(s) URLs: left out"));
        }
    }
    (urls, warnings)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    #[test]
    fn urlsets_and_indexes_plain_and_gzip() {
        let urlset = br#"<?xml version="1.0" encoding="UTF-8"?>
            <urlset xmlns="http://www.sitemaps.org/schemas/sitemap/0.9">
              <url><loc> http://h.test/a?x=1&amp;y=2 </loc><lastmod>2026-01-01</lastmod></url>
              <url><loc><![CDATA[http://h.test/b]]></loc></url>
              <url><loc>http://h.test/&#99;</loc></url>
              <image><loc>http://h.test/not-a-page.png</loc></image>
            </urlset>"#;
        let got = read(urlset);
        assert_eq!(got.urls, ["http://h.test/a?x=1&y=2", "http://h.test/b", "http://h.test/c"]);
        assert!(got.sitemaps.is_empty() && got.warnings.is_empty(), "{got:?}");
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
        gz.write_all(urlset).unwrap();
        assert_eq!(read(&gz.finish().unwrap()).urls, got.urls);
        let index = br#"<sitemapindex xmlns="http://www.sitemaps.org/schemas/sitemap/0.9">
            <sitemap><loc>http://h.test/s1.xml.gz</loc></sitemap></sitemapindex>"#;
        assert_eq!(read(index).sitemaps, ["http://h.test/s1.xml.gz"]);
    }

    #[test]
    fn bad_files_are_warnings_that_keep_what_was_read() {
        let broken = read(b"<urlset><url><loc>http://h.test/a</loc></url><url><loc>x</oops>");
        assert_eq!(broken.urls, ["http://h.test/a"]);
        assert!(broken.warnings[0].starts_with("not well-formed XML at byte"), "{broken:?}");
        let cut = read(b"<urlset><url><loc>http://h.test/a</loc></url><url><loc>http://h.te");
        assert_eq!(cut.urls, ["http://h.test/a"]);
        assert_eq!(cut.warnings, ["not well-formed XML at byte 66: the file ends inside <loc>"]);
        let html = read(b"<html><body>Not found</body></html>");
        assert_eq!(html.warnings, ["not a sitemap: its root element is <html>"]);
        assert_eq!(read(b"").warnings, ["not a sitemap: no XML element"]);
        // Over the entry cap: the first 50,000 kept.
        let mut big = String::from("<urlset>");
        for i in 0..FILE_URLS_MAX + 5 {
            big.push_str(&format!("<url><loc>http://h.test/{i}</loc></url>"));
        }
        big.push_str("</urlset>");
        let capped = read(big.as_bytes());
        assert_eq!(capped.urls.len(), FILE_URLS_MAX);
        assert_eq!(
            capped.warnings,
            [format!("more than {FILE_URLS_MAX} entries: the rest left out")]
        );
        // A gzip bomb: cut off at the byte cap, not inflated.
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
        gz.write_all(b"<urlset>").unwrap();
        let zeros = vec![b' '; 1 << 20];
        for _ in 0..=(FILE_BYTES_MAX >> 20) {
            gz.write_all(&zeros).unwrap();
        }
        let bomb = read(&gz.finish().unwrap());
        assert!(bomb.warnings[0].starts_with("larger than"), "{:?}", bomb.warnings);
    }
}
