//! A headless Chromium for the tests of pages people look at (the status page, the diff
//! report): Debian's chromium, driven through chromedriver by fantoccini. `make test`
//! installs chromium and chromium-driver; CHROMIUM and CHROMEDRIVER name other binaries.

use std::net::TcpListener;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use fantoccini::{Client, ClientBuilder};

/// chromedriver on a free loopback port, killed when dropped.
pub struct Driver {
    child: Child,
    url: String,
}

impl Driver {
    pub fn start() -> Driver {
        let binary = std::env::var("CHROMEDRIVER").unwrap_or_else(|_| "chromedriver".into());
        let port = TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let child = Command::new(&binary)
            .arg(format!("--port={port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| {
                panic!("cannot run {binary} ({e}): install chromium and chromium-driver (make test does)")
            });
        // Ready once it accepts connections.
        let deadline = Instant::now() + Duration::from_secs(30);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(Instant::now() < deadline, "{binary} did not listen on {port}");
            std::thread::sleep(Duration::from_millis(20));
        }
        Driver { child, url: format!("http://127.0.0.1:{port}") }
    }
}

impl Drop for Driver {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub async fn browser(driver: &Driver) -> Client {
    let chromium = std::env::var("CHROMIUM").unwrap_or_else(|_| "/usr/bin/chromium".into());
    let caps = serde_json::json!({
        "goog:chromeOptions": {
            "binary": chromium,
            "args": ["--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                     "--window-size=1280,1400"],
        }
    });
    let serde_json::Value::Object(caps) = caps else { unreachable!() };
    let connector = hyper_util::client::legacy::connect::HttpConnector::new();
    ClientBuilder::new(connector)
        .capabilities(caps)
        .connect(&driver.url)
        .await
        .unwrap_or_else(|e| panic!("no browser session through {}: {e}", driver.url))
}

/// A screenshot of what `page` shows, saved as `target/<name>` for review.
pub async fn save_screenshot(page: &Client, name: &str) {
    let screenshot = page.screenshot().await.unwrap();
    let target = std::env::var("CARGO_TARGET_DIR")
        .map_or_else(|_| super::root().join("target"), std::path::PathBuf::from);
    std::fs::create_dir_all(&target).unwrap();
    std::fs::write(target.join(name), &screenshot).unwrap();
    assert!(screenshot.starts_with(b"\x89PNG"), "a PNG");
}
