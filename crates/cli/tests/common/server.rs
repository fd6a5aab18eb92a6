//! A `perc serve` child process for the tests that need one: started on a free loopback
//! port, asked over HTTP, stopped with SIGTERM or SIGKILL.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A `perc serve` child process and where it listens.
pub struct Server {
    child: Child,
    pub base: String,
    pub client: reqwest::blocking::Client,
    /// Where its stderr goes (beside the store, appended to by each server on it): printed
    /// when it exits other than 0, for the test's failure to show.
    log: std::path::PathBuf,
}

impl Server {
    /// Starts `perc serve` on `data` with `args`, on a free loopback port; returns once it
    /// says where it listens.
    pub fn start(data: &Path, args: &[&str]) -> Server {
        let serve = ["--set", "serve.body_bytes_max=4096", "serve", "--listen", "127.0.0.1:0"];
        let log = data.with_extension("serve.log");
        let stderr = std::fs::OpenOptions::new().create(true).append(true).open(&log).unwrap();
        let mut child = super::command(data, &[&serve[..], args].concat())
            .stdout(Stdio::piped())
            .stderr(stderr)
            .spawn()
            .expect("run perc serve");
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap()).read_line(&mut line).unwrap();
        let base = line
            .trim()
            .strip_prefix("perc serve: listening on ")
            .unwrap_or_else(|| panic!("perc serve said {line:?}"))
            .to_string();
        let client =
            reqwest::blocking::Client::builder().timeout(Duration::from_secs(30)).build().unwrap();
        Server { child, base, client, log }
    }

    /// The nice value of each of the server's threads, by thread name (Linux's
    /// `/proc/PID/task/*/stat`), sorted.
    pub fn thread_nice(&self) -> Vec<(String, i32)> {
        let tasks = format!("/proc/{}/task", self.child.id());
        let mut threads: Vec<(String, i32)> = std::fs::read_dir(&tasks)
            .unwrap()
            .filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("stat")).ok())
            .map(|stat| {
                // "tid (comm) state ppid ...": nice is the 19th field, the 17th after comm.
                let (head, rest) = stat.rsplit_once(')').unwrap();
                let name = head.split_once('(').unwrap().1.to_string();
                let nice = rest.split_whitespace().nth(16).unwrap().parse().unwrap();
                (name, nice)
            })
            .collect();
        threads.sort();
        threads
    }

    /// GET `path`: the status and the body.
    pub fn get(&self, path: &str) -> (u16, String) {
        let r = self.client.get(format!("{}{path}", self.base)).send().unwrap();
        (r.status().as_u16(), r.text().unwrap())
    }

    /// GET `path`, which must answer 200 with JSON.
    pub fn json(&self, path: &str) -> serde_json::Value {
        let (status, body) = self.get(path);
        assert_eq!(status, 200, "{path}: {body}");
        serde_json::from_str(&body).unwrap_or_else(|e| panic!("{path}: {e}: {body}"))
    }

    /// GET `path`, which must fail with `status` and a JSON error containing `says`.
    pub fn fails(&self, path: &str, status: u16, says: &str) {
        refused(path, self.get(path), status, says);
    }

    /// Polls `/v1/status` until `done` says so (or fails after a minute).
    pub fn until(
        &self,
        what: &str,
        done: impl Fn(&serde_json::Value) -> bool,
    ) -> serde_json::Value {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let status = self.json("/v1/status");
            if done(&status) {
                return status;
            }
            assert!(Instant::now() < deadline, "waited a minute for {what}: {status}");
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// POST `body` to `path` with `token` (none: no Authorization): the status and the body.
    pub fn post(&self, path: &str, token: Option<&str>, body: &str) -> (u16, String) {
        let mut r = self.client.post(format!("{}{path}", self.base)).body(body.to_string());
        if let Some(t) = token {
            r = r.bearer_auth(t);
        }
        let r = r.send().unwrap();
        (r.status().as_u16(), r.text().unwrap())
    }

    /// POST that must fail with `status` and a JSON error containing `says`.
    pub fn post_fails(&self, path: &str, token: Option<&str>, body: &str, status: u16, says: &str) {
        refused(&format!("POST {path} {body}"), self.post(path, token, body), status, says);
    }

    /// The URLs `/v1/search` answers for `query` (up to 20), with `base` made "/".
    pub fn search(&self, query: &str, base: &str) -> Vec<String> {
        let v = self.json(&format!("/v1/search?q={}&limit=20", q(query)));
        let hits = v["hits"].as_array().unwrap_or_else(|| panic!("{v}"));
        hits.iter().map(|h| h["url"].as_str().unwrap().replace(base, "/")).collect()
    }

    /// Polls `/v1/search` for `query` until its URLs are `want` (or fails after a minute).
    pub fn until_search(&self, query: &str, base: &str, want: &[&str]) {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let got = self.search(query, base);
            if got == want {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "waited a minute for {query:?} to find {want:?}: {got:?}"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// SIGKILL, and the process reaped.
    pub fn kill(mut self) {
        self.child.kill().unwrap();
        self.child.wait().unwrap();
    }

    /// SIGTERM, then the exit code.
    pub fn terminate(mut self) -> Option<i32> {
        let sent = Command::new("kill").args(["-TERM", &self.child.id().to_string()]).status();
        assert!(sent.unwrap().success());
        let code = self.child.wait().unwrap().code();
        if code != Some(0) {
            let said = std::fs::read_to_string(&self.log).unwrap_or_default();
            eprintln!("perc serve exited with {code:?}; its stderr:\n{said}");
        }
        code
    }
}

/// A test that fails leaves no server behind.
impl Drop for Server {
    fn drop(&mut self) {
        if matches!(self.child.try_wait(), Ok(None)) {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// `answer` (status, body) to `what` must be `status` with a JSON error containing `says`.
pub fn refused(what: &str, answer: (u16, String), status: u16, says: &str) {
    let (got, body) = answer;
    assert_eq!(got, status, "{what}: {body}");
    let v: serde_json::Value = serde_json::from_str(&body).expect("a JSON error");
    let message = v["error"].as_str().unwrap_or_else(|| panic!("{what}: {body}"));
    assert!(message.contains(says), "{what}: {message}");
}

pub fn q(url: &str) -> String {
    url::form_urlencoded::byte_serialize(url.as_bytes()).collect()
}

/// How many search documents an export holds: its canonical pages that are not noindex.
pub fn documents(export: &str) -> u64 {
    export
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .filter(|v| v["url"] == v["canonical"] && v["noindex"] == false)
        .count() as u64
}
