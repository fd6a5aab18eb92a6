//! A semantic diff of two exports (spec §7: JSON Lines sorted by URL): the pages added and
//! removed, every field that changed on a page in both, and the inlinks each page gained and
//! lost. Both sides stream in step (a merge by URL), so memory holds the differences, not the
//! exports. `perc diff` and `perc replay --expect` print it as text, JSON, a JUnit report or
//! an HTML page ([`html`]).

mod html;

use std::cmp::Ordering;
use std::fmt::Write as _;
use std::io::BufRead;

use perc_observers::model::Inlink;

pub use html::{INLINKS_SHOWN, PAGES_SHOWN};
use serde::Serialize;
use serde_json::{Map, Value};

/// An export that cannot be compared: a line that is not an export line, lines out of order,
/// or a file that cannot be read. Named by file and line.
#[derive(Debug, thiserror::Error)]
pub enum DiffError {
    #[error("{file} line {line}: {problem}")]
    Bad { file: String, line: usize, problem: String },
    #[error("cannot read {file}: {source}")]
    Io { file: String, source: std::io::Error },
}

/// What changed from `old` to `new`.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct ExportDiff {
    pub old_pages: usize,
    pub new_pages: usize,
    /// URLs in `new` only, in order.
    pub added: Vec<String>,
    /// URLs in `old` only, in order.
    pub removed: Vec<String>,
    /// Pages in both that differ, in URL order.
    pub changed: Vec<PageDiff>,
}

#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct PageDiff {
    pub url: String,
    /// Each field (other than the inlinks) whose value differs, in name order;
    /// a field one side lacks is `null` there.
    pub fields: Vec<FieldChange>,
    pub inlinks_added: Vec<Inlink>,
    pub inlinks_removed: Vec<Inlink>,
}

#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct FieldChange {
    pub field: String,
    pub old: Value,
    pub new: Value,
}

impl PageDiff {
    /// Each changed field old → new, then the inlinks gained (+) and lost (-), at most
    /// `limit` of those.
    fn write_changes(&self, s: &mut String, limit: usize) {
        let width = self.fields.iter().map(|f| f.field.len()).max().unwrap_or(0).max(7) + 1;
        for f in &self.fields {
            let label = format!("{}:", f.field);
            let _ = writeln!(s, "    {label:width$}  {} → {}", show(&f.old), show(&f.new));
        }
        let moves = self
            .inlinks_added
            .iter()
            .map(|l| ('+', l))
            .chain(self.inlinks_removed.iter().map(|l| ('-', l)));
        for (i, (sign, l)) in moves.take(limit).enumerate() {
            let label = if i == 0 { "inlinks:" } else { "" };
            let anchor = show(&Value::String(l.anchor.clone()));
            let _ =
                writeln!(s, "    {label:width$}  {sign} from {} (to {}) {anchor}", l.from, l.to);
        }
        let total = self.inlinks_added.len() + self.inlinks_removed.len();
        if total > limit {
            let _ = writeln!(s, "    … and {} more inlink changes", total - limit);
        }
    }
}

impl ExportDiff {
    pub fn is_empty(&self) -> bool {
        self.added.is_empty() && self.removed.is_empty() && self.changed.is_empty()
    }
}

/// One side of a diff: its name (for messages) and its lines.
pub struct Side<I> {
    pub name: String,
    pub lines: I,
}

/// The longest line an export file may have. A page's line holds its cluster's inlinks, so
/// it can be long; a line past this is not an export's, and reading it whole could take
/// any amount of memory.
pub const LINE_BYTES_MAX: u64 = 256 * 1024 * 1024;

impl Side<BoundedLines> {
    /// A file, or standard input for `-`. A directory is refused by name; a UTF-8 byte
    /// order mark at its start is read past (editors on some systems write one).
    pub fn file(path: &std::path::Path) -> Result<Self, DiffError> {
        let name = path.display().to_string();
        let reader: Box<dyn BufRead> = if name == "-" {
            Box::new(std::io::BufReader::new(std::io::stdin()))
        } else {
            if path.is_dir() {
                let source = std::io::Error::other("it is a directory, not an export file");
                return Err(DiffError::Io { file: name, source });
            }
            let f = std::fs::File::open(path)
                .map_err(|source| DiffError::Io { file: name.clone(), source })?;
            Box::new(std::io::BufReader::new(f))
        };
        Ok(Side { name, lines: BoundedLines::new(reader, LINE_BYTES_MAX) })
    }
}

/// The lines of a reader, each at most `max` bytes (a longer one is an error, read no
/// further), a leading byte order mark left out.
pub struct BoundedLines {
    reader: Box<dyn BufRead>,
    max: u64,
    first: bool,
}

impl BoundedLines {
    pub fn new(reader: Box<dyn BufRead>, max: u64) -> BoundedLines {
        BoundedLines { reader, max, first: true }
    }
}

impl Iterator for BoundedLines {
    type Item = std::io::Result<String>;

    fn next(&mut self) -> Option<Self::Item> {
        use std::io::Read as _;
        let mut buf = Vec::new();
        let read = self.reader.by_ref().take(self.max + 1).read_until(b'\n', &mut buf);
        match read {
            Ok(0) => return None,
            Ok(_) => {}
            Err(e) => return Some(Err(e)),
        }
        if buf.len() as u64 > self.max {
            let e = format!("a line longer than {} bytes: not an export", self.max);
            return Some(Err(std::io::Error::new(std::io::ErrorKind::InvalidData, e)));
        }
        if std::mem::take(&mut self.first) && buf.starts_with(b"\xEF\xBB\xBF") {
            buf.drain(..3);
        }
        if buf.last() == Some(&b'\n') {
            buf.pop();
            if buf.last() == Some(&b'\r') {
                buf.pop();
            }
        }
        Some(String::from_utf8(buf).map_err(|_| {
            std::io::Error::new(std::io::ErrorKind::InvalidData, "a line that is not UTF-8")
        }))
    }
}

/// One export line, taken apart.
struct Line {
    url: String,
    fields: Map<String, Value>,
    inlinks: Vec<Inlink>,
}

/// Reads one side's lines in order, checking each and that URLs strictly increase.
struct Reader<I> {
    name: String,
    lines: I,
    at: usize,
    last: Option<String>,
    pages: usize,
}

impl<S: AsRef<str>, I: Iterator<Item = std::io::Result<S>>> Reader<I> {
    fn next(&mut self) -> Result<Option<Line>, DiffError> {
        loop {
            let Some(text) = self.lines.next() else { return Ok(None) };
            self.at += 1;
            let text = text.map_err(|source| DiffError::Io { file: self.name.clone(), source })?;
            let text = text.as_ref();
            if text.trim().is_empty() {
                continue;
            }
            let line = self.parse(text)?;
            if let Some(last) = &self.last {
                if line.url.as_str() <= last.as_str() {
                    return Err(self.bad(format!(
                        "{} comes after {last}: an export is sorted by URL, each URL once \
                         (perc export writes it so)",
                        line.url
                    )));
                }
            }
            self.last = Some(line.url.clone());
            self.pages += 1;
            return Ok(Some(line));
        }
    }

    fn parse(&self, text: &str) -> Result<Line, DiffError> {
        let value: Value = serde_json::from_str(text)
            .map_err(|e| self.bad(format!("not a JSON export line: {e}")))?;
        let Value::Object(mut fields) = value else {
            return Err(self.bad("not a JSON object: an export line is one page's object".into()));
        };
        let url = match fields.remove("url") {
            Some(Value::String(u)) => u,
            _ => return Err(self.bad("no \"url\" string: not an export line".into())),
        };
        let inlinks = match fields.remove("inlinks") {
            None | Some(Value::Null) => Vec::new(),
            Some(v) => serde_json::from_value(v)
                .map_err(|e| self.bad(format!("\"inlinks\" is not a list of inlinks: {e}")))?,
        };
        Ok(Line { url, fields, inlinks })
    }

    fn bad(&self, problem: String) -> DiffError {
        DiffError::Bad { file: self.name.clone(), line: self.at, problem }
    }
}

/// Compares two exports line by line in URL order. Lines may be owned (read from a file) or
/// borrowed (an export in memory).
pub fn diff<A, B, SA, SB>(old: Side<A>, new: Side<B>) -> Result<ExportDiff, DiffError>
where
    SA: AsRef<str>,
    SB: AsRef<str>,
    A: Iterator<Item = std::io::Result<SA>>,
    B: Iterator<Item = std::io::Result<SB>>,
{
    let mut a = Reader { name: old.name, lines: old.lines, at: 0, last: None, pages: 0 };
    let mut b = Reader { name: new.name, lines: new.lines, at: 0, last: None, pages: 0 };
    let mut out = ExportDiff::default();
    let (mut x, mut y) = (a.next()?, b.next()?);
    loop {
        match (x.take(), y.take()) {
            (None, None) => break,
            (Some(o), None) => {
                out.removed.push(o.url);
                x = a.next()?;
            }
            (None, Some(n)) => {
                out.added.push(n.url);
                y = b.next()?;
            }
            (Some(o), Some(n)) => match o.url.cmp(&n.url) {
                Ordering::Less => {
                    out.removed.push(o.url);
                    (x, y) = (a.next()?, Some(n));
                }
                Ordering::Greater => {
                    out.added.push(n.url);
                    (x, y) = (Some(o), b.next()?);
                }
                Ordering::Equal => {
                    if let Some(d) = compare(o, n) {
                        out.changed.push(d);
                    }
                    (x, y) = (a.next()?, b.next()?);
                }
            },
        }
    }
    out.old_pages = a.pages;
    out.new_pages = b.pages;
    Ok(out)
}

/// Whether two values of field `field` are the same: equal, or for `pagerank` within the
/// bound the ranks are kept in (spec §6.4b: max(0.001, 0.001 · the larger), plus the six
/// decimals they are written with), so that exports do not differ by the order updates came
/// in.
fn same(field: &str, old: &Value, new: &Value) -> bool {
    if old == new {
        return true;
    }
    match (field, old.as_f64(), new.as_f64()) {
        ("pagerank", Some(a), Some(b)) => {
            use perc_observers::rank::{bound, ROUNDING};
            (a - b).abs() <= bound(a.abs().max(b.abs())) + ROUNDING
        }
        _ => false,
    }
}

/// The differences of one page present on both sides, if any.
fn compare(old: Line, mut new: Line) -> Option<PageDiff> {
    let mut fields = Vec::new();
    for (k, v) in old.fields {
        let n = new.fields.remove(&k).unwrap_or(Value::Null);
        if !same(&k, &v, &n) {
            fields.push(FieldChange { field: k, old: v, new: n });
        }
    }
    for (k, n) in new.fields {
        fields.push(FieldChange { field: k, old: Value::Null, new: n });
    }
    let (mut was, mut now) = (old.inlinks, new.inlinks);
    was.sort();
    now.sort();
    let inlinks_removed: Vec<Inlink> =
        was.iter().filter(|l| now.binary_search(l).is_err()).cloned().collect();
    let inlinks_added: Vec<Inlink> =
        now.iter().filter(|l| was.binary_search(l).is_err()).cloned().collect();
    if fields.is_empty() && inlinks_added.is_empty() && inlinks_removed.is_empty() {
        return None;
    }
    Some(PageDiff { url: old.url, fields, inlinks_added, inlinks_removed })
}

/// How the text report names the two sides: "expected" and "got" for a golden check.
pub struct Names<'a> {
    pub old: &'a str,
    pub new: &'a str,
}

impl ExportDiff {
    /// The diff as a reviewer reads it: a summary line, then the changed pages with each
    /// field old → new and their inlinks ±, then the added and removed URLs; at most `limit`
    /// of each kind (and of each page's inlink changes), with a count of the rest.
    pub fn text(&self, names: &Names, limit: usize) -> String {
        let mut s = String::new();
        if self.is_empty() {
            let _ = writeln!(
                s,
                "{} and {} are the same: {} pages",
                names.old, names.new, self.new_pages
            );
            return s;
        }
        let _ = writeln!(
            s,
            "{} → {}: {} changed, {} added, {} removed ({} pages → {})",
            names.old,
            names.new,
            count(self.changed.len(), "page"),
            self.added.len(),
            self.removed.len(),
            self.old_pages,
            self.new_pages
        );
        if !self.changed.is_empty() {
            let _ = writeln!(s, "\nchanged ({}):", self.changed.len());
            for p in self.changed.iter().take(limit) {
                let _ = writeln!(s, "  {}", p.url);
                p.write_changes(&mut s, limit);
            }
            more(&mut s, self.changed.len(), limit, "changed pages");
        }
        for (title, sign, urls) in [("added", '+', &self.added), ("removed", '-', &self.removed)] {
            if urls.is_empty() {
                continue;
            }
            let _ = writeln!(s, "\n{title} ({}):", urls.len());
            for u in urls.iter().take(limit) {
                let _ = writeln!(s, "  {sign} {u}");
            }
            more(&mut s, urls.len(), limit, &format!("{title} pages"));
        }
        s
    }

    /// A JUnit XML report: one failing test case per page that differs, and one passing case
    /// for the pages that do not; CI systems show it as a test run.
    pub fn junit(&self, suite: &str, names: &Names) -> String {
        let esc = |t: &str| quick_xml::escape::escape(t).into_owned();
        let failing = self.changed.len() + self.added.len() + self.removed.len();
        let same = self.new_pages - self.changed.len() - self.added.len();
        let mut s = String::from("<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n");
        let _ = writeln!(
            s,
            "<testsuite name=\"{}\" tests=\"{}\" failures=\"{failing}\" errors=\"0\">",
            esc(suite),
            failing + 1
        );
        let mut case = |name: &str, message: &str, detail: &str| {
            let _ = writeln!(
                s,
                "  <testcase classname=\"perc.export\" name=\"{}\">\n    <failure message=\"{}\">{}</failure>\n  </testcase>",
                esc(name),
                esc(message),
                esc(detail)
            );
        };
        for p in &self.changed {
            let mut detail = String::new();
            p.write_changes(&mut detail, usize::MAX);
            let mut what: Vec<&str> = p.fields.iter().map(|f| f.field.as_str()).collect();
            if !p.inlinks_added.is_empty() || !p.inlinks_removed.is_empty() {
                what.push("inlinks");
            }
            case(&p.url, &format!("changed: {}", what.join(", ")), &detail);
        }
        for u in &self.added {
            case(u, &format!("in {} only", names.new), "");
        }
        for u in &self.removed {
            case(u, &format!("in {} only", names.old), "");
        }
        let _ = writeln!(
            s,
            "  <testcase classname=\"perc.export\" name=\"{same} pages unchanged\"/>\n</testsuite>"
        );
        s
    }
}

fn count(n: usize, what: &str) -> String {
    format!("{n} {what}{}", if n == 1 { "" } else { "s" })
}

fn more(s: &mut String, n: usize, limit: usize, what: &str) {
    if n > limit {
        let _ = writeln!(s, "  … and {} more {what} (--limit shows more)", n - limit);
    }
}

/// A value as a reviewer reads it: strings quoted, null as "(none)".
fn show(v: &Value) -> String {
    match v {
        Value::Null => "(none)".into(),
        other => other.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn side(name: &str, text: &str) -> Side<std::vec::IntoIter<std::io::Result<String>>> {
        let lines: Vec<std::io::Result<String>> = text.lines().map(|l| Ok(l.to_string())).collect();
        Side { name: name.into(), lines: lines.into_iter() }
    }

    const A: &str = r#"{"url":"http://a/","canonical":"http://a/","title":"A","in_degree":1,"inlinks":[{"from":"http://b/","to":"http://a/","anchor":"home"}]}
{"url":"http://b/","canonical":"http://b/","title":"B","in_degree":0,"inlinks":[]}
{"url":"http://c/","canonical":"http://c/","title":"C","in_degree":0,"inlinks":[]}"#;

    #[test]
    fn equal_exports_have_no_diff() {
        let d = diff(side("old", A), side("new", A)).unwrap();
        assert!(d.is_empty());
        assert_eq!((d.old_pages, d.new_pages), (3, 3));
        assert!(d.text(&Names { old: "old", new: "new" }, 10).contains("are the same: 3 pages"));
    }

    #[test]
    fn fields_inlinks_and_pages_are_told_apart() {
        let new = r#"{"url":"http://a/","canonical":"http://a2/","title":"A","in_degree":1,"inlinks":[{"from":"http://c/","to":"http://a/","anchor":"home"}]}
{"url":"http://b/","canonical":"http://b/","title":"Bee","in_degree":0,"inlinks":[],"near_duplicates":[]}
{"url":"http://d/","canonical":"http://d/","title":"D","in_degree":0,"inlinks":[]}"#;
        let d = diff(side("old", A), side("new", new)).unwrap();
        assert_eq!(d.added, vec!["http://d/"]);
        assert_eq!(d.removed, vec!["http://c/"]);
        assert_eq!(d.changed.len(), 2);
        let a = &d.changed[0];
        assert_eq!(
            a.fields,
            vec![FieldChange {
                field: "canonical".into(),
                old: "http://a/".into(),
                new: "http://a2/".into()
            }]
        );
        assert_eq!(a.inlinks_added[0].from, "http://c/");
        assert_eq!(a.inlinks_removed[0].from, "http://b/");
        let b = &d.changed[1];
        assert_eq!(b.fields[0].field, "title");
        assert_eq!(
            (b.fields[1].field.as_str(), &b.fields[1].old),
            ("near_duplicates", &Value::Null)
        );
        let text = d.text(&Names { old: "golden", new: "got" }, 10);
        for want in [
            "2 pages changed, 1 added, 1 removed",
            "canonical:  \"http://a/\" → \"http://a2/\"",
            "+ from http://c/ (to http://a/) \"home\"",
            "- from http://b/",
            "title:",
            "\"B\" → \"Bee\"",
            "+ http://d/",
            "- http://c/",
        ] {
            assert!(text.contains(want), "{want:?} not in:\n{text}");
        }
        let short = d.text(&Names { old: "golden", new: "got" }, 1);
        assert!(short.contains("… and 1 more changed pages"), "{short}");
        let junit = d.junit("perc replay", &Names { old: "golden", new: "got" });
        assert!(junit.contains("tests=\"5\" failures=\"4\""), "{junit}");
        assert!(junit.contains("changed: canonical, inlinks"), "{junit}");
    }

    #[test]
    fn the_html_page_escapes_what_the_exports_say_and_bounds_its_lists() {
        let old = r#"{"url":"http://a/","title":"<b>A</b>","in_degree":1,"inlinks":[]}"#;
        let new = r#"{"url":"http://a/","title":"<script>alert(1)</script>","in_degree":2,"inlinks":[{"from":"http://x/?a=1&b=2","to":"http://a/","anchor":"\"q\" & <i>"}]}"#;
        let d = diff(side("old", old), side("new", new)).unwrap();
        let page = d.html(&Names { old: "golden.jsonl", new: "this replay" });
        assert!(page.starts_with("<!DOCTYPE html>"), "{page}");
        assert!(!page.contains("<script"), "markup from an export is text: {page}");
        for want in [
            "&lt;script&gt;alert(1)&lt;/script&gt;",
            "&lt;b&gt;A&lt;/b&gt;",
            "http://x/?a=1&amp;b=2",
            "&quot;q&quot; &amp; &lt;i&gt;",
            "perc diff: golden.jsonl → this replay",
            "1 changed, 0 added, 0 removed (1 pages → 1).",
            r#"<tr data-field="in_degree"><td>in_degree</td><td class="old"><code>1</code></td><td class="new"><code>2</code></td></tr>"#,
            r#"<tr class="gained">"#,
        ] {
            assert!(page.contains(want), "{want:?} not in:\n{page}");
        }
        assert!(!page.contains("src=") && !page.contains("<link"), "it loads nothing");

        // A diff of more pages than a page shows: the rest counted.
        let many = |n: usize| -> String {
            (0..n).map(|i| format!("{{\"url\":\"http://h/{i:05}\"}}\n")).collect()
        };
        let d = diff(side("old", ""), side("new", &many(PAGES_SHOWN + 7))).unwrap();
        let page = d.html(&Names { old: "a", new: "b" });
        assert_eq!(page.matches("<li>").count(), PAGES_SHOWN);
        assert!(page.contains("… and 7 more added pages"), "{}", &page[page.len() - 300..]);
        let same = diff(side("old", A), side("new", A)).unwrap();
        assert!(same.html(&Names { old: "a", new: "b" }).contains("The same: 3 pages."));
    }

    #[test]
    fn pageranks_within_the_bound_are_the_same() {
        let line = |rank: &str| format!(r#"{{"url":"http://a/","pagerank":{rank},"inlinks":[]}}"#);
        let differ = |a: &str, b: &str| {
            !diff(side("old", &line(a)), side("new", &line(b))).unwrap().is_empty()
        };
        assert!(!differ("0.15", "0.1509"), "within 0.001");
        assert!(differ("0.15", "0.1515"));
        assert!(!differ("10.0", "10.009"), "within 0.001 of the rank");
        assert!(differ("10.0", "10.02"));
        assert!(differ("0.15", "null"), "a rank against none differs");
    }

    #[test]
    fn unsorted_and_malformed_lines_are_named() {
        let unsorted = "{\"url\":\"http://b/\"}\n{\"url\":\"http://a/\"}";
        let e = diff(side("x.jsonl", A), side("y.jsonl", unsorted)).unwrap_err().to_string();
        assert!(e.starts_with("y.jsonl line 2: http://a/ comes after http://b/"), "{e}");
        let twice = "{\"url\":\"http://a/\"}\n{\"url\":\"http://a/\"}";
        let e = diff(side("x", twice), side("y", A)).unwrap_err().to_string();
        assert!(e.starts_with("x line 2:"), "{e}");
        for (bad, says) in [
            ("not json", "not a JSON export line"),
            ("[1,2]", "not a JSON object"),
            ("{\"title\":\"no url\"}", "no \"url\" string"),
            ("{\"url\":\"http://a/\",\"inlinks\":[1]}", "\"inlinks\" is not a list"),
        ] {
            let text = format!("{}\n{bad}", A.lines().next().unwrap());
            let e = diff(side("g", &text), side("h", A)).unwrap_err().to_string();
            assert!(e.starts_with("g line 2: ") && e.contains(says), "{e}");
        }
    }

    #[test]
    fn lines_are_bounded_and_a_byte_order_mark_is_read_past() {
        let lines = |text: &'static [u8], max| -> Vec<std::io::Result<String>> {
            BoundedLines::new(Box::new(text), max).collect()
        };
        let ok: Vec<String> = lines(b"\xEF\xBB\xBFone\r\ntwo\n\nthree", 100)
            .into_iter()
            .map(Result::unwrap)
            .collect();
        assert_eq!(ok, ["one", "two", "", "three"]);
        let long = lines(b"short\n0123456789abcdef\nnever read\n", 10);
        assert_eq!(long[0].as_ref().unwrap(), "short");
        let e = long[1].as_ref().unwrap_err();
        assert!(e.to_string().contains("longer than 10 bytes"), "{e}");
        assert!(lines(b"\xFF\n", 10)[0].is_err(), "not UTF-8");
    }
}
