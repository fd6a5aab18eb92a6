//! `perc serve` against hostile clients and sites: a query built to overflow the parser's
//! stack, slow and idle sockets, a flood of connections, a seed whose host never answers.
//! Each answer is a clear refusal or a closed socket; the server goes on answering everyone
//! else.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

mod common;

use common::server::{q, Server};
use common::{root, seeds, Site};

/// Whether the server closed `socket` (a read finds the end) within `within`.
fn closed_within(socket: &mut TcpStream, within: Duration) -> bool {
    socket.set_read_timeout(Some(within)).unwrap();
    let mut buf = [0u8; 4096];
    let deadline = Instant::now() + within;
    loop {
        match socket.read(&mut buf) {
            Ok(0) => return true,
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => return true,
            Err(_) => return false,
        }
        if Instant::now() >= deadline {
            return false;
        }
    }
}

/// Whether `socket` is still open: what it holds is read, and then the read would wait.
fn still_open(socket: &mut TcpStream) -> bool {
    socket.set_nonblocking(true).unwrap();
    let mut buf = [0u8; 4096];
    loop {
        match socket.read(&mut buf) {
            Ok(0) => return false,
            Ok(_) => {}
            Err(e) => return e.kind() == std::io::ErrorKind::WouldBlock,
        }
    }
}

fn connect(server: &Server) -> TcpStream {
    TcpStream::connect(server.base.trim_start_matches("http://")).unwrap()
}

#[test]
fn hostile_queries_and_sockets_get_refusals_and_the_server_stays_up() {
    let tmp = tempfile::tempdir().unwrap();
    let site = Site::start(&root().join("fixtures/sites/demo"));
    let s = seeds(tmp.path(), &[site.base()]);
    let server = Server::start(
        &tmp.path().join("data"),
        &["--set", "serve.header_timeout_ms=500", "--seeds", s.to_str().unwrap()],
    );
    server.until("the demo indexed", |s| s["pages"] == 17 && s["search"]["caught_up"] == true);

    // Queries that overflowed an API thread's stack and ended the process: refused, 400.
    for (query, says) in [
        ("(".repeat(800), "query_nesting_max"),
        ("NOT ".repeat(200), "query_nesting_max"),
        ("+(".repeat(300), "query_nesting_max"),
        ("NOT ".repeat(3000), "query_bytes_max"),
    ] {
        server.fails(&format!("/v1/search?q={}", q(&query)), 400, says);
    }
    assert_eq!(server.get("/v1/search?q=widget").0, 200, "the server is up");

    // A parameter that is not UTF-8 is refused, not mended into another URL.
    server.fails("/v1/canonical?url=http://h.test/%FF", 400, "query parameter url is not UTF-8");
    // A page that rebinds its name to 127.0.0.1 cannot read the API: its Host is refused.
    let mut rebound = connect(&server);
    rebound.write_all(b"GET /v1/status HTTP/1.1\r\nHost: evil.example\r\n\r\n").unwrap();
    let mut head = [0u8; 12];
    rebound.read_exact(&mut head).unwrap();
    assert_eq!(&head, b"HTTP/1.1 421");
    // The scheme of Authorization is case-insensitive.
    let token = std::fs::read_to_string(tmp.path().join("data/serve.token")).unwrap();
    let r = server
        .client
        .post(format!("{}/v1/refetch", server.base))
        .header("Authorization", format!("bearer {}", token.trim()))
        .body(r#"{"urls": []}"#)
        .send()
        .unwrap();
    assert_eq!(r.status().as_u16(), 400, "authorized, then the body is refused: {:?}", r.text());

    // Slow and idle sockets are closed after serve.header_timeout_ms, not kept for ever.
    let mut slow: Vec<TcpStream> = (0..20)
        .map(|_| {
            let mut socket = connect(&server);
            socket.write_all(b"GET /v1/status HTTP/1.1\r\nHost: 127.0.0.1\r\n").unwrap();
            socket
        })
        .collect();
    let mut silent = connect(&server);
    let mut idle = connect(&server);
    idle.write_all(b"GET /v1/status HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n").unwrap();
    let mut head = [0u8; 12];
    idle.read_exact(&mut head).unwrap();
    assert_eq!(&head, b"HTTP/1.1 200", "a keep-alive answer first");
    let limit = Duration::from_secs(60);
    for socket in slow.iter_mut().chain([&mut silent, &mut idle]) {
        assert!(closed_within(socket, limit), "a socket left open past the header timeout");
    }
    assert_eq!(server.get("/v1/status").0, 200);
    assert_eq!(server.terminate(), Some(0));
}

/// A token a guess finds is no guard for a server beyond loopback.
#[test]
fn a_short_token_beyond_loopback_is_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let out = common::perc(
        &tmp.path().join("data"),
        &["--set", "serve.token=x", "serve", "--listen", "0.0.0.0:0"],
    );
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("serve.token is too short") && !err.contains("=x"), "{err}");
    assert!(!tmp.path().join("data").exists(), "nothing was created");
}

#[test]
fn connections_beyond_the_cap_are_closed_at_once_and_the_rest_are_served() {
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("data");
    common::ok(&common::perc(&data, &["replay", root().join("fixtures/crawls").to_str().unwrap()]));
    let server = Server::start(
        &data,
        &["--set", "serve.connections_max=8", "--set", "serve.header_timeout_ms=120000"],
    );
    let base = server.base.clone();
    // Eight keep-alive connections fill the cap: each is answered once (so its slot is known
    // to be taken), then idles.
    let mut held: Vec<TcpStream> = (0..8)
        .map(|_| {
            let mut socket = connect(&server);
            socket.write_all(b"GET /v1/status HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n").unwrap();
            let mut head = [0u8; 12];
            socket.read_exact(&mut head).unwrap();
            assert_eq!(&head, b"HTTP/1.1 200");
            socket
        })
        .collect();
    // One more is closed as soon as it is accepted, while the eight stay open.
    let mut extra = connect(&server);
    extra.write_all(b"GET /v1/status HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n").unwrap();
    assert!(closed_within(&mut extra, Duration::from_secs(60)), "the ninth was served");
    for socket in &mut held {
        assert!(still_open(socket), "a held connection was closed");
    }
    // Slots given back are taken again.
    drop(held);
    let fresh = reqwest::blocking::Client::new();
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if let Ok(r) = fresh.get(format!("{base}/v1/status")).send() {
            if r.status() == 200 {
                break;
            }
        }
        assert!(Instant::now() < deadline, "no answer after the slots were given back");
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(server.terminate(), Some(0));
}

/// A host that accepts connections and never answers: robots.txt and the sitemaps of a
/// seed there take every timeout and retry to give up on. Adding such a seed, at startup or
/// by `POST /v1/seeds`, answers at once; the sitemaps are read in the background.
#[test]
fn seeds_on_a_host_that_never_answers_are_taken_at_once() {
    let tmp = tempfile::tempdir().unwrap();
    let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let seed = format!("http://{}/", silent.local_addr().unwrap());
    let s = seeds(tmp.path(), std::slice::from_ref(&seed));
    let started = Instant::now();
    let server = Server::start(
        &tmp.path().join("data"),
        &[
            "--set",
            "crawl.total_timeout_ms=30000",
            "--set",
            "serve.request_timeout_ms=3000",
            "--seeds",
            s.to_str().unwrap(),
        ],
    );
    let status = server.json("/v1/status");
    // Reading robots.txt there takes three attempts of 30 s: the server answered long before.
    assert!(started.elapsed() < Duration::from_secs(30), "{:?}", started.elapsed());
    assert!(status["pending"].as_u64() >= Some(1), "the seed waits to be fetched: {status}");
    let token = std::fs::read_to_string(tmp.path().join("data/serve.token")).unwrap();
    let other = format!("http://{}/other/", silent.local_addr().unwrap());
    let (code, body) = server.post(
        "/v1/seeds",
        Some(token.trim()),
        &serde_json::json!({ "seeds": [other] }).to_string(),
    );
    assert_eq!(code, 202, "{body}");
    // A stop abandons the fetch that waits on the silent host rather than wait it out.
    let stopping = Instant::now();
    assert_eq!(server.terminate(), Some(0));
    assert!(stopping.elapsed() < Duration::from_secs(30), "{:?}", stopping.elapsed());
    drop(silent);
}
