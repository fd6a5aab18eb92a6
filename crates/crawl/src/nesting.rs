//! How deep a page's elements nest, measured before the page is parsed.
//!
//! The HTML tree builder (html5ever's, as every browser's) walks its stack of open elements
//! for many tags it meets ("is a `p` in button scope?"), so a page's parse costs its
//! elements times its depth: 100,000 nested `div`s, 1.1 MB, take about a minute, where the
//! same divs side by side take a third of a second. Browsers cap the depth (Chromium at 512)
//! by adding elements past it as siblings; perc does not parse such a page at all and
//! records why ([`NESTING_MAX`]): no real page nests that deep, and a page that does is
//! broken or hostile.
//!
//! The depth is measured by html5ever's tokenizer (linear in the page) and a stack of open
//! tags kept the way the tree builder keeps its own, as far as a page needs: void and
//! self-closed elements open nothing; an end tag closes up to its open element and is
//! ignored when there is none; the elements whose end tag may be left out (`p`, `li`, `td`,
//! `option`, ...) are closed by the next of their kind within the same list, row or table,
//! and a `p` by a block that opens after it; the contents of `script`, `style`, `title`,
//! `textarea` and the like are text.
//! Where a real page differs from that model the measure errs high, never low, and a page
//! must go past the limit by hundreds of elements to be refused.

use std::cell::{Cell, RefCell};

use html5ever::tendril::StrTendril;
use html5ever::tokenizer::states::RawKind;
use html5ever::tokenizer::{
    BufferQueue, TagKind, Token, TokenSink, TokenSinkResult, Tokenizer, TokenizerOpts,
};
use html5ever::LocalName;

/// The deepest element nesting a page may have to be parsed.
pub const NESTING_MAX: usize = 512;

/// The depth past [`NESTING_MAX`] that `html` reaches, if it does (the measure stops there).
pub fn too_deep(html: &str) -> Option<usize> {
    let sink = Depth::default();
    let tokenizer = Tokenizer::new(sink, TokenizerOpts::default());
    let input = BufferQueue::default();
    input.push_back(StrTendril::from_slice(html));
    while !matches!(tokenizer.feed(&input), html5ever::TokenizerResult::Done) {}
    tokenizer.end();
    let deepest = tokenizer.sink.deepest.get();
    (deepest > NESTING_MAX).then_some(deepest)
}

#[derive(Default)]
struct Depth {
    open: RefCell<Vec<LocalName>>,
    deepest: Cell<usize>,
}

/// Elements that never have contents.
const VOID: &[&str] = &[
    "area", "base", "basefont", "bgsound", "br", "col", "embed", "frame", "hr", "image", "img",
    "input", "keygen", "link", "meta", "param", "source", "track", "wbr",
];

/// Elements whose end tag may be left out: an element of a group, when it opens, closes the
/// open element of its group nearest the top of the stack (and what is open above it), as
/// long as no element of the group's boundary lies between (a `li` closes the `li` of its
/// own list, not one of an outer list).
const IMPLIED_END: &[(&[&str], &[&str])] = &[
    (&["li"], &["ul", "ol", "menu"]),
    (&["dt", "dd"], &["dl"]),
    (&["td", "th"], &["tr", "table"]),
    (&["tr"], &["table", "tbody", "thead", "tfoot"]),
    (&["thead", "tbody", "tfoot"], &["table"]),
    (&["option", "optgroup"], &["select", "datalist"]),
    (&["rb", "rt", "rtc", "rp"], &["ruby"]),
];

/// Blocks whose start closes an open `p` (in "button scope": below its boundary).
const CLOSES_P: &[&str] = &[
    "address",
    "article",
    "aside",
    "blockquote",
    "center",
    "details",
    "dialog",
    "dir",
    "div",
    "dl",
    "fieldset",
    "figcaption",
    "figure",
    "footer",
    "form",
    "h1",
    "h2",
    "h3",
    "h4",
    "h5",
    "h6",
    "header",
    "hgroup",
    "hr",
    "li",
    "dd",
    "dt",
    "main",
    "menu",
    "nav",
    "ol",
    "p",
    "pre",
    "section",
    "summary",
    "table",
    "ul",
];
const P_BOUNDARY: &[&str] =
    &["button", "table", "td", "th", "caption", "marquee", "object", "applet", "html", "template"];

/// The open element of `closes` nearest the top of `open` with no element of `boundary`
/// above it: where the stack is cut when the element that implies its end opens.
fn implied_end(open: &[LocalName], closes: &[&str], boundary: &[&str]) -> Option<usize> {
    for (i, t) in open.iter().enumerate().rev() {
        let t: &str = t;
        if closes.contains(&t) {
            return Some(i);
        }
        if boundary.contains(&t) {
            return None;
        }
    }
    None
}

impl TokenSink for Depth {
    type Handle = ();

    fn process_token(&self, token: Token, _line: u64) -> TokenSinkResult<()> {
        let Token::TagToken(tag) = token else { return TokenSinkResult::Continue };
        if self.deepest.get() > NESTING_MAX {
            return TokenSinkResult::Continue;
        }
        let name: &str = &tag.name;
        let mut open = self.open.borrow_mut();
        match tag.kind {
            TagKind::StartTag => {
                if CLOSES_P.contains(&name) {
                    if let Some(at) = implied_end(&open, &["p"], P_BOUNDARY) {
                        open.truncate(at);
                    }
                }
                let group = IMPLIED_END.iter().find(|(g, _)| g.contains(&name));
                if let Some((closes, boundary)) = group {
                    if let Some(at) = implied_end(&open, closes, boundary) {
                        open.truncate(at);
                    }
                }
                if VOID.contains(&name) || tag.self_closing {
                    return TokenSinkResult::Continue;
                }
                open.push(tag.name.clone());
                self.deepest.set(self.deepest.get().max(open.len()));
                match name {
                    "script" => TokenSinkResult::RawData(RawKind::ScriptData),
                    "style" | "xmp" | "iframe" | "noembed" | "noframes" => {
                        TokenSinkResult::RawData(RawKind::Rawtext)
                    }
                    "title" | "textarea" => TokenSinkResult::RawData(RawKind::Rcdata),
                    "plaintext" => TokenSinkResult::Plaintext,
                    _ => TokenSinkResult::Continue,
                }
            }
            TagKind::EndTag => {
                if let Some(at) = open.iter().rposition(|t| t == &tag.name) {
                    open.truncate(at);
                }
                TokenSinkResult::Continue
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deep_nesting_is_measured_and_real_pages_pass() {
        let nested = |n: usize| format!("{}text{}", "<div>".repeat(n), "</div>".repeat(n));
        assert_eq!(too_deep(&nested(NESTING_MAX)), None);
        assert_eq!(too_deep(&nested(NESTING_MAX + 1)), Some(NESTING_MAX + 1));
        assert!(too_deep(&nested(100_000)).is_some());
        // Side by side is no depth, however many.
        assert_eq!(too_deep(&"<div><p>text</p></div>".repeat(10_000)), None);
        // End tags left out where HTML allows it close as the tree builder closes them.
        let loose = "<ul>".to_string() + &"<li>item <p>para <p>para".repeat(2_000) + "</ul>";
        assert_eq!(too_deep(&loose), None);
        let table = "<table>".to_string() + &"<tr><td>a<td>b".repeat(2_000) + "</table>";
        assert_eq!(too_deep(&table), None);
        let voids = "<br><img src=x><hr><input><meta charset=utf-8><span/>".repeat(2_000);
        assert_eq!(too_deep(&voids), None);
        // Tags inside a script, a style or a title are text.
        let script = format!(
            "<script>{}</script><style>{}</style>",
            "<div>".repeat(2_000),
            "<b>".repeat(2_000)
        );
        assert_eq!(too_deep(&script), None);
        // Stray end tags close nothing that is not open.
        assert_eq!(too_deep(&"</div></span>".repeat(1_000)), None);
    }
}
