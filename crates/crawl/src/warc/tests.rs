//! The WARC reader and recorder, each way round and across: what one writes the other
//! reads back as it was.

use std::fs::File;
use std::io::{self, Read, Write};
use std::path::Path;

use bytes::Bytes;
use url::Url;
use warc::{Record, RecordBuilder, RecordType, WarcHeader, WarcReader, WarcWriter};

use crate::fetch::Response;

use super::read::*;
use super::write::*;

#[test]
fn status_lines_carry_http_reason_phrases() {
    assert_eq!(reason(200), "OK");
    assert_eq!(reason(301), "Moved Permanently");
    assert_eq!(reason(429), "Too Many Requests");
    assert_eq!(reason(503), "Service Unavailable");
    assert_eq!(reason(599), "");
}

fn resp(status: u16, body: &str) -> Response {
    Response {
        status,
        content_type: Some("text/html".into()),
        charset: Some("utf-8".into()),
        location: None,
        retry_after_s: None,
        received: None,
        body: Bytes::copy_from_slice(body.as_bytes()),
    }
}

#[test]
fn an_existing_warc_is_refused_unless_appended_to() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("crawl.warc.gz");
    let a = Url::parse("http://h.test/a").unwrap();
    let mut rec = Recorder::create(&path, false).unwrap();
    rec.record(&a, "perc", &resp(200, "first")).unwrap();
    rec.finish().unwrap();
    let size = std::fs::metadata(&path).unwrap().len();
    let e = Recorder::create(&path, false).err().unwrap();
    assert_eq!(e.kind(), io::ErrorKind::AlreadyExists);
    assert!(e.to_string().contains("--append"), "{e}");
    assert_eq!(std::fs::metadata(&path).unwrap().len(), size, "nothing was truncated");
    let mut rec = Recorder::create(&path, true).unwrap();
    rec.record(&Url::parse("http://h.test/b").unwrap(), "perc", &resp(200, "second")).unwrap();
    rec.finish().unwrap();
    let (got, issues) = read(&path, 1 << 20).unwrap();
    assert!(issues.is_empty(), "{issues:?}");
    let bodies: Vec<&[u8]> = got.iter().map(|r| r.response.body.as_ref()).collect();
    assert_eq!(bodies, [b"first".as_ref(), b"second"]);
}

#[test]
fn the_http_head_is_recorded_as_received_with_the_encoding_fields_renamed() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("crawl.warc.gz");
    let mut r = resp(200, "<title>decoded</title>");
    let field = |n: &str, v: &str| (n.to_string(), v.as_bytes().to_vec());
    r.received = Some(Box::new(crate::fetch::Received {
        version: "HTTP/1.1".into(),
        headers: vec![
            field("server", "test/1"),
            field("content-type", "text/html; charset=utf-8"),
            field("transfer-encoding", "chunked"),
            field("content-encoding", "gzip"),
            field("x-odd", "caf\u{e9}"),
        ],
    }));
    let mut rec = Recorder::create(&path, false).unwrap();
    rec.record(&Url::parse("http://h.test/a").unwrap(), "perc", &r).unwrap();
    rec.finish().unwrap();
    let mut raw = Vec::new();
    flate2::read::MultiGzDecoder::new(std::fs::File::open(&path).unwrap())
        .read_to_end(&mut raw)
        .unwrap();
    let text = String::from_utf8_lossy(&raw);
    let head = "HTTP/1.1 200 OK\r\nserver: test/1\r\ncontent-type: text/html; charset=utf-8\r\n\
                X-Crawler-transfer-encoding: chunked\r\nX-Crawler-content-encoding: gzip\r\n\
                x-odd: caf\u{e9}\r\nContent-Length: 22\r\n\r\n<title>decoded</title>";
    assert!(text.contains(head), "{text}");
    // It replays to the same response.
    let (got, issues) = read(&path, 1 << 20).unwrap();
    assert!(issues.is_empty(), "{issues:?}");
    assert_eq!(got[0].response.body, r.body);
    assert_eq!(got[0].response.charset.as_deref(), Some("utf-8"));
}

/// Where each gzip member of a `.warc.gz` starts.
fn member_starts(bytes: &[u8]) -> Vec<usize> {
    bytes.windows(3).enumerate().filter(|(_, w)| *w == b"\x1f\x8b\x08").map(|(i, _)| i).collect()
}

/// The records of a gzipped WARC, parsed, with their block digests checked.
fn records_of(path: &Path) -> Vec<Record<warc::BufferedBody>> {
    let mut raw = Vec::new();
    flate2::read::MultiGzDecoder::new(File::open(path).unwrap()).read_to_end(&mut raw).unwrap();
    let records: Vec<_> = WarcReader::new(&raw[..]).iter_records().map(|r| r.unwrap()).collect();
    for r in &records {
        assert_eq!(r.header(WarcHeader::BlockDigest).unwrap(), digest(r.body()), "{r:?}");
    }
    records
}

#[test]
fn an_unchanged_refetch_is_a_revisit_that_reads_back_as_the_response() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("crawl.warc.gz");
    let u = |p: &str| Url::parse(&format!("http://h.test/{p}")).unwrap();
    let mut moved = resp(301, "");
    moved.location = Some(u("a"));
    let mut rec = Recorder::create(&path, false).unwrap();
    rec.record(&u("a"), "perc", &resp(200, "<p>one</p>")).unwrap();
    rec.record(&u("b"), "perc", &resp(200, "x")).unwrap();
    rec.record(&u("old"), "perc", &moved).unwrap();
    rec.finish().unwrap();
    // The next run appends: a unchanged (its head changed), b changed, c new, the
    // redirect again (no payload: a response again), a unchanged again in the same run.
    let mut rec = Recorder::create(&path, true).unwrap();
    let mut relabelled = resp(200, "<p>one</p>");
    relabelled.charset = Some("iso-8859-1".into());
    rec.record(&u("a"), "perc", &relabelled).unwrap();
    rec.record(&u("b"), "perc", &resp(200, "y")).unwrap();
    rec.record(&u("c"), "perc", &resp(200, "z")).unwrap();
    rec.record(&u("old"), "perc", &moved).unwrap();
    rec.record(&u("a"), "perc", &resp(200, "<p>one</p>")).unwrap();
    rec.finish().unwrap();

    let records = records_of(&path);
    let first_a = records
        .iter()
        .find(|r| *r.warc_type() == RecordType::Response)
        .map(|r| r.warc_id().to_string())
        .unwrap();
    let revisits: Vec<_> =
        records.iter().filter(|r| *r.warc_type() == RecordType::Revisit).collect();
    assert_eq!(revisits.len(), 2, "{records:?}");
    for r in &revisits {
        assert_eq!(r.header(WarcHeader::TargetURI).unwrap(), "http://h.test/a");
        assert_eq!(r.header(WarcHeader::RefersTo).unwrap(), first_a);
        assert_eq!(r.header(WarcHeader::Profile).unwrap(), IDENTICAL_PAYLOAD);
        assert_eq!(r.header(WarcHeader::PayloadDigest).unwrap(), digest(b"<p>one</p>"));
        let head = String::from_utf8_lossy(r.body());
        assert!(head.starts_with("HTTP/1.1 200 OK\r\n") && head.ends_with("\r\n\r\n"));
        assert!(!head.contains("<p>"), "the head only: {head}");
    }
    assert!(revisits[0].header(WarcHeader::Unknown("warc-refers-to-date".into())).is_some());

    let (got, issues) = read(&path, 1 << 20).unwrap();
    assert!(issues.is_empty(), "{issues:?}");
    let seen: Vec<(&str, &[u8], Option<&str>)> = got
        .iter()
        .map(|r| (r.url.path(), r.response.body.as_ref(), r.response.charset.as_deref()))
        .collect();
    let utf8 = Some("utf-8");
    assert_eq!(
        seen,
        [
            ("/a", b"<p>one</p>".as_ref(), utf8),
            ("/b", b"x", utf8),
            ("/old", b"", utf8),
            ("/a", b"<p>one</p>", Some("iso-8859-1")),
            ("/b", b"y", utf8),
            ("/c", b"z", utf8),
            ("/old", b"", utf8),
            ("/a", b"<p>one</p>", utf8),
        ]
    );
    assert_eq!(got[6].response.location, Some(u("a")));
}

#[test]
fn a_304_is_a_not_modified_revisit_that_reads_back_as_the_capture() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("crawl.warc.gz");
    let (a, b) = (Url::parse("http://h.test/a").unwrap(), Url::parse("http://h.test/b").unwrap());
    let mut rec = Recorder::create(&path, false).unwrap();
    rec.record(&a, "perc", &resp(200, "<p>a</p>")).unwrap();
    rec.record(&a, "perc", &resp(304, "")).unwrap();
    // Nothing to refer to: recorded as it came.
    rec.record(&b, "perc", &resp(304, "")).unwrap();
    rec.finish().unwrap();
    let records = records_of(&path);
    let revisit = records.iter().find(|r| *r.warc_type() == RecordType::Revisit).unwrap();
    assert_eq!(revisit.header(WarcHeader::Profile).unwrap(), NOT_MODIFIED);
    assert!(revisit.header(WarcHeader::PayloadDigest).is_none());
    assert!(String::from_utf8_lossy(revisit.body()).starts_with("HTTP/1.1 304 Not Modified"));
    let (got, issues) = read(&path, 1 << 20).unwrap();
    assert!(issues.is_empty(), "{issues:?}");
    let seen: Vec<(&str, u16, &[u8])> =
        got.iter().map(|r| (r.url.path(), r.response.status, r.response.body.as_ref())).collect();
    assert_eq!(
        seen,
        [("/a", 200, b"<p>a</p>".as_ref()), ("/a", 200, b"<p>a</p>"), ("/b", 304, b"")]
    );
}

#[test]
fn a_revisit_without_its_original_is_an_issue_and_the_rest_reads() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("crawl.warc.gz");
    let a = Url::parse("http://h.test/a").unwrap();
    let mut rec = Recorder::create(&path, false).unwrap();
    rec.record(&a, "perc", &resp(200, "same")).unwrap();
    rec.record(&a, "perc", &resp(200, "same")).unwrap();
    rec.record(&Url::parse("http://h.test/b").unwrap(), "perc", &resp(200, "b")).unwrap();
    rec.finish().unwrap();
    // Drop the first response's member (members: warcinfo, request, response, ...).
    let bytes = std::fs::read(&path).unwrap();
    let starts = member_starts(&bytes);
    let mut cut = bytes[..starts[2]].to_vec();
    cut.extend_from_slice(&bytes[starts[3]..]);
    std::fs::write(&path, &cut).unwrap();
    let (got, issues) = read(&path, 1 << 20).unwrap();
    let urls: Vec<&str> = got.iter().map(|r| r.url.path()).collect();
    assert_eq!(urls, ["/b"]);
    assert_eq!(issues.len(), 1, "{issues:?}");
    assert_eq!(issues[0].offset, (starts[4] - (starts[3] - starts[2])) as u64);
    assert!(
        issues[0].message.starts_with(
            "revisit record of http://h.test/a refers to a record not in this file (<urn:uuid:"
        ),
        "{}",
        issues[0]
    );
}

#[test]
fn other_tools_revisits_by_payload_digest_and_not_modified() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("other-tool.warc");
    let id = "<urn:uuid:11111111-1111-1111-1111-111111111111>";
    let build = |t: RecordType, block: &[u8], extra: &[(WarcHeader, &str)]| {
        let mut b = RecordBuilder::default()
            .warc_type(t)
            .header(WarcHeader::TargetURI, "http://h.test/a")
            .header(WarcHeader::ContentType, "application/http; msgtype=response");
        for (h, v) in extra {
            b = b.header(h.clone(), *v);
        }
        let mut w = WarcWriter::new(io::BufWriter::new(Vec::new()));
        w.write(&b.body(block.to_vec()).build().unwrap()).unwrap();
        w.into_inner().unwrap()
    };
    let mut file = build(
        RecordType::Response,
        b"HTTP/1.1 200 OK\r\nContent-Type: text/html\r\n\r\n<p>a</p>",
        &[(WarcHeader::RecordID, id), (WarcHeader::PayloadDigest, "sha1:AAAA")],
    );
    // No WARC-Refers-To: found by payload digest; its own head.
    file.extend(build(
        RecordType::Revisit,
        b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 8\r\n\r\n",
        &[(WarcHeader::PayloadDigest, "sha1:AAAA")],
    ));
    // Not modified: the original response whole.
    file.extend(build(
        RecordType::Revisit,
        b"HTTP/1.1 304 Not Modified\r\n\r\n",
        &[
            (WarcHeader::RefersTo, id),
            (WarcHeader::Profile, "http://netpreserve.org/warc/1.1/revisit/server-not-modified"),
        ],
    ));
    std::fs::write(&path, &file).unwrap();
    let (got, issues) = read(&path, 1 << 20).unwrap();
    assert!(issues.is_empty(), "{issues:?}");
    let seen: Vec<(u16, &str, &[u8])> = got
        .iter()
        .map(|r| {
            let ct = r.response.content_type.as_deref().unwrap_or("");
            (r.response.status, ct, r.response.body.as_ref())
        })
        .collect();
    assert_eq!(
        seen,
        [
            (200, "text/html", b"<p>a</p>".as_ref()),
            (200, "text/plain", b"<p>a</p>"),
            (200, "text/html", b"<p>a</p>"),
        ]
    );
}

/// The largest resident set this process has had, in bytes (Linux).
fn peak_rss() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let line = status.lines().find(|l| l.starts_with("VmHWM:")).unwrap();
    line.split_whitespace().nth(1).unwrap().parse::<u64>().unwrap() * 1024
}

#[test]
fn a_gzip_bomb_record_is_skipped_without_inflating_it_into_memory() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("bomb.warc.gz");
    let mut rec = Recorder::create(&path, false).unwrap();
    rec.record(&Url::parse("http://h.test/before").unwrap(), "perc", &resp(200, "ok")).unwrap();
    rec.finish().unwrap();
    // A response record of 96 MiB of spaces: a gzip member of about 100 KB.
    let bomb_at = std::fs::metadata(&path).unwrap().len();
    let mut file = File::options().append(true).open(&path).unwrap();
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    let body_len = 96 << 20;
    let head = format!(
        "WARC/1.0\r\nWARC-Type: response\r\nWARC-Target-URI: http://h.test/bomb\r\n\
         WARC-Record-ID: <urn:uuid:00000000-0000-0000-0000-000000000000>\r\n\
         WARC-Date: 2026-01-01T00:00:00Z\r\n\
         Content-Type: application/http; msgtype=response\r\nContent-Length: {}\r\n\r\n\
         HTTP/1.1 200 OK\r\nContent-Type: text/html\r\n\r\n",
        body_len + 44
    );
    gz.write_all(head.as_bytes()).unwrap();
    let chunk = vec![b' '; 1 << 20];
    for _ in 0..96 {
        gz.write_all(&chunk).unwrap();
    }
    gz.write_all(b"\r\n\r\n").unwrap();
    file.write_all(&gz.finish().unwrap()).unwrap();
    drop(file);
    let mut rec = Recorder::create(&path, true).unwrap();
    rec.record(&Url::parse("http://h.test/after").unwrap(), "perc", &resp(200, "ok")).unwrap();
    rec.finish().unwrap();

    let before = peak_rss();
    let (got, issues) = read(&path, 1 << 20).unwrap();
    let grew = peak_rss().saturating_sub(before);
    let urls: Vec<&str> = got.iter().map(|r| r.url.as_str()).collect();
    assert_eq!(urls, ["http://h.test/before", "http://h.test/after"]);
    assert_eq!(issues.len(), 1, "{issues:?}");
    assert_eq!(issues[0].offset, bomb_at);
    assert!(issues[0].message.starts_with("record larger than"), "{}", issues[0]);
    assert!(grew < 16 << 20, "reading grew the peak RSS by {grew} bytes");
}

#[test]
fn round_trip_and_recovery_around_a_corrupt_member() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("crawl.warc.gz");
    let mut rec = Recorder::create(&path, false).unwrap();
    let urls: Vec<Url> =
        (0..4).map(|i| Url::parse(&format!("http://h.test/p{i}")).unwrap()).collect();
    for (i, u) in urls.iter().enumerate() {
        rec.record(u, "perc", &resp(200, &format!("<title>{i}</title>"))).unwrap();
    }
    let mut moved = resp(301, "");
    moved.location = Some(urls[0].clone());
    rec.record(&Url::parse("http://h.test/old").unwrap(), "perc", &moved).unwrap();
    rec.finish().unwrap();

    let (got, issues) = read(&path, 1 << 20).unwrap();
    assert!(issues.is_empty(), "{issues:?}");
    assert_eq!(got.len(), 5);
    assert_eq!(got[2].url, urls[2]);
    assert_eq!(got[2].response, resp(200, "<title>2</title>"));
    assert_eq!(got[4].response.location.as_ref(), Some(&urls[0]));

    // Corrupt p2's response member's compressed bytes (after the warcinfo, members
    // alternate request, response).
    let mut bytes = std::fs::read(&path).unwrap();
    let starts = member_starts(&bytes);
    let victim = starts[6]; // the response record of p2
    for b in &mut bytes[victim + 20..victim + 40] {
        *b ^= 0x5a;
    }
    // And truncate the file inside the last member.
    bytes.truncate(bytes.len() - 30);
    std::fs::write(&path, &bytes).unwrap();
    let (got, issues) = read(&path, 1 << 20).unwrap();
    let urls_got: Vec<&str> = got.iter().map(|r| r.url.as_str()).collect();
    assert_eq!(urls_got, ["http://h.test/p0", "http://h.test/p1", "http://h.test/p3"]);
    assert_eq!(issues.len(), 2, "{issues:?}");
    assert_eq!(issues[0].offset, victim as u64);
    assert!(
        issues[0]
            .to_string()
            .starts_with(&format!("{}: at byte {victim}: corrupt gzip member", path.display())),
        "{}",
        issues[0]
    );
    assert_eq!(issues[1].offset, starts[10] as u64);
}

#[test]
fn plain_warc_chunked_and_gzipped_payloads() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("other-tool.warc");
    let gz_body = {
        let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
        e.write_all(b"<title>zipped</title>").unwrap();
        e.finish().unwrap()
    };
    let mut http1 =
        b"HTTP/1.1 200 OK\r\nContent-Type: text/html\r\nTransfer-Encoding: chunked\r\n\r\n"
            .to_vec();
    http1.extend_from_slice(b"7\r\n<title>\r\n8\r\nchunked<\r\n7\r\n/title>\r\n0\r\n\r\n");
    let mut http2 = format!("HTTP/1.1 200 OK\r\nContent-Type: text/html\r\nContent-Encoding: gzip\r\nContent-Length: {}\r\n\r\n", gz_body.len()).into_bytes();
    http2.extend_from_slice(&gz_body);
    let mut file = Vec::new();
    for (u, payload) in [("http://h.test/a", http1), ("http://h.test/b", http2)] {
        let record = RecordBuilder::default()
            .warc_type(RecordType::Response)
            .header(WarcHeader::TargetURI, u)
            .header(WarcHeader::ContentType, "application/http; msgtype=response")
            .body(payload)
            .build()
            .unwrap();
        let mut w = WarcWriter::new(io::BufWriter::new(Vec::new()));
        w.write(&record).unwrap();
        file.extend(w.into_inner().unwrap());
    }
    std::fs::write(&path, &file).unwrap();
    let (got, issues) = read(&path, 1 << 20).unwrap();
    assert!(issues.is_empty(), "{issues:?}");
    assert_eq!(&got[0].response.body[..], b"<title>chunked</title>");
    assert_eq!(&got[1].response.body[..], b"<title>zipped</title>");
}

#[test]
fn missing_file_is_an_error_of_its_kind() {
    // The caller names the file (perc replay: "cannot read PATH: ..."), once.
    let err = read(Path::new("/nonexistent/crawl.warc.gz"), 1).unwrap_err();
    assert_eq!(err.kind(), io::ErrorKind::NotFound, "{err}");
}
