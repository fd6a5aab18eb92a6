//! Writing a web out, page by page: as a site directory that perc's static server (and any
//! web server) can serve, or as a WARC that `perc replay` loads. Memory stays flat in the
//! number of pages.

use std::io::{self, BufWriter, Write};
use std::path::Path;

use perc_crawl::warc::Recorder;

use crate::{Change, Web};

/// Writes page `i` (or its changed version) into `dir`; a redirect becomes a line of
/// `redirects` (`FROM TO STATUS`, the format of `_redirects`).
fn write_page(
    dir: &Path,
    i: usize,
    response: &perc_crawl::Response,
    redirects: &mut impl Write,
) -> io::Result<()> {
    let path = Web::path(i);
    if response.status == 301 {
        let to = response.location.as_ref().map(|u| u.path().to_string()).unwrap_or_default();
        writeln!(redirects, "{path} {to} 301")?;
        return Ok(());
    }
    let file = dir.join(path.trim_start_matches('/'));
    if let Some(parent) = file.parent() {
        std::fs::create_dir_all(parent)?;
    }
    std::fs::write(file, &response.body)
}

/// The whole web as a site directory: `p/<i>.html` files and a `_redirects` file.
pub fn site(web: &Web, dir: &Path) -> io::Result<()> {
    std::fs::create_dir_all(dir)?;
    let mut redirects = BufWriter::new(std::fs::File::create(dir.join("_redirects"))?);
    for i in 0..web.len() {
        write_page(dir, i, &web.response(i), &mut redirects)?;
    }
    redirects.flush()
}

/// Applies a change set to a site directory written by [`site`]: the changed pages are
/// rewritten in their version `version`. (A changed page is never a redirect.)
pub fn apply_changes(
    web: &Web,
    dir: &Path,
    changes: &[(usize, Change)],
    version: u32,
) -> io::Result<()> {
    let mut sink = io::sink();
    for (i, change) in changes {
        write_page(dir, *i, &web.changed(*i, version, *change), &mut sink)?;
    }
    Ok(())
}

/// The whole web as a WARC (request and response records, one gzip member each). An
/// existing file at `path` is replaced: the web is a function of its spec.
pub fn warc(web: &Web, path: &Path) -> io::Result<()> {
    match std::fs::remove_file(path) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(e),
        _ => {}
    }
    let mut recorder = Recorder::create(path, false)?;
    for (url, response) in web.responses() {
        recorder.record(&url, "perc-synth", &response)?;
    }
    recorder.finish()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Spec;

    #[test]
    fn a_written_warc_reads_back_as_the_web() {
        let dir = tempfile::tempdir().unwrap();
        let web = Web::new(Spec::new(60, 5));
        let path = dir.path().join("web.warc.gz");
        warc(&web, &path).unwrap();
        let (records, issues) = perc_crawl::warc::read(&path, 1 << 20).unwrap();
        assert!(issues.is_empty(), "{issues:?}");
        assert_eq!(records.len(), 60);
        for (i, r) in records.iter().enumerate() {
            assert_eq!(r.url, web.url(i));
            assert_eq!(r.response.status, web.response(i).status);
            assert_eq!(r.response.body, web.response(i).body);
        }
    }

    #[test]
    fn a_written_site_has_every_page_and_the_redirects() {
        let dir = tempfile::tempdir().unwrap();
        let web = Web::new(Spec::new(200, 5));
        site(&web, dir.path()).unwrap();
        let redirects = std::fs::read_to_string(dir.path().join("_redirects")).unwrap();
        for i in 0..200 {
            let r = web.response(i);
            if r.status == 301 {
                assert!(redirects.contains(&format!("{} ", Web::path(i))));
            } else {
                let file = dir.path().join(format!("p/{i}.html"));
                assert_eq!(std::fs::read(file).unwrap(), r.body.to_vec());
            }
        }
        let changes = web.change_set(5, 1);
        apply_changes(&web, dir.path(), &changes, 1).unwrap();
        for (i, c) in changes {
            let file = dir.path().join(format!("p/{i}.html"));
            assert_eq!(std::fs::read(file).unwrap(), web.changed(i, 1, c).body.to_vec());
        }
    }
}
