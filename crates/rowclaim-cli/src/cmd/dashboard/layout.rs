//! What every page has: its frame (the head, the navigation, the refresh), the page that says
//! what went wrong, the button of an action, and how a page writes values (times, durations,
//! path segments, query values). The login page has the bare frame.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use maud::{html, Markup, PreEscaped, DOCTYPE};

use super::state::{Dashboard, Who};

const CSS: &str = "body{font:14px/1.4 system-ui,sans-serif;margin:0;color:#222}\
header{background:#263238;color:#fff;padding:8px 16px;display:flex;gap:16px;align-items:center}\
header a{color:#fff}header .grow{flex:1}main{padding:8px 16px}\
table{border-collapse:collapse;margin:8px 0}td,th{border-bottom:1px solid #ddd;padding:3px 8px;text-align:left;vertical-align:top}\
td.num,th.num{text-align:right}.problem{color:#b00020;font-weight:600}.muted{color:#777}\
pre{background:#f4f4f4;padding:8px;overflow:auto;max-height:30em}.badge{background:#b00020;color:#fff;padding:1px 6px;border-radius:3px}\
figure.chart{margin:8px 0}.legend span{margin-right:12px}.swatch{display:inline-block;width:10px;height:10px;margin-right:4px}\
form.inline{display:inline}button.danger{color:#b00020}.badge.paused{background:#8a6d00}";

/// Reloads the page every 10 s, unless the user is typing in it or has changed a field (a
/// page being filled in is never reloaded away).
const REFRESH: &str = "(function(){var dirty=false;document.addEventListener('input',function(){dirty=true;});\
setInterval(function(){var a=document.activeElement;if(dirty||(a&&/^(INPUT|SELECT|TEXTAREA)$/.test(a.tagName)))return;location.reload();},10000);})();";

/// The `<head>` of every page.
fn head(title: &str) -> Markup {
    html! {
        head {
            meta charset="utf-8";
            meta name="viewport" content="width=device-width";
            title { (title) " · rowclaim" }
            style { (PreEscaped(CSS)) }
        }
    }
}

/// A page without the navigation (the login page).
pub fn layout_bare(title: &str, body: Markup) -> Markup {
    html! {
        (DOCTYPE)
        html lang="en" {
            (head(title))
            body { main { (body) } }
        }
    }
}

/// A page of a logged-in session: navigation, the database's endpoint, and the refresh.
pub fn layout(state: &Dashboard, who: &Who, title: &str, refresh: bool, body: Markup) -> Markup {
    html! {
        (DOCTYPE)
        html lang="en" {
            (head(title))
            body {
                header {
                    strong { "rowclaim" }
                    a href="/" { "Overview" }
                    a href="/jobs" { "Jobs" }
                    a href="/workers" { "Workers" }
                    a href="/actions" { "Actions" }
                    span.grow { span.muted { (state.endpoint) } }
                    @if state.read_only { span.badge { "read-only" } }
                    form.inline method="post" action="/logout" {
                        input type="hidden" name="csrf" value=(who.session.csrf);
                        button type="submit" { "Log out" }
                    }
                }
                main { h1 { (title) } (body) }
                @if refresh { script { (PreEscaped(REFRESH)) } }
            }
        }
    }
}

/// A page saying what went wrong, with its status.
pub fn trouble(state: &Dashboard, who: &Who, status: StatusCode, what: &str) -> Response {
    let page = layout(state, who, "Problem", false, html! { p.problem { (what) } });
    (status, page).into_response()
}

/// Page sizes offered.
pub const LIMITS: [u32; 4] = [25, 50, 100, 500];

/// A form that POSTs `action` with the session's CSRF token (and the `fields`), after the
/// browser asks to confirm.
pub fn action_button(
    who: &Who,
    action: &str,
    fields: &[(&str, &str)],
    label: &str,
    confirm: &str,
    danger: bool,
) -> Markup {
    html! {
        form.inline method="post" action=(action) data-confirm=(confirm) onsubmit="return confirm(this.dataset.confirm)" {
            input type="hidden" name="csrf" value=(who.session.csrf);
            @for (name, value) in fields { input type="hidden" name=(name) value=(value); }
            button.danger[danger] type="submit" { (label) }
        }
    }
}

/// `text` as one segment of a path (percent-encoded past the unreserved characters).
pub fn path_segment(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for b in text.bytes() {
        if b.is_ascii_alphanumeric() || b"-_.~".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// `text` as a query value.
pub fn query_value(text: &str) -> String {
    form_urlencoded::byte_serialize(text.as_bytes()).collect()
}

/// A time as RFC 3339 (UTC, seconds) and how far from now.
pub fn when(t: SystemTime) -> String {
    let Ok(since_epoch) = t.duration_since(UNIX_EPOCH) else {
        return "before 1970".to_owned();
    };
    // RFC 3339 stops at the year 9999 (humantime panics past it); a job may be put that far.
    if since_epoch.as_secs() >= 253_402_300_800 {
        return "after the year 9999".to_owned();
    }
    let at = humantime::format_rfc3339_seconds(UNIX_EPOCH + since_epoch);
    let now = SystemTime::now();
    let rel = match t.duration_since(now) {
        Ok(ahead) => format!("in {}", short(ahead)),
        Err(e) => format!("{} ago", short(e.duration())),
    };
    format!("{at} ({rel})")
}

fn short(d: Duration) -> String {
    let s = d.as_secs();
    match s {
        0..=119 => format!("{s}s"),
        120..=7199 => format!("{}m", s / 60),
        _ => format!("{}h", s / 3600),
    }
}

pub fn secs(s: f64) -> String {
    short(Duration::from_secs_f64(s.max(0.0)))
}

/// Whether a lease has ended, by this machine's clock (the database's decides for claims).
pub fn expired(lease: Option<SystemTime>) -> bool {
    lease.is_some_and(|l| l < SystemTime::now())
}
