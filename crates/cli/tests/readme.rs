//! The README's examples, run as written: each `sh` block of its "Three uses" in bash, in a
//! directory of its own that sees the repository's `fixtures/`, with the `perc` under test
//! first on the PATH. Only the ports change: the README's 8000 (the site) and 8420 (perc
//! serve) become ports this test picks free.

use std::path::Path;
use std::process::{Command, Output};

mod common;
use common::{finish, ok, root, PERC};

/// The `sh` blocks of the README's section `heading`, in order.
fn blocks(heading: &str) -> Vec<String> {
    let readme = std::fs::read_to_string(root().join("README.md")).unwrap();
    let section = readme.split(heading).nth(1).expect("the README has the section");
    let section = section.split("\n## ").next().unwrap();
    section.split("```sh\n").skip(1).map(|b| b.split("\n```").next().unwrap().to_string()).collect()
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// Runs `script` in bash in `dir`; background jobs it starts are killed when it ends.
fn bash(dir: &Path, script: &str, what: &str) -> Output {
    let bin = Path::new(PERC).parent().unwrap();
    let path = format!("{}:{}", bin.display(), std::env::var("PATH").unwrap_or_default());
    let mut cmd = Command::new("bash");
    cmd.arg("-c")
        .arg(format!(
            "set -euo pipefail\ntrap 'kill $(jobs -p) 2>/dev/null || true' EXIT\n{script}"
        ))
        .current_dir(dir)
        .env("PATH", path)
        .env_remove("RUST_LOG");
    finish(cmd, what)
}

/// A directory to run in, with the repository's fixtures in it.
fn workdir() -> tempfile::TempDir {
    let tmp = tempfile::tempdir().unwrap();
    std::os::unix::fs::symlink(root().join("fixtures"), tmp.path().join("fixtures")).unwrap();
    tmp
}

#[test]
fn the_readme_examples_run_as_written() {
    let blocks = blocks("## Three uses");
    assert_eq!(blocks.len(), 3, "three uses, a block each: {blocks:?}");
    let tmp = workdir();
    let site_port = free_port().to_string();
    let site = format!("http://127.0.0.1:{site_port}");

    // 1. Crawl the demo site and ask for a canonical URL. The site's server is the block's
    // first line; the rest waits for it to answer.
    let crawl = blocks[0].replace("8000", &site_port);
    let (serve_site, rest) = crawl.split_once('\n').unwrap();
    let script = format!(
        "{serve_site}\nfor i in $(seq 300); do curl -sf -o /dev/null {site}/ && break; sleep 0.1; done\n{rest}"
    );
    let out = ok(&bash(tmp.path(), &script, "the README's crawl"));
    assert!(
        out.lines().any(|l| l == format!("{site}/about.html")),
        "the canonical of copy-of-about.html is about.html:\n{out}"
    );
    let exported = std::fs::read_to_string(tmp.path().join("index.jsonl")).unwrap();
    assert_eq!(exported.lines().count(), 17, "{exported}");

    // 2. perc serve on the store the crawl left: started as written, its API asked as
    // written once it has indexed the site.
    let api_port = free_port().to_string();
    let serve = blocks[1].replace("8000", &site_port).replace("8420", &api_port);
    let mut lines = serve.lines();
    // The server runs until stopped: in the background here (the README's comment dropped).
    let start_server = lines.next().unwrap().split('#').next().unwrap().trim_end();
    let asks: Vec<&str> = lines.collect();
    let script = format!(
        "python3 -m http.server --bind 127.0.0.1 --directory fixtures/sites/demo {site_port} >/dev/null 2>&1 &\n\
         PERC_SERVE_LISTEN=127.0.0.1:{api_port} {start_server} &\n\
         for i in $(seq 600); do\n\
           s=$(curl -sf http://127.0.0.1:{api_port}/v1/status || true)\n\
           case $s in *'\"pages\":17,\"parked\":0,\"pending\":0,'*'\"caught_up\":true'*) break;; esac\n\
           sleep 0.1\n\
         done\n\
         {}",
        asks.join("\n")
    );
    let out = ok(&bash(tmp.path(), &script, "the README's serve"));
    assert!(out.contains(&format!("\"canonical\":\"{site}/about.html\"")), "{out}");
    assert!(out.contains("widget-care.html"), "search finds the care guide:\n{out}");

    // 3. The CI replay of the repository's fixture against its golden export.
    ok(&bash(workdir().path(), &blocks[2], "the README's replay"));
}
