//! Reading WARC files: one gzip member (or plain record) at a time, each response record
//! parsed into a [`Response`], revisits resolved against the records they refer to, and a
//! bad record reported as an issue while the rest read on.

use std::collections::HashMap;
use std::fs::File;
use std::io::{self, BufRead, BufReader, Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};

use bytes::Bytes;
use url::Url;
use warc::{RecordType, WarcHeader, WarcReader};

use crate::fetch::Response;

use super::{record_bytes_max, HEAD_BYTES_MAX};

/// A problem with one record (or with the file): where it is, and what is wrong.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{}: at byte {offset}: {message}", file.display())]
pub struct WarcIssue {
    pub file: PathBuf,
    pub offset: u64,
    pub message: String,
}

/// One recorded response.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Recorded {
    pub url: Url,
    pub response: Response,
}

/// Reads every response record of `path`: the good ones, and an issue for each bad one.
/// Only a file that cannot be opened at all is an error. Holds the whole file's records in
/// memory: [`read_each`] streams.
pub fn read(path: &Path, body_bytes_max: u64) -> io::Result<(Vec<Recorded>, Vec<WarcIssue>)> {
    let mut out = Vec::new();
    let issues = read_each(path, body_bytes_max, |r| out.push(r))?;
    Ok((out, issues))
}

/// The WARC files `paths` name: a file as it is, a directory as the `.warc` and `.warc.gz`
/// files directly in it, in name order. A directory with none is an error that names it.
pub fn expand(paths: &[PathBuf]) -> io::Result<Vec<PathBuf>> {
    let mut out = Vec::new();
    for p in paths {
        if !p.is_dir() {
            out.push(p.clone());
            continue;
        }
        let mut found: Vec<PathBuf> = std::fs::read_dir(p)
            .map_err(|e| io::Error::new(e.kind(), format!("{}: {e}", p.display())))?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|f| {
                let name = f.file_name().map(|n| n.to_string_lossy().into_owned());
                f.is_file() && name.is_some_and(|n| n.ends_with(".warc") || n.ends_with(".warc.gz"))
            })
            .collect();
        if found.is_empty() {
            return Err(io::Error::new(
                io::ErrorKind::NotFound,
                format!("{} holds no .warc or .warc.gz file", p.display()),
            ));
        }
        found.sort();
        out.extend(found);
    }
    Ok(out)
}

/// Hands each good response record of `path` to `each` as it is read, one record in memory
/// at a time; returns an issue for each bad one.
///
/// A `revisit` record (an unchanged refetch, recorded without its payload) is handed on as
/// the response it stands for: its own HTTP head with the payload of the earlier record it
/// refers to (by `WARC-Refers-To`, else by `WARC-Payload-Digest`), read again from this
/// file; under the server-not-modified profile, or with no HTTP head, the earlier response
/// whole. A revisit whose original is not in the file is an issue. The reader keeps where
/// each response record starts (two short keys a record), not the records.
pub fn read_each(
    path: &Path,
    body_bytes_max: u64,
    mut each: impl FnMut(Recorded),
) -> io::Result<Vec<WarcIssue>> {
    let mut members = Members::open(path)?;
    let mut issues = Vec::new();
    let issue =
        |offset: u64, message: String| WarcIssue { file: path.to_path_buf(), offset, message };
    let cap = record_bytes_max(body_bytes_max);
    // Where each response record starts, by its record id and by its payload digest.
    let mut originals: HashMap<String, u64> = HashMap::new();
    let mut offset = 0u64;
    loop {
        let (at, bytes) = match members.at(offset, cap, true)? {
            Member::End => break,
            Member::Record { bytes, next } => (std::mem::replace(&mut offset, next), bytes),
            Member::Oversize { next } => {
                issues.push(issue(offset, oversize(cap)));
                offset = next;
                continue;
            }
            Member::Corrupt { message, next } => {
                issues.push(issue(offset, message));
                match next {
                    Some(next) => offset = next,
                    None => break,
                }
                continue;
            }
        };
        match parse_record(&bytes, body_bytes_max) {
            Ok(Parsed::Response { recorded, id, digest }) => {
                originals.insert(id, at);
                if let Some(digest) = digest {
                    originals.insert(digest, at);
                }
                each(recorded);
            }
            Ok(Parsed::Revisit(revisit)) => {
                let key = revisit.refers_to.as_ref().or(revisit.digest.as_ref());
                let found = [&revisit.refers_to, &revisit.digest]
                    .into_iter()
                    .flatten()
                    .find_map(|k| originals.get(k).copied());
                let Some(from) = found else {
                    let what = key.map_or("no WARC-Refers-To or payload digest", |k| k.as_str());
                    issues.push(issue(
                        at,
                        format!(
                            "revisit record of {} refers to a record not in this file ({what}): \
                             skipped",
                            revisit.url
                        ),
                    ));
                    continue;
                };
                match original(&mut members, from, body_bytes_max)
                    .and_then(|o| revisit.resolve(o, body_bytes_max))
                {
                    Ok(recorded) => each(recorded),
                    Err(message) => issues.push(issue(at, message)),
                }
            }
            Ok(Parsed::Other) => {}
            Err(message) => issues.push(issue(at, message)),
        }
    }
    Ok(issues)
}

/// The response record at `offset`, which read well before.
pub(super) fn original(
    members: &mut Members,
    offset: u64,
    body_bytes_max: u64,
) -> Result<Response, String> {
    let unreadable = |e: String| format!("the revisited record at byte {offset}: {e}");
    match members.at(offset, record_bytes_max(body_bytes_max), true) {
        Ok(Member::Record { bytes, .. }) => match parse_record(&bytes, body_bytes_max) {
            Ok(Parsed::Response { recorded, .. }) => Ok(recorded.response),
            Ok(_) => Err(unreadable("not a response".into())),
            Err(e) => Err(unreadable(e)),
        },
        Ok(_) => Err(unreadable("no longer reads".into())),
        Err(e) => Err(unreadable(e.to_string())),
    }
}

/// The records of one WARC file, read from any offset: gzip members, or plain records.
pub(super) struct Members {
    reader: BufReader<File>,
    gz: bool,
}

/// What starts at an offset of a WARC file.
pub(super) enum Member {
    End,
    /// The record (or, when only its start was asked for, its first bytes), and where the
    /// next one starts.
    Record {
        bytes: Vec<u8>,
        next: u64,
    },
    /// A record larger than asked for, skipped.
    Oversize {
        next: u64,
    },
    /// A gzip member that does not inflate; where the next one seems to start.
    Corrupt {
        message: String,
        next: Option<u64>,
    },
}

impl Members {
    /// The members of the file at `path` (an error does not name it: callers say what they
    /// were reading).
    pub(super) fn open(path: &Path) -> io::Result<Members> {
        let file = File::open(path)?;
        let mut reader = BufReader::new(file);
        let head = reader.fill_buf()?;
        let gz = head.len() >= 2 && head[0] == 0x1f && head[1] == 0x8b;
        Ok(Members { reader, gz })
    }

    /// The record that starts at `offset`: `whole`, one of at most `cap` bytes (a larger
    /// one is `Oversize`); otherwise its first `cap` bytes. Memory stays at `cap`.
    pub(super) fn at(&mut self, offset: u64, cap: u64, whole: bool) -> io::Result<Member> {
        self.reader.seek(SeekFrom::Start(offset))?;
        if self.reader.fill_buf()?.is_empty() {
            return Ok(Member::End);
        }
        let mut bytes = Vec::new();
        if self.gz {
            let mut counting = Counting { inner: &mut self.reader, count: 0 };
            return Ok(match inflate_member(&mut counting, cap, whole, &mut bytes) {
                Ok(true) => Member::Record { bytes, next: offset + counting.count },
                Ok(false) => Member::Oversize { next: offset + counting.count },
                Err(e) => Member::Corrupt {
                    message: format!("corrupt gzip member: {e}"),
                    next: resync(&mut self.reader, offset + 1, b"\x1f\x8b\x08")?,
                },
            });
        }
        // A plain WARC: the record runs to the next "WARC/" at a line start, or the end.
        let end = match resync(&mut self.reader, offset + 1, b"\r\nWARC/")? {
            Some(p) => p + 2,
            None => self.reader.seek(SeekFrom::End(0))?,
        };
        if whole && end - offset > cap {
            return Ok(Member::Oversize { next: end });
        }
        self.reader.seek(SeekFrom::Start(offset))?;
        self.reader.by_ref().take((end - offset).min(cap)).read_to_end(&mut bytes)?;
        Ok(Member::Record { bytes, next: end })
    }
}

/// Inflates one gzip member into `record`, keeping at most `cap` bytes. When it holds more,
/// the rest is inflated into nothing (so the reader ends after the member) and: `whole`,
/// `record` is emptied and the answer is `Ok(false)`; otherwise `record` keeps the first
/// `cap` bytes.
pub(super) fn inflate_member(
    reader: impl BufRead,
    cap: u64,
    whole: bool,
    record: &mut Vec<u8>,
) -> io::Result<bool> {
    let mut member = flate2::bufread::GzDecoder::new(reader);
    member.by_ref().take(cap.saturating_add(1)).read_to_end(record)?;
    if record.len() as u64 <= cap {
        return Ok(true);
    }
    if whole {
        record.clear();
        record.shrink_to_fit();
    } else {
        record.truncate(cap as usize);
    }
    io::copy(&mut member, &mut io::sink())?;
    Ok(!whole)
}

pub(super) fn oversize(cap: u64) -> String {
    format!(
        "record larger than {cap} bytes (crawl.body_bytes_max and {HEAD_BYTES_MAX} bytes each \
         for the WARC and HTTP heads): skipped"
    )
}

/// The position of the next `magic` at or after `from` (the reader is left there).
pub(super) fn resync(
    reader: &mut BufReader<File>,
    from: u64,
    magic: &[u8],
) -> io::Result<Option<u64>> {
    reader.seek(SeekFrom::Start(from))?;
    let mut pos = from;
    let mut window: Vec<u8> = Vec::new();
    loop {
        let buf = reader.fill_buf()?;
        if buf.is_empty() {
            return Ok(None);
        }
        let n = buf.len();
        window.extend_from_slice(buf);
        if let Some(i) = window.windows(magic.len()).position(|w| w == magic) {
            let at = pos + i as u64;
            reader.seek(SeekFrom::Start(at))?;
            return Ok(Some(at));
        }
        reader.consume(n);
        // Keep a tail in case the magic straddles two reads.
        let keep = magic.len() - 1;
        let drop = window.len().saturating_sub(keep);
        window.drain(..drop);
        pos += drop as u64;
    }
}

pub(super) struct Counting<'a, R> {
    inner: &'a mut R,
    count: u64,
}

impl<R: BufRead> Read for Counting<'_, R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.count += n as u64;
        Ok(n)
    }
}

impl<R: BufRead> BufRead for Counting<'_, R> {
    fn fill_buf(&mut self) -> io::Result<&[u8]> {
        self.inner.fill_buf()
    }
    fn consume(&mut self, amt: usize) {
        self.count += amt as u64;
        self.inner.consume(amt);
    }
}

/// What one record is to a reader of responses.
pub(super) enum Parsed {
    Response { recorded: Recorded, id: String, digest: Option<String> },
    Revisit(Revisit),
    Other,
}

/// A revisit record: what it says about the response it stands for.
pub(super) struct Revisit {
    url: Url,
    /// The HTTP head recorded (may be empty).
    head: Vec<u8>,
    refers_to: Option<String>,
    digest: Option<String>,
    /// The server-not-modified profile: the head is a 304's, the earlier response stands.
    not_modified: bool,
}

impl Revisit {
    /// The response this revisit stands for, given the one it refers to.
    fn resolve(self, original: Response, body_bytes_max: u64) -> Result<Recorded, String> {
        let response = if self.head.is_empty() || self.not_modified {
            original
        } else {
            let head = parse_head(&self.url, &self.head)?;
            Response { body: original.body, ..head.response }
        };
        if response.body.len() as u64 > body_bytes_max {
            return Err(format!("body exceeds the {body_bytes_max}-byte limit"));
        }
        Ok(Recorded { url: self.url, response })
    }
}

/// A response or revisit record's URL and what it holds; `Other` for other record types.
pub(super) fn parse_record(bytes: &[u8], body_bytes_max: u64) -> Result<Parsed, String> {
    let head_window = &bytes[..bytes.len().min(HEAD_BYTES_MAX as usize + 4)];
    if !head_window.windows(4).any(|w| w == b"\r\n\r\n") {
        return Err(format!(
            "WARC header block longer than {HEAD_BYTES_MAX} bytes, or unterminated"
        ));
    }
    let record = WarcReader::new(bytes)
        .iter_records()
        .next()
        .ok_or("empty record")?
        .map_err(|e| format!("malformed WARC record: {e}"))?;
    let revisit = match record.warc_type() {
        RecordType::Response => false,
        RecordType::Revisit => true,
        _ => return Ok(Parsed::Other),
    };
    let uri = record.header(WarcHeader::TargetURI).ok_or("record without WARC-Target-URI")?;
    let url = crate::urls::normalize(uri.trim_matches(|c| c == '<' || c == '>'))
        .map_err(|e| format!("WARC-Target-URI: {e}"))?;
    let declared = record.content_length();
    let body = record.body();
    if (body.len() as u64) < declared {
        return Err(format!("truncated record: {} of {declared} payload bytes", body.len()));
    }
    let digest = record.header(WarcHeader::PayloadDigest).map(|d| d.trim().to_string());
    if revisit {
        let profile = record.header(WarcHeader::Profile).unwrap_or_default();
        return Ok(Parsed::Revisit(Revisit {
            url,
            head: body.to_vec(),
            refers_to: record.header(WarcHeader::RefersTo).map(|r| r.trim().to_string()),
            digest,
            not_modified: profile.contains("server-not-modified"),
        }));
    }
    let response = parse_http(&url, body, body_bytes_max)?;
    let id = record.warc_id().to_string();
    Ok(Parsed::Response { recorded: Recorded { url, response }, id, digest })
}

/// A parsed HTTP head: the response it describes, without its body yet.
pub(super) struct Head {
    response: Response,
    len: usize,
    chunked: bool,
    encoding: Option<String>,
}

/// Parses an HTTP response head (the body, if any, follows at `len`).
pub(super) fn parse_head(url: &Url, raw: &[u8]) -> Result<Head, String> {
    let mut headers = [httparse::EMPTY_HEADER; 128];
    let mut resp = httparse::Response::new(&mut headers);
    let len = match resp.parse(raw).map_err(|e| format!("malformed HTTP response: {e}"))? {
        httparse::Status::Complete(n) => n,
        httparse::Status::Partial => return Err("truncated HTTP response head".into()),
    };
    let status = resp.code.ok_or("HTTP response without status")?;
    let get = |name: &str| {
        resp.headers
            .iter()
            .find(|h| h.name.eq_ignore_ascii_case(name))
            .map(|h| String::from_utf8_lossy(h.value).trim().to_string())
    };
    let (content_type, charset) = crate::fetch::split_content_type(get("content-type"));
    Ok(Head {
        response: Response {
            status,
            content_type,
            charset,
            location: get("location").and_then(|l| url.join(&l).ok()),
            retry_after_s: get("retry-after")
                .and_then(|r| crate::fetch::retry_after_seconds(&r, std::time::SystemTime::now())),
            body: Bytes::new(),
            received: None,
        },
        len,
        chunked: get("transfer-encoding")
            .is_some_and(|t| t.to_ascii_lowercase().contains("chunked")),
        encoding: get("content-encoding").map(|c| c.to_ascii_lowercase()),
    })
}

/// Parses a recorded HTTP response (head, then the body as it was sent).
pub fn parse_http(url: &Url, raw: &[u8], body_bytes_max: u64) -> Result<Response, String> {
    let head = parse_head(url, raw)?;
    let mut body = raw[head.len..].to_vec();
    if head.chunked {
        body = dechunk(&body)?;
    }
    match head.encoding.as_deref() {
        Some("gzip") | Some("x-gzip") => {
            body = capped(flate2::read::MultiGzDecoder::new(&body[..]), body_bytes_max)?;
        }
        Some("deflate") => {
            body = capped(flate2::read::ZlibDecoder::new(&body[..]), body_bytes_max)?
        }
        Some("identity") | None => {}
        Some(other) => return Err(format!("unsupported recorded Content-Encoding {other:?}")),
    }
    if body.len() as u64 > body_bytes_max {
        return Err(format!("body exceeds the {body_bytes_max}-byte limit"));
    }
    Ok(Response { body: Bytes::from(body), ..head.response })
}

pub(super) fn capped(mut r: impl Read, max: u64) -> Result<Vec<u8>, String> {
    let mut out = Vec::new();
    let n = r
        .by_ref()
        .take(max + 1)
        .read_to_end(&mut out)
        .map_err(|e| format!("corrupt compressed body: {e}"))?;
    if n as u64 > max {
        return Err(format!("body exceeds the {max}-byte limit"));
    }
    Ok(out)
}

pub(super) fn dechunk(mut raw: &[u8]) -> Result<Vec<u8>, String> {
    let mut out = Vec::new();
    loop {
        let line_end = raw.windows(2).position(|w| w == b"\r\n").ok_or("truncated chunked body")?;
        let size_text = std::str::from_utf8(&raw[..line_end]).map_err(|_| "bad chunk size")?;
        let size = usize::from_str_radix(size_text.split(';').next().unwrap_or("").trim(), 16)
            .map_err(|_| format!("bad chunk size {size_text:?}"))?;
        raw = &raw[line_end + 2..];
        if size == 0 {
            return Ok(out);
        }
        if raw.len() < size + 2 {
            return Err("truncated chunked body".into());
        }
        out.extend_from_slice(&raw[..size]);
        raw = &raw[size + 2..];
    }
}
