//! A page's text and its simhash, for near-duplicate detection (spec §6.4a).
//!
//! Text: the Text nodes that descend from `<body>`, in document order, joined by one space,
//! leaving out those inside `script`, `style`, `noscript` and `template` (by local name, in
//! any namespace: an SVG `<style>` is CSS too). Tokens: the maximal runs of letters (L*) and
//! numbers (N*) of the text lowercased (Unicode default full lowercasing, Rust's
//! `to_lowercase`). Shingles: every run of 3 consecutive tokens, joined by one space.
//!
//! simhash (Charikar's): each shingle occurrence hashes to the first 8 bytes of its blake3,
//! read little-endian; bit i of the simhash is 1 iff more occurrences have bit i set than
//! clear. Near pages differ in few bits: two pages within 3 bits are near-duplicates.

use scraper::{Html, Node, Selector};
use unicode_general_category::{get_general_category, GeneralCategory as G};

/// Elements whose text is not the page's text.
const HIDDEN: [&str; 4] = ["script", "style", "noscript", "template"];

/// The text of a parsed document's `<body>` (see the module).
pub fn body_text(doc: &Html) -> String {
    let selector = Selector::parse("body").expect("static selector");
    let Some(body) = doc.select(&selector).next() else { return String::new() };
    let mut parts: Vec<&str> = Vec::new();
    // Depth first, children in order: document order.
    let mut stack = vec![*body];
    while let Some(node) = stack.pop() {
        match node.value() {
            Node::Text(t) => parts.push(t),
            Node::Element(e) if HIDDEN.contains(&e.name()) => continue,
            _ => {}
        }
        let first = stack.len();
        stack.extend(node.children());
        stack[first..].reverse();
    }
    parts.join(" ")
}

fn is_word_char(c: char) -> bool {
    if c.is_ascii() {
        // The ASCII letters and digits are the ASCII characters of L* and N*.
        return c.is_ascii_alphanumeric();
    }
    matches!(
        get_general_category(c),
        G::UppercaseLetter
            | G::LowercaseLetter
            | G::TitlecaseLetter
            | G::ModifierLetter
            | G::OtherLetter
            | G::DecimalNumber
            | G::LetterNumber
            | G::OtherNumber
    )
}

/// The tokens of a lowercased text: its runs of letters and numbers.
fn token_slices(lower: &str) -> Vec<&str> {
    lower.split(|c: char| !is_word_char(c)).filter(|t| !t.is_empty()).collect()
}

/// The tokens of a text: its lowercased runs of letters and numbers.
pub fn tokens(text: &str) -> Vec<String> {
    token_slices(&text.to_lowercase()).into_iter().map(str::to_string).collect()
}

/// The simhash of a text; `None` for a text of fewer than 3 tokens.
pub fn simhash(text: &str) -> Option<u64> {
    let lower = text.to_lowercase();
    let tokens = token_slices(&lower);
    if tokens.len() < 3 {
        return None;
    }
    // Per bit: the shingle occurrences that have it set.
    let mut ones = [0u32; 64];
    let mut shingle: Vec<u8> = Vec::with_capacity(64);
    for w in tokens.windows(3) {
        shingle.clear();
        shingle.extend_from_slice(w[0].as_bytes());
        shingle.push(b' ');
        shingle.extend_from_slice(w[1].as_bytes());
        shingle.push(b' ');
        shingle.extend_from_slice(w[2].as_bytes());
        let digest = blake3::hash(&shingle);
        let h = u64::from_le_bytes(digest.as_bytes()[..8].try_into().expect("8 bytes"));
        for (i, n) in ones.iter_mut().enumerate() {
            *n += ((h >> i) & 1) as u32;
        }
    }
    // Set iff more occurrences have it set than clear.
    let shingles = (tokens.len() - 2) as u32;
    Some((0..64).filter(|&i| 2 * ones[i] > shingles).fold(0, |s, i| s | 1 << i))
}

/// Bits in which two simhashes differ.
pub fn distance(a: u64, b: u64) -> u32 {
    (a ^ b).count_ones()
}

/// The most bits two near-duplicates' simhashes differ in (spec §6.4a).
pub const NEAR_BITS_MAX: u32 = 3;

#[cfg(test)]
mod tests {
    use super::*;

    fn text(html: &str) -> String {
        body_text(&Html::parse_document(html))
    }

    #[test]
    fn body_text_in_document_order_without_hidden_elements() {
        let t = text(
            "<html><head><title>not body</title><style>h1{}</style></head><body>\
             <h1>One</h1>two<script>var x</script><noscript>no</noscript>\
             <template>tpl</template><p>th<b>ree</b></p><svg><style>s{}</style></svg></body>",
        );
        assert_eq!(t, "One two th ree");
        assert_eq!(
            tokens("Ünïcode ΣΊΣΥΦΟΣ, 3½ e-mail x²"),
            ["ünïcode", "σίσυφος", "3½", "e", "mail", "x²"]
        );
    }

    #[test]
    fn simhash_by_the_definition() {
        assert_eq!(simhash("only two"), None);
        assert_eq!(simhash("a, b; c"), simhash("A B C"), "tokens, not punctuation or case");
        // One shingle: the simhash is its hash.
        let h = blake3::hash(b"a b c");
        assert_eq!(
            simhash("a b c"),
            Some(u64::from_le_bytes(h.as_bytes()[..8].try_into().unwrap()))
        );
        // Two shingles that agree on a bit set it; a tie (one set, one clear) clears it.
        let one =
            |s: &[u8]| u64::from_le_bytes(blake3::hash(s).as_bytes()[..8].try_into().unwrap());
        assert_eq!(simhash("a b c d"), Some(one(b"a b c") & one(b"b c d")));
        // A long text and the same with a word changed are near; an unrelated text is not.
        let words: Vec<String> = (0..400).map(|i| format!("w{}", i * 7919 % 1000)).collect();
        let base = words.join(" ");
        let mut edited = words.clone();
        edited[200] = "changed".into();
        let (a, b) = (simhash(&base).unwrap(), simhash(&edited.join(" ")).unwrap());
        assert!(distance(a, b) <= NEAR_BITS_MAX, "{}", distance(a, b));
        let other: Vec<String> = (0..400).map(|i| format!("v{i}")).collect();
        assert!(distance(a, simhash(&other.join(" ")).unwrap()) > NEAR_BITS_MAX);
    }
}
