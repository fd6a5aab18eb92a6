//! Recorded crawls: reading WARC response records for `perc replay`, and writing request and
//! response records for `perc crawl --warc-out`.
//!
//! A `.warc.gz` file is read one gzip member at a time (perc writes one member per record, as
//! wget and Heritrix do), so that a corrupt or truncated member is reported with the file and
//! the byte offset where it starts, and reading resumes at the next member: the good records
//! around a bad one still load. A plain `.warc` is read record by record the same way. Each
//! record is parsed by the `warc` crate; a response record's payload (an HTTP response) by
//! `httparse`, then de-chunked and decompressed as recorded, under the same body cap as a
//! live fetch.
//!
//! A `revisit` record (an unchanged refetch, written without its payload) reads as the
//! response it stands for, the payload taken from the record it refers to; `Recorder`
//! writes one when a URL's payload is the same as at its last capture in the file.
//!
//! Bounds: a record is inflated or read only up to the body cap plus [`HEAD_BYTES_MAX`]
//! twice (its WARC headers and its HTTP head); a larger one is skipped with an issue naming
//! file and offset, its gzip member inflated into nothing to find where the next one starts,
//! so memory stays at one capped record whatever the file holds.

use std::collections::HashMap;
use std::fs::File;
use std::io::{self, BufRead, BufReader, Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

use bytes::Bytes;
use url::Url;
use warc::{Record, RecordBuilder, RecordType, WarcHeader, WarcReader, WarcWriter};

use crate::fetch::Response;

/// The most bytes a record's WARC header block may have (and, separately, its HTTP head).
pub const HEAD_BYTES_MAX: u64 = 64 * 1024;

/// The largest record read: the body cap and two header allowances.
fn record_bytes_max(body_bytes_max: u64) -> u64 {
    body_bytes_max.saturating_add(2 * HEAD_BYTES_MAX)
}

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
fn original(members: &mut Members, offset: u64, body_bytes_max: u64) -> Result<Response, String> {
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
struct Members {
    reader: BufReader<File>,
    gz: bool,
}

/// What starts at an offset of a WARC file.
enum Member {
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
    fn open(path: &Path) -> io::Result<Members> {
        let file = File::open(path)?;
        let mut reader = BufReader::new(file);
        let head = reader.fill_buf()?;
        let gz = head.len() >= 2 && head[0] == 0x1f && head[1] == 0x8b;
        Ok(Members { reader, gz })
    }

    /// The record that starts at `offset`: `whole`, one of at most `cap` bytes (a larger
    /// one is `Oversize`); otherwise its first `cap` bytes. Memory stays at `cap`.
    fn at(&mut self, offset: u64, cap: u64, whole: bool) -> io::Result<Member> {
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
fn inflate_member(
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

fn oversize(cap: u64) -> String {
    format!(
        "record larger than {cap} bytes (crawl.body_bytes_max and {HEAD_BYTES_MAX} bytes each \
         for the WARC and HTTP heads): skipped"
    )
}

/// The position of the next `magic` at or after `from` (the reader is left there).
fn resync(reader: &mut BufReader<File>, from: u64, magic: &[u8]) -> io::Result<Option<u64>> {
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

struct Counting<'a, R> {
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
enum Parsed {
    Response { recorded: Recorded, id: String, digest: Option<String> },
    Revisit(Revisit),
    Other,
}

/// A revisit record: what it says about the response it stands for.
struct Revisit {
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
fn parse_record(bytes: &[u8], body_bytes_max: u64) -> Result<Parsed, String> {
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
struct Head {
    response: Response,
    len: usize,
    chunked: bool,
    encoding: Option<String>,
}

/// Parses an HTTP response head (the body, if any, follows at `len`).
fn parse_head(url: &Url, raw: &[u8]) -> Result<Head, String> {
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

fn capped(mut r: impl Read, max: u64) -> Result<Vec<u8>, String> {
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

fn dechunk(mut raw: &[u8]) -> Result<Vec<u8>, String> {
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

/// Writes request and response records, one gzip member each. Each member is built in
/// memory and written with one call, so that the file ends on a record boundary whenever
/// the process stops short of being killed mid-write.
///
/// Each run begins with a `warcinfo` record (software, format, robots policy) that every
/// later record names (`WARC-Warcinfo-ID`); every record carries `WARC-Block-Digest`, a
/// response also `WARC-Payload-Digest` (SHA-1 in base32, as other WARC tools write and
/// check them), and `WARC-Concurrent-To` links a response to its request.
///
/// A refetch whose payload is the same as the URL's last capture in this file (this run's,
/// or an earlier run's when appending) is a `revisit` record of the identical-payload-digest
/// profile, as Heritrix writes them: the HTTP head only, `WARC-Refers-To` the capture. A 304
/// (the answer to a conditional refetch) with a capture to refer to is a revisit of the
/// server-not-modified profile, which reads back as that capture.
pub struct Recorder {
    out: File,
    path: PathBuf,
    warcinfo: String,
    /// Each URL's last capture with a payload in the file.
    last: HashMap<String, Capture>,
}

/// The record that holds a payload, for the revisits that refer to it.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Capture {
    id: String,
    date: Option<String>,
    digest: String,
}

/// The profile of a revisit record whose payload is the one its original holds (WARC 1.0,
/// the version the records are written in).
const IDENTICAL_PAYLOAD: &str = "http://netpreserve.org/warc/1.0/revisit/identical-payload-digest";

/// The profile of a revisit record of a 304: the server said the capture it refers to is
/// still current.
const NOT_MODIFIED: &str = "http://netpreserve.org/warc/1.0/revisit/server-not-modified";

/// `sha1:` and the base32 SHA-1 of `bytes`.
fn digest(bytes: &[u8]) -> String {
    use sha1::Digest;
    format!("sha1:{}", data_encoding::BASE32.encode(&sha1::Sha1::digest(bytes)))
}

impl Recorder {
    /// A new WARC at `path`. An existing file is refused, unless `append` (then new records
    /// go after the ones it has); nothing already recorded is ever truncated.
    pub fn create(path: &Path, append: bool) -> io::Result<Recorder> {
        let mut options = File::options();
        if append {
            options.append(true).create(true);
        } else {
            options.write(true).create_new(true);
        }
        let file = options.open(path).map_err(|e| {
            let hint = if e.kind() == io::ErrorKind::AlreadyExists {
                " (it would be overwritten: give another file, or --append to add to it)"
            } else {
                ""
            };
            io::Error::new(e.kind(), format!("{}: {e}{hint}", path.display()))
        })?;
        let last = match append {
            true => captures(path)
                .map_err(|e| io::Error::new(e.kind(), format!("{}: {e}", path.display())))?,
            false => HashMap::new(),
        };
        let mut recorder =
            Recorder { out: file, path: path.to_path_buf(), warcinfo: String::new(), last };
        recorder.warcinfo = recorder.write_warcinfo()?.0;
        Ok(recorder)
    }

    /// The run's `warcinfo` record; its record id and date.
    fn write_warcinfo(&mut self) -> io::Result<(String, Option<String>)> {
        let fields = format!(
            "software: perc/{}\r\nformat: WARC File Format 1.0\r\nrobots: obey\r\n",
            env!("CARGO_PKG_VERSION")
        );
        let filename = self.path.file_name().map(|f| f.to_string_lossy().into_owned());
        let id = Record::<warc::BufferedBody>::generate_record_id();
        let mut record = RecordBuilder::default()
            .warc_type(RecordType::WarcInfo)
            .warc_id(id.clone())
            .header(WarcHeader::ContentType, "application/warc-fields")
            .header(WarcHeader::BlockDigest, digest(fields.as_bytes()));
        if let Some(name) = filename {
            record = record.header(WarcHeader::Filename, name);
        }
        self.write(record.body(fields.into_bytes()))
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Records one exchange: the status line and header fields as received, the payload as
    /// perc received it after transfer decoding, so replaying it gives the same bytes. The
    /// fields that described the encoding (`Content-Length`, `Content-Encoding`,
    /// `Transfer-Encoding`) are kept prefixed `X-Crawler-` (Common Crawl's convention) and a
    /// `Content-Length` of the stored payload ends the head. A payload the URL's last capture
    /// holds already is recorded as a revisit of it (the head only).
    pub fn record(&mut self, url: &Url, user_agent: &str, response: &Response) -> io::Result<()> {
        let request = format!(
            "GET {} HTTP/1.1\r\nHost: {}\r\nUser-Agent: {user_agent}\r\n\r\n",
            &url[url::Position::BeforePath..],
            url.authority()
        );
        let request_id = Record::<warc::BufferedBody>::generate_record_id();
        self.member(
            url,
            RecordBuilder::default()
                .warc_type(RecordType::Request)
                .warc_id(request_id.clone())
                .header(WarcHeader::ContentType, "application/http; msgtype=request"),
            request.into_bytes(),
            None,
        )?;
        let mut http = Vec::new();
        match &response.received {
            Some(head) => {
                let line =
                    format!("{} {} {}\r\n", head.version, response.status, reason(response.status));
                http.extend_from_slice(line.as_bytes());
                for (name, value) in &head.headers {
                    // The payload is stored decoded (de-chunked, decompressed): the fields
                    // that described its encoding are kept under another name, as Common
                    // Crawl does, and a Content-Length of the stored payload follows.
                    if matches!(
                        name.to_ascii_lowercase().as_str(),
                        "content-length" | "content-encoding" | "transfer-encoding"
                    ) {
                        http.extend_from_slice(b"X-Crawler-");
                    }
                    http.extend_from_slice(name.as_bytes());
                    http.extend_from_slice(b": ");
                    http.extend_from_slice(value);
                    http.extend_from_slice(b"\r\n");
                }
            }
            None => {
                // A response perc did not receive over HTTP: the head it implies.
                let mut head =
                    format!("HTTP/1.1 {} {}\r\n", response.status, reason(response.status));
                if let Some(ct) = &response.content_type {
                    match &response.charset {
                        Some(cs) => head.push_str(&format!("Content-Type: {ct}; charset={cs}\r\n")),
                        None => head.push_str(&format!("Content-Type: {ct}\r\n")),
                    }
                }
                if let Some(l) = &response.location {
                    head.push_str(&format!("Location: {l}\r\n"));
                }
                if let Some(r) = response.retry_after_s {
                    head.push_str(&format!("Retry-After: {r}\r\n"));
                }
                http.extend_from_slice(head.as_bytes());
            }
        }
        http.extend_from_slice(
            format!("Content-Length: {}\r\n\r\n", response.body.len()).as_bytes(),
        );
        let payload = digest(&response.body);
        let response_record = RecordBuilder::default()
            .header(WarcHeader::ContentType, "application/http; msgtype=response")
            .header(WarcHeader::ConcurrentTo, request_id);
        let previous = self.last.get(url.as_str()).cloned();
        // A 304 answers a conditional refetch: the last capture stands (server-not-modified).
        let not_modified = response.status == 304;
        if let Some(capture) =
            previous.filter(|c| not_modified || (c.digest == payload && !response.body.is_empty()))
        {
            let profile = if not_modified { NOT_MODIFIED } else { IDENTICAL_PAYLOAD };
            let mut revisit = response_record
                .warc_type(RecordType::Revisit)
                .header(WarcHeader::Profile, profile)
                .header(WarcHeader::RefersTo, capture.id.clone())
                .header(WarcHeader::Unknown("WARC-Refers-To-Target-URI".into()), url.as_str());
            if let Some(date) = &capture.date {
                revisit =
                    revisit.header(WarcHeader::Unknown("WARC-Refers-To-Date".into()), date.clone());
            }
            let digest = if not_modified { None } else { Some(payload) };
            self.member(url, revisit, http, digest)?;
            return Ok(());
        }
        let mut block = http;
        block.extend_from_slice(&response.body);
        let (id, date) = self.member(
            url,
            response_record.warc_type(RecordType::Response),
            block,
            Some(payload.clone()),
        )?;
        if !response.body.is_empty() {
            self.last.insert(url.to_string(), Capture { id, date, digest: payload });
        }
        Ok(())
    }

    /// One record about `url` whose block is `block`; `payload_digest`, the digest of the
    /// HTTP body it holds or stands for. Its record id and date.
    fn member(
        &mut self,
        url: &Url,
        record: RecordBuilder,
        block: Vec<u8>,
        payload_digest: Option<String>,
    ) -> io::Result<(String, Option<String>)> {
        let mut record = record
            .header(WarcHeader::TargetURI, url.as_str())
            .header(WarcHeader::WarcInfoID, self.warcinfo.clone())
            .header(WarcHeader::BlockDigest, digest(&block));
        if let Some(payload) = payload_digest {
            record = record.header(WarcHeader::PayloadDigest, payload);
        }
        self.write(record.body(block))
    }

    /// Writes `record` as one gzip member, with one call; its record id and date.
    fn write(&mut self, record: RecordBuilder) -> io::Result<(String, Option<String>)> {
        let record = record.build().map_err(|e| io::Error::other(e.to_string()))?;
        let mut plain = WarcWriter::new(io::BufWriter::new(Vec::new()));
        plain.write(&record)?;
        let plain = plain.into_inner().map_err(|e| io::Error::other(e.to_string()))?;
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
        gz.write_all(&plain)?;
        self.out.write_all(&gz.finish()?)?;
        let date = record.header(WarcHeader::Date).map(|d| d.into_owned());
        Ok((record.warc_id().to_string(), date))
    }

    /// Makes every record written so far durable.
    pub fn finish(self) -> io::Result<()> {
        self.out.sync_all()
    }
}

/// The last capture with a payload of each URL in the WARC at `path` (an empty map for an
/// empty file): a response record, or the capture a revisit refers to. Reads each record's
/// WARC head only; a member that does not inflate is passed over (the reader reports it).
fn captures(path: &Path) -> io::Result<HashMap<String, Capture>> {
    let mut last = HashMap::new();
    let mut members = Members::open(path)?;
    let mut offset = 0;
    loop {
        match members.at(offset, HEAD_BYTES_MAX + 4, false)? {
            Member::End => break,
            Member::Record { bytes, next } => {
                offset = next;
                if let Some((url, capture)) = capture(&bytes) {
                    last.insert(url, capture);
                }
            }
            Member::Oversize { next } => offset = next,
            Member::Corrupt { next: Some(next), .. } => offset = next,
            Member::Corrupt { next: None, .. } => break,
        }
    }
    Ok(last)
}

/// The URL and capture a record's WARC head names, if it is a response or revisit with a
/// payload digest.
fn capture(head: &[u8]) -> Option<(String, Capture)> {
    let (_, (_, fields, _)) = warc::parser::headers(head).ok()?;
    let get = |name: &str| {
        fields
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .and_then(|(_, v)| std::str::from_utf8(v).ok())
            .map(|v| v.trim().to_string())
    };
    let uri = get("WARC-Target-URI")?;
    let url = crate::urls::normalize(uri.trim_matches(|c| c == '<' || c == '>')).ok()?;
    let digest = get("WARC-Payload-Digest")?;
    let capture = match get("WARC-Type")?.as_str() {
        "response" => Capture { id: get("WARC-Record-ID")?, date: get("WARC-Date"), digest },
        "revisit" => {
            Capture { id: get("WARC-Refers-To")?, date: get("WARC-Refers-To-Date"), digest }
        }
        _ => return None,
    };
    Some((url.to_string(), capture))
}

/// The status line's reason phrase (empty for a code HTTP does not name).
fn reason(status: u16) -> &'static str {
    http::StatusCode::from_u16(status).ok().and_then(|s| s.canonical_reason()).unwrap_or("")
}

#[cfg(test)]
mod tests {
    use super::*;

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
        let head =
            "HTTP/1.1 200 OK\r\nserver: test/1\r\ncontent-type: text/html; charset=utf-8\r\n\
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
        bytes
            .windows(3)
            .enumerate()
            .filter(|(_, w)| *w == b"\x1f\x8b\x08")
            .map(|(i, _)| i)
            .collect()
    }

    /// The records of a gzipped WARC, parsed, with their block digests checked.
    fn records_of(path: &Path) -> Vec<Record<warc::BufferedBody>> {
        let mut raw = Vec::new();
        flate2::read::MultiGzDecoder::new(File::open(path).unwrap()).read_to_end(&mut raw).unwrap();
        let records: Vec<_> =
            WarcReader::new(&raw[..]).iter_records().map(|r| r.unwrap()).collect();
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
        let (a, b) =
            (Url::parse("http://h.test/a").unwrap(), Url::parse("http://h.test/b").unwrap());
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
        let seen: Vec<(&str, u16, &[u8])> = got
            .iter()
            .map(|r| (r.url.path(), r.response.status, r.response.body.as_ref()))
            .collect();
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
                (
                    WarcHeader::Profile,
                    "http://netpreserve.org/warc/1.1/revisit/server-not-modified",
                ),
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
}
