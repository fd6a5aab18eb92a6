//! The diff as a page people look at (`perc diff --html`, `perc replay --expect --html`): one
//! self-contained HTML file (its style inline; no script, no request for anything), readable
//! in a CI system's artefact viewer. The counts first, then each changed page with its fields
//! old → new side by side and the inlinks it gained and lost, then the pages added and
//! removed. Every text from the exports is escaped (maud escapes what it is given): a title
//! that holds markup shows as text.

use maud::{html, Markup, DOCTYPE};
use serde_json::Value;

use super::{ExportDiff, Names, PageDiff};

/// The most entries of each list (changed, added, removed pages) the page shows; the rest
/// are counted. A diff of every page of a big site stays a page a browser opens.
pub const PAGES_SHOWN: usize = 1_000;

/// The most inlink changes shown for one page.
pub const INLINKS_SHOWN: usize = 200;

const STYLE: &str = "
  body { font: 14px/1.45 system-ui, sans-serif; margin: 1.5em 2em; color: #1d2330; background: #f6f7f9; }
  h1 { font-size: 20px; margin: 0 0 .3em; }
  h2 { font-size: 16px; margin: 1.6em 0 .5em; }
  h3 { font-size: 14px; margin: 0 0 .4em; word-break: break-all; }
  .same { color: #1a7f37; font-weight: 600; }
  .cards { display: flex; flex-wrap: wrap; gap: 10px; margin: .6em 0; }
  .card { background: #fff; border: 1px solid #dde1e8; border-radius: 6px; padding: 8px 14px; min-width: 110px; }
  .card .n { font-size: 24px; font-weight: 600; font-variant-numeric: tabular-nums; }
  .card .l { color: #667; font-size: 12px; }
  section.page { background: #fff; border: 1px solid #dde1e8; border-radius: 6px; padding: 10px 14px; margin: 10px 0; }
  table { border-collapse: collapse; width: 100%; table-layout: fixed; margin: .3em 0 .6em; }
  th, td { padding: 3px 8px; text-align: left; vertical-align: top; border-bottom: 1px solid #eef0f3; word-break: break-all; }
  th { background: #eef1f5; font-weight: 600; }
  col.field { width: 12em; } col.sign { width: 2em; }
  td.old { background: #ffebe9; } td.new { background: #e6ffec; }
  tr.lost td { background: #ffebe9; } tr.gained td { background: #e6ffec; }
  code { font: 12px/1.4 ui-monospace, monospace; white-space: pre-wrap; }
  .none { color: #889; font-style: italic; }
  .more { color: #667; font-style: italic; }
  ul.urls { background: #fff; border: 1px solid #dde1e8; border-radius: 6px; padding: 8px 14px 8px 2em; }
";

impl ExportDiff {
    /// The diff as one self-contained HTML page (see the module's description).
    pub fn html(&self, names: &Names) -> String {
        let title = format!("perc diff: {} → {}", names.old, names.new);
        let page = html! {
            (DOCTYPE)
            html lang="en" {
                head {
                    meta charset="utf-8";
                    meta name="viewport" content="width=device-width, initial-scale=1";
                    title { (title) }
                    style { (maud::PreEscaped(STYLE)) }
                }
                body {
                    h1 { (title) }
                    (self.summary(names))
                    @if !self.changed.is_empty() {
                        h2 { "Changed pages (" (self.changed.len()) ")" }
                        div #changed {
                            @for p in self.changed.iter().take(PAGES_SHOWN) { (changed(p, names)) }
                        }
                        (more(self.changed.len(), PAGES_SHOWN, "changed pages"))
                    }
                    (urls("added", &format!("in {} only", names.new), &self.added))
                    (urls("removed", &format!("in {} only", names.old), &self.removed))
                }
            }
        };
        page.into_string()
    }

    fn summary(&self, names: &Names) -> Markup {
        html! {
            @if self.is_empty() {
                p #summary .same { "The same: " (self.new_pages) " pages." }
            } @else {
                p #summary {
                    (self.changed.len()) " changed, " (self.added.len()) " added, "
                    (self.removed.len()) " removed (" (self.old_pages) " pages → "
                    (self.new_pages) ")."
                }
            }
            div .cards #counts {
                (card("changed", self.changed.len(), "pages changed"))
                (card("added", self.added.len(), "pages added"))
                (card("removed", self.removed.len(), "pages removed"))
                (card("old", self.old_pages, &format!("pages in {}", names.old)))
                (card("new", self.new_pages, &format!("pages in {}", names.new)))
            }
        }
    }
}

fn card(id: &str, n: usize, label: &str) -> Markup {
    html! { div .card data-count=(id) { div .n { (n) } div .l { (label) } } }
}

/// One changed page: its fields side by side, then its inlinks gained and lost.
fn changed(p: &PageDiff, names: &Names) -> Markup {
    let moves: Vec<(&str, &str, &super::Inlink)> = p
        .inlinks_added
        .iter()
        .map(|l| ("gained", "+", l))
        .chain(p.inlinks_removed.iter().map(|l| ("lost", "−", l)))
        .collect();
    html! {
        section .page data-url=(p.url) {
            h3 { a href=(p.url) { (p.url) } }
            @if !p.fields.is_empty() {
                table .fields {
                    colgroup { col .field; col; col; }
                    thead { tr { th { "field" } th { (names.old) } th { (names.new) } } }
                    tbody {
                        @for f in &p.fields {
                            tr data-field=(f.field) {
                                td { (f.field) }
                                td .old { (value(&f.old)) }
                                td .new { (value(&f.new)) }
                            }
                        }
                    }
                }
            }
            @if !moves.is_empty() {
                table .inlinks {
                    colgroup { col .sign; col; col; col; }
                    thead { tr { th {} th { "inlink from" } th { "to" } th { "anchor" } } }
                    tbody {
                        @for (class, sign, l) in moves.iter().take(INLINKS_SHOWN) {
                            tr class=(class) {
                                td { (sign) }
                                td { (l.from) }
                                td { (l.to) }
                                td { (l.anchor) }
                            }
                        }
                    }
                }
                (more(moves.len(), INLINKS_SHOWN, "inlink changes"))
            }
        }
    }
}

/// A field's value as a reviewer reads it: a string as itself, a list one item a line,
/// nothing as "(none)", anything else as its JSON.
fn value(v: &Value) -> Markup {
    html! {
        @match v {
            Value::Null => span .none { "(none)" },
            Value::String(s) if s.is_empty() => span .none { "(empty)" },
            Value::String(s) => code { (s) },
            Value::Array(items) if items.is_empty() => span .none { "(empty list)" },
            Value::Array(items) => {
                @for item in items {
                    code { (item.as_str().map_or_else(|| item.to_string(), str::to_string)) } br;
                }
            },
            other => code { (other.to_string()) },
        }
    }
}

fn urls(id: &str, what: &str, urls: &[String]) -> Markup {
    html! {
        @if !urls.is_empty() {
            h2 { "Pages " (id) " (" (urls.len()) ", " (what) ")" }
            ul .urls id=(id) {
                @for u in urls.iter().take(PAGES_SHOWN) { li { a href=(u) { (u) } } }
            }
            (more(urls.len(), PAGES_SHOWN, &format!("{id} pages")))
        }
    }
}

fn more(n: usize, shown: usize, what: &str) -> Markup {
    html! {
        @if n > shown {
            p .more { "… and " (n - shown) " more " (what) " (perc diff --json lists every one)." }
        }
    }
}
