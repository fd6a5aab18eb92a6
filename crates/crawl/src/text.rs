//! A page's main text and its language (spec §6.4b's `lang`; what the search index holds of
//! a page's body): the content a reader came for, without the navigation, sidebars and
//! footers around it. dom_smoothie extracts it (a port of Mozilla's Readability, the
//! algorithm of Firefox's reader view: it scores the blocks of a page by their text, commas
//! and link density and keeps the best one and its siblings); whatlang names its language.
//!
//! A page Readability finds no article in (a short page, a list of links) has its whole
//! body's text as its main text ([`crate::simhash::body_text`]): search must still find it.
//! Near-duplicates keep seeing the whole body (spec §6.4a defines them over it).

use dom_smoothie::{Config, Readability, TextMode};
use url::Url;

/// The main text of a page and its language.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct MainText {
    /// Whitespace runs collapsed to one space, trimmed.
    pub text: String,
    /// The language of `text`, ISO 639-3 (`"eng"`, `"deu"`), when whatlang names it
    /// reliably; `None` for a text too short or too mixed to tell.
    pub lang: Option<&'static str>,
}

/// The most bytes of a main text the language is detected from: whatlang counts trigrams
/// over all it is given, and a page's first few thousand characters tell its language as
/// well as all of them.
pub const LANG_BYTES: usize = 4_096;

/// The most elements a page may have for Readability to look at it (its scoring walks the
/// tree several times); a bigger page's main text is its whole body's.
pub const ELEMENTS_MAX: usize = 20_000;

/// The main text of `html` (decoded), a page of `url`, and its language; `body_text` gives
/// its whole body's text when Readability finds no article in it.
pub fn main_text(url: &Url, html: &str, body_text: impl FnOnce() -> String) -> MainText {
    let text = article(url, html, body_text);
    let lang = language(&text);
    MainText { text, lang }
}

/// [`main_text`]'s text alone (what a search index needs of a page whose language its
/// export line already says).
pub fn article(url: &Url, html: &str, body_text: impl FnOnce() -> String) -> String {
    let config = Config {
        text_mode: TextMode::Formatted,
        max_elements_to_parse: ELEMENTS_MAX,
        ..Config::default()
    };
    let article = Readability::new(html, Some(url.as_str()), Some(config))
        .and_then(|mut r| r.parse())
        .ok()
        .map(|a| crate::parse::collapse(&a.text_content))
        .filter(|t| !t.is_empty());
    article.unwrap_or_else(|| crate::parse::collapse(&body_text()))
}

/// The language of `text` (its first [`LANG_BYTES`]), ISO 639-3, when whatlang is sure of it.
pub fn language(text: &str) -> Option<&'static str> {
    let mut end = text.len().min(LANG_BYTES);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    whatlang::detect(&text[..end]).filter(whatlang::Info::is_reliable).map(|i| i.lang().code())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn url() -> Url {
        Url::parse("http://example.com/article").unwrap()
    }

    const ARTICLE: &str = "The river runs through the valley, and the town grew up along its \
        banks over three centuries. Merchants built warehouses near the water, and the bridges \
        they paid for still carry most of the traffic today. In the spring, when the snow melts \
        in the mountains, the river rises, and the old quarter floods, as it has for as long \
        as anyone remembers.";

    fn page(article: &str) -> String {
        format!(
            "<html><head><title>T</title></head><body>\
             <nav><a href=/a>Home</a> <a href=/b>Products</a> <a href=/c>Contact us</a></nav>\
             <div class=sidebar><a href=/d>Related link one</a><a href=/e>Related two</a></div>\
             <article><h1>The river</h1><p>{article}</p><p>{article}</p></article>\
             <footer>Copyright footer text, all rights reserved.</footer></body></html>"
        )
    }

    #[test]
    fn keeps_the_article_and_leaves_out_the_chrome() {
        let m = main_text(&url(), &page(ARTICLE), || panic!("an article was found"));
        assert!(m.text.contains("The river runs through the valley"), "{}", m.text);
        for chrome in ["Products", "Contact us", "Related link one", "Copyright footer"] {
            assert!(!m.text.contains(chrome), "{chrome:?} in {:?}", m.text);
        }
        assert!(!m.text.contains("  "), "whitespace collapsed: {:?}", m.text);
        assert_eq!(m.lang, Some("eng"));
    }

    #[test]
    fn names_the_language_in_iso_639_3() {
        let german = "Der Fluss fließt durch das Tal, und die Stadt wuchs über drei \
            Jahrhunderte an seinen Ufern. Kaufleute bauten Lagerhäuser am Wasser, und die \
            Brücken, die sie bezahlten, tragen noch heute den größten Teil des Verkehrs.";
        assert_eq!(main_text(&url(), &page(german), String::new).lang, Some("deu"));
        assert_eq!(language("Ok"), None, "too short to tell");
        assert_eq!(language(""), None);
    }

    #[test]
    fn a_page_without_an_article_has_its_body_as_main_text() {
        let links = "<html><body><a href=/a>one</a> <a href=/b>two</a></body></html>";
        let m = main_text(&url(), links, || " one   two ".to_string());
        assert_eq!(m.text, "one two");
        assert_eq!(m.lang, None);
    }

    #[test]
    fn only_the_first_bytes_are_read_for_the_language_and_never_split_a_character() {
        // Byte LANG_BYTES falls inside a two-byte character: no panic, and the article
        // beyond it is not read (a run of one letter is no language).
        let long = format!("a{}{}", "é".repeat(LANG_BYTES), ARTICLE);
        assert!(!long.is_char_boundary(LANG_BYTES));
        assert_eq!(language(&long), None);
        assert_eq!(language(ARTICLE), Some("eng"));
    }
}
