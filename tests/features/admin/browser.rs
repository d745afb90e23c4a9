//! The console's page in a real browser: Debian's headless Chromium, driven through
//! chromedriver's W3C WebDriver API (over `awc`, already the HTTP client of the tests). The
//! page loads, shows the stuck stream and the dead letter (its markup shown as text), and a
//! click on Replay clears the entry from the page and the store, the entity applying it once.
//! A screenshot of the page is saved to `target/admin-console.png`.
//!
//! Skipped, with a note, when `/usr/bin/chromedriver` is missing, unless
//! `ACTIX_DELIVERY_BROWSER` is set (as `.ci/run` sets it): then a missing browser fails.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use actix_web::{App, HttpServer};
use serde_json::{json, Value};

use super::{world, SCRIPT_ERROR};
use crate::common::entities::Op;

const CHROMEDRIVER: &str = "/usr/bin/chromedriver";
const CHROMIUM: &str = "/usr/bin/chromium";
/// Set (by `.ci/run`): a missing browser fails the test instead of skipping it.
const REQUIRED: &str = "ACTIX_DELIVERY_BROWSER";

/// chromedriver, listening on a port of 127.0.0.1; killed when dropped.
struct Chromedriver {
    child: Child,
    port: u16,
    profile: tempfile::TempDir,
}

impl Chromedriver {
    /// Starts chromedriver, or says why the test is skipped (`None`).
    fn start_or_skip() -> Option<Self> {
        let missing: Vec<&str> = [CHROMEDRIVER, CHROMIUM]
            .into_iter()
            .filter(|path| !Path::new(path).exists())
            .collect();
        if !missing.is_empty() {
            assert!(
                std::env::var_os(REQUIRED).is_none(),
                "{REQUIRED} is set, and {missing:?} are missing: install Debian's `chromium` and \
                 `chromium-driver` (.ci/run does)"
            );
            eprintln!(
                "skipped: the browser test needs {missing:?} (Debian's `chromium` and \
                 `chromium-driver`; .ci/run installs them and sets {REQUIRED})"
            );
            return None;
        }
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|listener| listener.local_addr())
            .expect("a free port")
            .port();
        let child = Command::new(CHROMEDRIVER)
            .arg(format!("--port={port}"))
            .arg("--allowed-ips=127.0.0.1")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("chromedriver starts");
        let profile = tempfile::tempdir().expect("a profile directory");
        Some(Self {
            child,
            port,
            profile,
        })
    }

    /// A new headless Chromium session, once chromedriver answers (within 20 s).
    async fn session(&self) -> Browser {
        let http = awc::Client::builder()
            .timeout(Duration::from_secs(60))
            .finish();
        let base = format!("http://127.0.0.1:{}", self.port);
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        while http.get(format!("{base}/status")).send().await.is_err() {
            assert!(
                std::time::Instant::now() < deadline,
                "chromedriver did not answer within 20 s"
            );
            actix::clock::sleep(Duration::from_millis(50)).await;
        }
        let args = [
            "--headless".to_owned(),
            "--no-sandbox".to_owned(),
            "--disable-gpu".to_owned(),
            "--disable-dev-shm-usage".to_owned(),
            "--no-first-run".to_owned(),
            "--disable-background-networking".to_owned(),
            "--disable-component-update".to_owned(),
            "--disable-sync".to_owned(),
            "--window-size=1400,1200".to_owned(),
            format!("--user-data-dir={}", self.profile.path().display()),
        ];
        let capabilities = json!({
            "capabilities": {
                "alwaysMatch": {
                    "browserName": "chrome",
                    "goog:chromeOptions": { "binary": CHROMIUM, "args": args },
                },
            },
        });
        let mut browser = Browser {
            http,
            session: base.clone(),
        };
        let created = browser.call("POST", "/session", Some(capabilities)).await;
        let id = created["sessionId"]
            .as_str()
            .unwrap_or_else(|| panic!("no session: {created}"));
        browser.session = format!("{base}/session/{id}");
        browser
    }
}

impl Drop for Chromedriver {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A WebDriver session.
struct Browser {
    http: awc::Client,
    /// The session's URL (chromedriver's, before the session is made).
    session: String,
}

/// The W3C key of an element reference.
const ELEMENT: &str = "element-6066-11e4-a52e-4f735466cecf";

impl Browser {
    /// Sends a command; its `value`, or panics with the WebDriver error.
    async fn call(&self, method: &str, path: &str, body: Option<Value>) -> Value {
        self.try_call(method, path, body)
            .await
            .unwrap_or_else(|error| panic!("WebDriver {method} {path}: {error}"))
    }

    /// Sends a command; its `value`, or the WebDriver error's.
    async fn try_call(
        &self,
        method: &str,
        path: &str,
        body: Option<Value>,
    ) -> Result<Value, Value> {
        let url = format!("{}{path}", self.session);
        let request = match method {
            "GET" => self.http.get(url),
            "DELETE" => self.http.delete(url),
            _ => self.http.post(url),
        };
        let mut response = match body {
            Some(body) => request.send_json(&body).await,
            None if method == "POST" => request.send_json(&json!({})).await,
            None => request.send().await,
        }
        .map_err(|error| json!({ "error": error.to_string() }))?;
        let status = response.status();
        let answer: Value = response
            .json()
            .limit(64 << 20)
            .await
            .map_err(|error| json!({ "error": error.to_string() }))?;
        let value = answer["value"].clone();
        match status.is_success() {
            true => Ok(value),
            false => Err(value),
        }
    }

    async fn goto(&self, url: &str) {
        self.call("POST", "/url", Some(json!({ "url": url }))).await;
    }

    /// Runs `script` in the page; what it returns.
    async fn run(&self, script: &str) -> Value {
        let body = json!({ "script": script, "args": [] });
        self.call("POST", "/execute/sync", Some(body)).await
    }

    /// Clicks the element `css` selects, as a user would (again if the page's refresh
    /// replaced it meanwhile).
    async fn click(&self, css: &str) {
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        loop {
            let found = self
                .try_call(
                    "POST",
                    "/element",
                    Some(json!({ "using": "css selector", "value": css })),
                )
                .await;
            let clicked = match found {
                Ok(element) => {
                    let id = element[ELEMENT].as_str().expect("an element").to_owned();
                    self.try_call("POST", &format!("/element/{id}/click"), None)
                        .await
                }
                Err(error) => Err(error),
            };
            match clicked {
                Ok(_) => return,
                Err(error) => assert!(
                    std::time::Instant::now() < deadline,
                    "cannot click {css}: {error}"
                ),
            }
            actix::clock::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Waits until `script` returns `true` (within 15 s); says `what` otherwise, with the page.
    async fn until(&self, what: &str, script: &str) {
        let deadline = std::time::Instant::now() + Duration::from_secs(15);
        while self.run(script).await != json!(true) {
            if std::time::Instant::now() > deadline {
                let page = self.run("return document.body.innerText").await;
                panic!(
                    "{what}: not within 15 s; the page says:\n{}",
                    page.as_str().unwrap_or("")
                );
            }
            actix::clock::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Saves a screenshot of the page to `path`.
    async fn screenshot(&self, path: &Path) {
        let png = self.call("GET", "/screenshot", None).await;
        let png = base64(png.as_str().expect("base64 PNG"));
        assert!(png.starts_with(b"\x89PNG"), "a PNG");
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, png).unwrap();
    }

    async fn close(self) {
        let _ = self.try_call("DELETE", "", None).await;
    }
}

/// Decodes standard base64 (the screenshot).
fn base64(text: &str) -> Vec<u8> {
    let value = |c: u8| match c {
        b'A'..=b'Z' => c - b'A',
        b'a'..=b'z' => c - b'a' + 26,
        b'0'..=b'9' => c - b'0' + 52,
        b'+' => 62,
        b'/' => 63,
        _ => panic!("not base64: {c}"),
    };
    let digits: Vec<u8> = text
        .bytes()
        .filter(|c| *c != b'=' && !c.is_ascii_whitespace())
        .map(value)
        .collect();
    let mut out = Vec::with_capacity(digits.len() * 3 / 4);
    for chunk in digits.chunks(4) {
        let bits = chunk
            .iter()
            .enumerate()
            .fold(0u32, |acc, (i, d)| acc | u32::from(*d) << (18 - 6 * i));
        let bytes = bits.to_be_bytes();
        out.extend_from_slice(&bytes[1..chunk.len()]);
    }
    out
}

/// Where the screenshot goes: `target/admin-console.png` of the repository.
fn screenshot_path() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("target")
        .join("admin-console.png")
}

#[actix::test]
async fn in_a_browser_the_page_shows_the_stuck_stream_and_replay_clears_the_dead_letter() {
    let Some(driver) = Chromedriver::start_or_skip() else {
        return;
    };
    let world = world().await;
    world.console.stuck_after(Duration::from_millis(200));
    let console = world.console.clone();
    let server = HttpServer::new(move || App::new().service(console.scope("/admin")))
        .workers(1)
        .disable_signals()
        .bind(("127.0.0.1", 0))
        .unwrap();
    let addr = server.addrs()[0];
    let server = server.run();
    let stop = server.handle();
    actix::spawn(server);

    let browser = driver.session().await;
    browser.goto(&format!("http://{addr}/admin/")).await;
    // The page refreshes itself: the stream becomes stuck once its oldest message waited 200 ms.
    browser
        .until(
            "the attention list names the stuck stream",
            "return document.getElementById('attention').innerText\
             .includes('durable stream stuck: 3 unconfirmed')",
        )
        .await;
    let row = format!("dead-letter-{}", world.job);
    let text = browser
        .run(&format!(
            "return document.getElementById('{row}').innerText"
        ))
        .await;
    let text = text.as_str().expect("the dead letter's row");
    assert!(
        text.contains("job-13") && text.contains(SCRIPT_ERROR),
        "{text}"
    );
    assert_eq!(
        browser.run("return window.injected === undefined").await,
        json!(true),
        "a dead letter's markup never runs"
    );
    let producers = browser
        .run("return document.getElementById('producers').innerText")
        .await;
    assert!(
        producers.as_str().unwrap().contains("orders"),
        "{producers}"
    );
    // The whole page in the screenshot.
    let height = browser
        .run("return document.documentElement.scrollHeight")
        .await;
    let height = height.as_u64().unwrap_or(1200).clamp(600, 4000);
    browser
        .call(
            "POST",
            "/window/rect",
            Some(json!({ "width": 1400, "height": height + 200 })),
        )
        .await;
    let path = screenshot_path();
    browser.screenshot(&path).await;
    println!("the console's screenshot: {}", path.display());

    browser.click(&format!("#{row} button.replay")).await;
    browser
        .until(
            "the replayed entry leaves the page",
            &format!("return document.getElementById('{row}') === null"),
        )
        .await;
    let notice = browser
        .run("return document.getElementById('notice').innerText")
        .await;
    assert!(notice.as_str().unwrap().contains("applied"), "{notice}");
    assert!(
        world.dead_letters.get(world.job).await.is_err(),
        "gone from the store"
    );
    assert_eq!(
        world.ledger.ask(Op::Total).await.unwrap(),
        1,
        "applied once"
    );
    assert_eq!(
        world.dead_letters.counts().await.unwrap().entries,
        2,
        "the others stay"
    );
    browser.close().await;
    stop.stop(true).await;
}
