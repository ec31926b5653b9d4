//! A headless Chromium of the test's own, driven over WebDriver: for tests of web pages (the
//! dashboard).
//!
//! [`Browser::start`] starts a private `chromedriver` on a spare port of 127.0.0.1 and opens one
//! session on it, in a Chromium with a fresh profile in a temp dir and a fixed window size
//! ([`WINDOW`]), so screenshots are comparable between runs. Each [`Browser`] is independent:
//! tests may run several at once.
//!
//! Every lookup polls: [`Browser::find`], [`Browser::text`], [`Browser::click`] and the other
//! methods that name an element wait for it up to [`Browser::timeout`] (60 s unless set), and
//! [`Browser::wait_for_text`] waits for its text to satisfy a condition. Tests wait for what they
//! expect to see and never assert how long it took: CI runs the suite on a loaded machine.
//!
//! `confirm()` dialogs: a click that opens one returns while it is open; answer it with
//! [`Browser::accept_confirm`] or [`Browser::dismiss_confirm`] before anything else. A dialog left
//! open fails the next command ("unexpected alert open"); it is never answered silently.
//!
//! Chromedriver runs in a process group of its own, with Chromium under it; it dies with the
//! thread that started it (parent-death signal), and the whole group is killed and the temp dir
//! removed when the [`Browser`] is dropped ([`Browser::close`] first ends the session politely). Chromium
//! outlives a chromedriver killed from outside, so the next `Browser::start` of any test process
//! kills what is left of browsers whose test process is gone (found by their temp dir).
//!
//! Needs Debian's `chromium` and `chromium-driver` packages (`scripts/test` installs them);
//! without them `Browser::start` fails and says so.
//!
//! Unlike the rest of the kit, this API returns errors instead of panicking, so that a test can
//! look at a failure (and take a screenshot) before it gives up; tests just `unwrap()`.

use std::fmt;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use thirtyfour::prelude::*;

/// The WebDriver client the harness uses, for what the methods here do not cover
/// ([`Browser::driver`]).
pub use thirtyfour;

/// The browser window's size (width, height) in CSS pixels: screenshots have this width.
pub const WINDOW: (u32, u32) = (1280, 900);

/// How long element lookups and waits poll before they fail, unless [`Browser::set_timeout`]
/// says otherwise. Generous on purpose: a page on a loaded 2-core machine can take seconds.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(60);

/// Between two polls.
const POLL: Duration = Duration::from_millis(100);

/// Temp dirs of browsers start with this; the leftover sweep looks for it.
const DIR_PREFIX: &str = "rowclaim-browser-";

const NOT_INSTALLED: &str =
    "run scripts/test (it installs them) or `apt-get install chromium chromium-driver`";

/// What went wrong, in words: the command, the selector, and what the browser said.
pub struct Error(String);

impl Error {
    fn new(msg: impl Into<String>) -> Error {
        Error(msg.into())
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

// `unwrap()` in a test prints Debug: the plain message reads better than a struct dump.
impl fmt::Debug for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Error {}

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Adds what was being done to a WebDriver error.
trait Context<T> {
    fn context(self, what: impl FnOnce() -> String) -> Result<T>;
}

impl<T, E: fmt::Display> Context<T> for std::result::Result<T, E> {
    fn context(self, what: impl FnOnce() -> String) -> Result<T> {
        self.map_err(|e| Error::new(format!("{}: {e}", what())))
    }
}

/// A headless Chromium with one WebDriver session, and the chromedriver it runs under.
pub struct Browser {
    // `None` once closed or dropped.
    driver: Option<WebDriver>,
    // The processes and the temp dir (see `Driver`'s Drop).
    chromedriver: Driver,
    timeout: Duration,
}

impl Drop for Browser {
    fn drop(&mut self) {
        // Not thirtyfour's own drop: that closes the session with a synchronous request which,
        // in a current-thread runtime, hung until its request timeout (minutes). The session ends
        // with chromedriver, killed next by `Driver`'s Drop; `close` is the polite way.
        if let Some(driver) = self.driver.take() {
            let _ = driver.leak();
        }
    }
}

/// The chromedriver process and the temp dir (profile, logs); kills and removes them when dropped.
struct Driver {
    child: Child,
    dir: tempfile::TempDir,
    port: u16,
    /// Holds `port` for this chromedriver alone while it lives.
    _claim: crate::servers::PortClaim,
}

impl Drop for Driver {
    fn drop(&mut self) {
        // Chromedriver leads its own process group, and Chromium stays in it: one signal ends both.
        let pgid = nix::unistd::Pid::from_raw(self.child.id() as i32);
        let _ = nix::sys::signal::killpg(pgid, nix::sys::signal::Signal::SIGKILL);
        let _ = self.child.wait();
        // Chromium's crash handlers start sessions of their own; they name the temp dir.
        kill_processes_naming(self.dir.path());
    }
}

impl Browser {
    /// Starts chromedriver and a headless Chromium session ([`WINDOW`] sized, fresh profile).
    ///
    /// Fails, saying how to install them, when `chromium` or `chromedriver` is missing; fails
    /// with chromedriver's log when the session cannot be created.
    pub async fn start() -> Result<Browser> {
        let chromedriver = find_program("chromedriver", &["chromedriver"])?;
        let chromium = find_program("chromium", &["chromium", "chromium-browser"])?;
        sweep_leftovers();
        // A Chromium that dies while starting on a loaded machine fails the session, not the
        // test: one more try with a fresh chromedriver and profile, and both logs if it fails.
        let mut failures = Vec::new();
        for _ in 0..2 {
            match Browser::try_start(&chromedriver, &chromium).await {
                Ok(browser) => return Ok(browser),
                Err(e) => failures.push(e.to_string()),
            }
        }
        Err(Error::new(failures.join("\n--- and again ---\n")))
    }

    async fn try_start(chromedriver: &Path, chromium: &Path) -> Result<Browser> {
        let chromedriver = start_chromedriver(chromedriver).await?;
        let dir = chromedriver.dir.path();

        let mut caps = DesiredCapabilities::chrome();
        let profile = dir.join("profile");
        let args = [
            "--headless=new".to_owned(),
            // The sandbox cannot start as root (nor in many containers); these tests load only
            // pages of their own.
            "--no-sandbox".to_owned(),
            // /dev/shm is small in containers; Chromium crashes when it runs out.
            "--disable-dev-shm-usage".to_owned(),
            "--disable-gpu".to_owned(),
            format!("--user-data-dir={}", profile.display()),
            format!("--window-size={},{}", WINDOW.0, WINDOW.1),
            // Same pixels on every machine.
            "--force-device-scale-factor=1".to_owned(),
            "--hide-scrollbars".to_owned(),
            "--lang=en-US".to_owned(),
            // Nothing but the test's own traffic: no updates, first-run pages or sync.
            "--no-first-run".to_owned(),
            "--no-default-browser-check".to_owned(),
            "--disable-background-networking".to_owned(),
            "--disable-component-update".to_owned(),
            "--disable-sync".to_owned(),
        ];
        for arg in &args {
            caps.add_arg(arg)
                .context(|| format!("chrome option {arg}"))?;
        }
        caps.set_binary(&chromium.to_string_lossy())
            .context(|| "chrome binary option".to_owned())?;
        // A dialog nobody answered fails the next command and stays open, so a test sees it
        // instead of having it dismissed behind its back (the default).
        caps.set("unhandledPromptBehavior", "ignore")
            .context(|| "unhandledPromptBehavior option".to_owned())?;

        let url = format!("http://127.0.0.1:{}", chromedriver.port);
        // Chromium's first start on a loaded machine can take a while; chromedriver gives up on
        // it by itself (about a minute), so this only bounds a hung chromedriver.
        let session = WebDriver::builder(&url, caps)
            .request_timeout(Duration::from_secs(180))
            .await;
        let driver = match session {
            Ok(d) => d,
            Err(e) => {
                let log = tail(&chromedriver.dir.path().join("chromedriver.log"), 30);
                return Err(Error::new(format!(
                    "start a Chromium session on chromedriver {url}: {e}\n\
                     --- chromedriver log ---\n{log}"
                )));
            }
        };
        Ok(Browser {
            driver: Some(driver),
            chromedriver,
            timeout: DEFAULT_TIMEOUT,
        })
    }

    /// The WebDriver session, for anything the methods here do not cover.
    pub fn driver(&self) -> &WebDriver {
        // Only `close` takes it out, and `close` consumes the Browser.
        self.driver
            .as_ref()
            .unwrap_or_else(|| unreachable!("the session is only taken by close()"))
    }

    /// How long lookups and waits poll (default [`DEFAULT_TIMEOUT`]).
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// Sets how long lookups and waits poll before they fail.
    pub fn set_timeout(&mut self, timeout: Duration) {
        self.timeout = timeout;
    }

    /// chromedriver's port on 127.0.0.1.
    pub fn chromedriver_port(&self) -> u16 {
        self.chromedriver.port
    }

    /// The last lines of chromedriver's log, for a failure message.
    pub fn log_tail(&self) -> String {
        tail(&self.chromedriver.dir.path().join("chromedriver.log"), 30)
    }

    /// Loads `url` and waits until the page has loaded.
    pub async fn goto(&self, url: &str) -> Result<()> {
        self.driver()
            .goto(url)
            .await
            .context(|| format!("goto {url}"))
    }

    /// The URL of the page shown now.
    pub async fn current_url(&self) -> Result<String> {
        let url = self
            .driver()
            .current_url()
            .await
            .context(|| "current url".to_owned())?;
        Ok(url.to_string())
    }

    /// The page's HTML as it is now (after scripts changed it).
    pub async fn page_source(&self) -> Result<String> {
        self.driver()
            .source()
            .await
            .context(|| "page source".to_owned())
    }

    /// The first element matching the CSS selector `css`, waiting for it to appear.
    pub async fn find(&self, css: &str) -> Result<WebElement> {
        let deadline = Instant::now() + self.timeout;
        loop {
            let last = match self.driver().find(By::Css(css)).await {
                Ok(e) => return Ok(e),
                Err(e) => e,
            };
            if Instant::now() >= deadline {
                return Err(Error::new(format!(
                    "no element matches `{css}` after {:?}: {last}",
                    self.timeout
                )));
            }
            tokio::time::sleep(POLL).await;
        }
    }

    /// Every element matching `css` now (no waiting; empty when none does).
    pub async fn find_all(&self, css: &str) -> Result<Vec<WebElement>> {
        self.driver()
            .find_all(By::Css(css))
            .await
            .context(|| format!("find all `{css}`"))
    }

    /// Whether an element matches `css` now (no waiting).
    pub async fn exists(&self, css: &str) -> Result<bool> {
        Ok(!self.find_all(css).await?.is_empty())
    }

    /// The rendered text of the first element matching `css` (waiting for it to appear).
    pub async fn text(&self, css: &str) -> Result<String> {
        self.poll(css, "read the text of", |e| async move { e.text().await })
            .await
    }

    /// The `value` of the form field matching `css`.
    pub async fn value(&self, css: &str) -> Result<String> {
        self.poll(css, "read the value of", |e| async move {
            Ok(e.value().await?.unwrap_or_default())
        })
        .await
    }

    /// Clicks the element matching `css`, once it is there and can be clicked (a click that opens
    /// a `confirm()` returns with the dialog open: see [`Browser::accept_confirm`]).
    pub async fn click(&self, css: &str) -> Result<()> {
        self.poll(css, "click", |e| async move { e.click().await })
            .await
    }

    /// Replaces the text of the input or textarea matching `css` with `value`, typed as a user
    /// would (so input events fire).
    pub async fn fill(&self, css: &str, value: &str) -> Result<()> {
        self.poll(css, "fill", |e| async move {
            e.clear().await?;
            e.send_keys(value).await
        })
        .await
    }

    /// Submits the form that the element matching `css` belongs to (or that it is), as pressing
    /// Enter in it would: the form's checks and `submit` handlers run.
    pub async fn submit(&self, css: &str) -> Result<()> {
        self.poll(css, "submit the form of", |e| async move {
            let arg = e.to_json()?;
            // requestSubmit, unlike submit(), runs validation and onsubmit like a user's submit.
            self.driver()
                .execute(
                    "const e = arguments[0];
                     const form = e instanceof HTMLFormElement ? e : e.form;
                     if (!form) { throw new Error('not in a form'); }
                     form.requestSubmit();",
                    vec![arg],
                )
                .await
                .map(|_| ())
        })
        .await
    }

    /// Waits until the text of the element matching `css` satisfies `ok`, and returns it. The
    /// element is looked up afresh on every poll, so the page may be reloaded meanwhile.
    pub async fn wait_for_text(&self, css: &str, ok: impl Fn(&str) -> bool) -> Result<String> {
        self.wait_for_text_within(css, self.timeout, ok).await
    }

    /// [`Browser::wait_for_text`] with a timeout of its own.
    pub async fn wait_for_text_within(
        &self,
        css: &str,
        timeout: Duration,
        ok: impl Fn(&str) -> bool,
    ) -> Result<String> {
        let deadline = Instant::now() + timeout;
        loop {
            let seen = match self.driver().find(By::Css(css)).await {
                Ok(e) => match e.text().await {
                    Ok(text) if ok(&text) => return Ok(text),
                    Ok(text) => format!("its text was {text:?}"),
                    Err(e) => e.to_string(),
                },
                Err(e) => format!("no element: {e}"),
            };
            if Instant::now() >= deadline {
                return Err(Error::new(format!(
                    "the text of `{css}` did not become what was expected within {timeout:?}; last \
                     {seen}"
                )));
            }
            tokio::time::sleep(POLL).await;
        }
    }

    /// Waits until the text of the element matching `css` contains `needle`; returns the text.
    pub async fn wait_for_text_contains(&self, css: &str, needle: &str) -> Result<String> {
        self.wait_for_text(css, |t| t.contains(needle))
            .await
            .map_err(|e| Error::new(format!("{e} (waiting for it to contain {needle:?})")))
    }

    /// Waits for a `confirm()` (or `alert()`) dialog, accepts it and returns its message.
    pub async fn accept_confirm(&self) -> Result<String> {
        let text = self.wait_for_dialog().await?;
        self.driver()
            .accept_alert()
            .await
            .context(|| format!("accept the dialog {text:?}"))?;
        Ok(text)
    }

    /// Waits for a `confirm()` dialog, dismisses it (Cancel) and returns its message.
    pub async fn dismiss_confirm(&self) -> Result<String> {
        let text = self.wait_for_dialog().await?;
        self.driver()
            .dismiss_alert()
            .await
            .context(|| format!("dismiss the dialog {text:?}"))?;
        Ok(text)
    }

    async fn wait_for_dialog(&self) -> Result<String> {
        let deadline = Instant::now() + self.timeout;
        loop {
            let last = match self.driver().get_alert_text().await {
                Ok(text) => return Ok(text),
                Err(e) => e,
            };
            if Instant::now() >= deadline {
                return Err(Error::new(format!(
                    "no dialog opened within {:?}: {last}",
                    self.timeout
                )));
            }
            tokio::time::sleep(POLL).await;
        }
    }

    /// A PNG of the window as it is now ([`WINDOW`] wide).
    pub async fn screenshot(&self) -> Result<Vec<u8>> {
        self.driver()
            .screenshot_as_png()
            .await
            .context(|| "screenshot".to_owned())
    }

    /// Writes a PNG of the window to `path`, creating its directory. Put them under the test's
    /// `env!("CARGO_TARGET_TMPDIR")` so they outlive the test and stay out of the source tree.
    pub async fn screenshot_to(&self, path: impl AsRef<Path>) -> Result<()> {
        let path = path.as_ref();
        let png = self.screenshot().await?;
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent)
                .context(|| format!("create {} for a screenshot", parent.display()))?;
        }
        std::fs::write(path, png).context(|| format!("write screenshot {}", path.display()))
    }

    /// Closes the session (Chromium exits), then stops chromedriver and removes the temp dir;
    /// reports a failure to close the session. Dropping the [`Browser`] kills chromedriver and
    /// Chromium without asking, which is as clean but cannot report.
    pub async fn close(mut self) -> Result<()> {
        match self.driver.take() {
            Some(driver) => driver
                .quit()
                .await
                .context(|| "close the session".to_owned()),
            None => Ok(()),
        }
    }

    /// Finds the element (polling, like [`Browser::find`]) and runs `action` on it, polling again
    /// while it fails the way a page still settling does (gone, hidden, covered, not yet
    /// interactable).
    async fn poll<T, F, Fut>(&self, css: &str, what: &str, action: F) -> Result<T>
    where
        F: Fn(WebElement) -> Fut,
        Fut: std::future::Future<Output = WebDriverResult<T>>,
    {
        let deadline = Instant::now() + self.timeout;
        loop {
            let last = match self.driver().find(By::Css(css)).await {
                Ok(e) => match action(e).await {
                    Ok(v) => return Ok(v),
                    Err(e) if settling(&e) => e.to_string(),
                    Err(e) => return Err(Error::new(format!("{what} `{css}`: {e}"))),
                },
                Err(e) => format!("no element matches: {e}"),
            };
            if Instant::now() >= deadline {
                return Err(Error::new(format!(
                    "{what} `{css}`: still failing after {:?}: {last}",
                    self.timeout
                )));
            }
            tokio::time::sleep(POLL).await;
        }
    }
}

/// Failures that polling can outlast: the page is still loading or changing.
fn settling(e: &WebDriverError) -> bool {
    use thirtyfour::error::WebDriverErrorInner as E;
    matches!(
        e.as_inner(),
        E::NoSuchElement(_)
            | E::StaleElementReference(_)
            | E::ElementNotInteractable(_)
            | E::ElementClickIntercepted(_)
            | E::InvalidElementState(_)
    )
}

/// The first of `names` found on PATH (or in /usr/bin, /usr/lib/chromium).
fn find_program(what: &str, names: &[&str]) -> Result<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    let mut dirs: Vec<PathBuf> = std::env::split_paths(&path).collect();
    dirs.push(PathBuf::from("/usr/bin"));
    for name in names {
        for dir in &dirs {
            let candidate = dir.join(name);
            if is_executable(&candidate) {
                return Ok(candidate);
            }
        }
    }
    Err(Error::new(format!(
        "{what} is not installed (looked for {} on PATH): browser tests need Chromium and \
         chromedriver; {NOT_INSTALLED}",
        names.join(", ")
    )))
}

fn is_executable(path: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(path).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

/// Starts chromedriver on a spare port and waits until it accepts connections. The port may be
/// taken between choosing and binding it, hence the retries.
async fn start_chromedriver(program: &Path) -> Result<Driver> {
    let dir = tempfile::Builder::new()
        .prefix(DIR_PREFIX)
        .tempdir()
        .context(|| "create a temp dir for the browser".to_owned())?;
    // The sweep of leftovers knows a dir is ours by this, and whether its test process is gone.
    std::fs::write(dir.path().join("owner"), std::process::id().to_string())
        .context(|| format!("write {}/owner", dir.path().display()))?;
    let log_path = dir.path().join("chromedriver.log");
    let mut last = String::new();
    for _ in 0..3 {
        let claim = crate::servers::try_spare_port()
            .context(|| "find a spare port on 127.0.0.1".to_owned())?;
        let port = claim.port();
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log_path)
            .context(|| format!("open {}", log_path.display()))?;
        let log2 = log
            .try_clone()
            .context(|| format!("open {}", log_path.display()))?;
        let mut cmd = Command::new(program);
        cmd.arg(format!("--port={port}"))
            .current_dir(dir.path())
            // Chromium keeps its crash reports and caches under these: in the temp dir, not in
            // the user's home (and its crash handler then names the dir, for the cleanup).
            .env("HOME", dir.path())
            .env("XDG_CONFIG_HOME", dir.path().join("config"))
            .env("XDG_CACHE_HOME", dir.path().join("cache"))
            .stdin(Stdio::null())
            .stdout(log)
            .stderr(log2);
        {
            use std::os::unix::process::CommandExt;
            // A group of its own, which Chromium inherits: Drop kills the lot with one signal.
            cmd.process_group(0);
            // SAFETY: prctl is async-signal-safe; nothing else runs between fork and exec here.
            unsafe {
                cmd.pre_exec(|| {
                    nix::sys::prctl::set_pdeathsig(nix::sys::signal::Signal::SIGKILL)
                        .map_err(std::io::Error::from)
                });
            }
        }
        let mut child = cmd
            .spawn()
            .context(|| format!("start {}", program.display()))?;
        match wait_listening(&mut child, port).await {
            Ok(()) => {
                return Ok(Driver {
                    child,
                    dir,
                    port,
                    _claim: claim,
                })
            }
            Err(e) => {
                let _ = child.kill();
                let _ = child.wait();
                last = format!("{e}\n--- chromedriver log ---\n{}", tail(&log_path, 30));
            }
        }
    }
    Err(Error::new(format!(
        "chromedriver ({}) did not start: {last}",
        program.display()
    )))
}

/// Waits until chromedriver answers its `/status` as ready on `port` (or exits). A bare
/// connect is not enough: another test's server or proxy may have taken the port between
/// choosing it and chromedriver binding it, and then accepts the connection in its place.
async fn wait_listening(child: &mut Child, port: u16) -> std::result::Result<(), String> {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if let Ok(Some(status)) = child.try_wait() {
            return Err(format!("chromedriver exited ({status})"));
        }
        let last = match chromedriver_status(port).await {
            Ok(body) if body.contains("\"ready\":true") => return Ok(()),
            Ok(body) => format!("not ready: {}", body.chars().take(200).collect::<String>()),
            Err(e) => e.to_string(),
        };
        if Instant::now() > deadline {
            return Err(format!(
                "chromedriver not ready on port {port} after 60 s: {last}"
            ));
        }
        tokio::time::sleep(POLL).await;
    }
}

/// `GET /status` on 127.0.0.1:`port`, the whole response as text. HTTP/1.1, because
/// chromedriver 156 refuses HTTP/1.0 ("Cannot handle request with protocol"); it keeps the
/// connection open even when asked to close it, so the response ends where its Content-Length
/// says (or where the connection ends).
async fn chromedriver_status(port: u16) -> std::io::Result<String> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let exchange = async {
        let mut stream = tokio::net::TcpStream::connect(("127.0.0.1", port)).await?;
        stream
            .write_all(b"GET /status HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
            .await?;
        let mut response = Vec::new();
        let mut chunk = [0u8; 4096];
        loop {
            let n = stream.read(&mut chunk).await?;
            if n == 0 {
                break;
            }
            response.extend_from_slice(&chunk[..n]);
            if http_response_complete(&response) {
                break;
            }
        }
        Ok(String::from_utf8_lossy(&response).into_owned())
    };
    tokio::time::timeout(Duration::from_secs(5), exchange)
        .await
        .unwrap_or_else(|_| {
            Err(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                "no answer to GET /status in 5 s",
            ))
        })
}

/// Whether `response` holds a whole HTTP response: its head, and as much body as its
/// Content-Length says.
fn http_response_complete(response: &[u8]) -> bool {
    let Some(head_end) = response.windows(4).position(|w| w == b"\r\n\r\n") else {
        return false;
    };
    let head = String::from_utf8_lossy(&response[..head_end]);
    let length = head.lines().find_map(|line| {
        let (name, value) = line.split_once(':')?;
        name.trim()
            .eq_ignore_ascii_case("content-length")
            .then(|| value.trim().parse::<usize>().ok())
            .flatten()
    });
    length.is_some_and(|len| response.len() >= head_end + 4 + len)
}

/// Once per test process: kills what is left of browsers whose test process is gone (their
/// chromedriver died with it, but Chromium does not follow chromedriver), and removes their dirs.
fn sweep_leftovers() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let Ok(entries) = std::fs::read_dir(std::env::temp_dir()) else {
            return;
        };
        for entry in entries.flatten() {
            if !entry.file_name().to_string_lossy().starts_with(DIR_PREFIX) {
                continue;
            }
            let dir = entry.path();
            // No owner file yet: a browser being started right now.
            let Some(owner) = read_pid(&dir.join("owner")) else {
                continue;
            };
            if Path::new(&format!("/proc/{owner}")).exists() {
                continue;
            }
            kill_processes_naming(&dir);
            let _ = std::fs::remove_dir_all(&dir);
        }
    });
}

/// SIGKILLs every process whose command line names `dir` (Chromium's processes name their
/// profile or crash-report dir in it).
fn kill_processes_naming(dir: &Path) {
    let Ok(procs) = std::fs::read_dir("/proc") else {
        return;
    };
    let dir_text = dir.to_string_lossy();
    let me = std::process::id();
    for p in procs.flatten() {
        let Some(pid) = p.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else {
            continue;
        };
        if pid == me {
            continue;
        }
        let Ok(cmdline) = std::fs::read(p.path().join("cmdline")) else {
            continue;
        };
        if String::from_utf8_lossy(&cmdline).contains(dir_text.as_ref()) {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid as i32),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
    }
}

fn read_pid(path: &Path) -> Option<u32> {
    let mut text = String::new();
    std::fs::File::open(path)
        .ok()?
        .read_to_string(&mut text)
        .ok()?;
    text.trim().parse().ok()
}

fn tail(path: &Path, lines: usize) -> String {
    match std::fs::read(path) {
        Ok(bytes) => {
            let text = String::from_utf8_lossy(&bytes);
            let all: Vec<&str> = text.lines().collect();
            all[all.len().saturating_sub(lines)..].join("\n")
        }
        Err(e) => format!("(cannot read {}: {e})", path.display()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_program_says_how_to_install_it() {
        let err = find_program("chromedriver", &["rowclaim-no-such-chromedriver"])
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(err.contains("chromedriver is not installed"), "{err}");
        assert!(err.contains("scripts/test"), "{err}");
        assert!(
            err.contains("apt-get install chromium chromium-driver"),
            "{err}"
        );
    }
}
