//! `leasefs top`: a live view of a mount's leases.
//!
//! Plain ANSI escapes and termios, no terminal crate: the view is one
//! table redrawn whole (home, lines each ending in clear-to-end-of-line,
//! clear-to-end-of-screen), which every terminal since the VT100 and every
//! `ssh` session understands, and the keys are single bytes (`q`, `/`,
//! Enter, Esc, Backspace). A crate such as ratatui with crossterm would add
//! some thirty crates to the build for that.
//!
//! Rows come from `.leasefs/leases`, the rates from the counters of
//! `.leasefs/metrics` (differences between two reads), and every event on
//! `.leasefs/events` makes it redraw at once (at most every 100 ms), so a
//! grant or a break is on screen well within a second.

use std::io::{Read, Write};
use std::os::fd::AsRawFd;
use std::path::Path;
use std::process::ExitCode;
use std::time::{Duration, Instant};

/// What `leasefs top` was asked.
pub struct TopSpec<'a> {
    pub mount: &'a Path,
    /// Time between refreshes.
    pub delay: Duration,
    /// Stop after this many refreshes.
    pub iterations: Option<u64>,
    /// Only leases whose path contains this.
    pub filter: String,
}

/// The soonest an event redraws after the last frame.
const EVENT_REDRAW: Duration = Duration::from_millis(100);

/// One lease as the view shows it.
#[derive(Debug, Clone, PartialEq)]
pub struct Row {
    pub path: String,
    pub holder: String,
    pub mode: String,
    pub epoch: u64,
    /// How long the oldest holder has held it (ms).
    pub held_ms: Option<u64>,
    pub waiters: u64,
    /// Until the TTL runs out (ms).
    pub ttl_ms: Option<i64>,
}

impl Row {
    pub fn of(v: &serde_json::Value) -> Row {
        let holders = v["holders"].as_array().cloned().unwrap_or_default();
        let first = holders.first();
        let holder = first.map_or(String::new(), |h| {
            let mut who = match h["comm"].as_str() {
                Some(c) => format!("{}/{c}", h["pid"]),
                None => h["pid"].to_string(),
            };
            if let Some(host) = h["host"].as_str() {
                who = format!("{who}@{host}");
            }
            if holders.len() > 1 {
                who = format!("{who}+{}", holders.len() - 1);
            }
            who
        });
        Row {
            path: v["path"].as_str().unwrap_or("").to_string(),
            holder,
            mode: first.and_then(|h| h["mode"].as_str()).unwrap_or("").to_string(),
            epoch: v["epoch"].as_u64().unwrap_or(0),
            held_ms: holders.iter().filter_map(|h| h["since_ms_ago"].as_u64()).max(),
            waiters: v["waiters"].as_u64().unwrap_or(0),
            ttl_ms: v["expires_in_ms"].as_i64(),
        }
    }
}

/// Most waiters first, then the longest held, then by path.
pub fn sort(rows: &mut [Row]) {
    rows.sort_by(|a, b| {
        b.waiters.cmp(&a.waiters).then(b.held_ms.unwrap_or(0).cmp(&a.held_ms.unwrap_or(0))).then(a.path.cmp(&b.path))
    });
}

/// Counters behind the rates in the header.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Counters {
    pub grants: u64,
    pub breaks: u64,
    pub fences: u64,
}

impl Counters {
    /// From the Prometheus text of `.leasefs/metrics`.
    pub fn parse(metrics: &str) -> Counters {
        let value = |name: &str| {
            metrics
                .lines()
                .find(|l| l.starts_with(name) && l[name.len()..].starts_with(['{', ' ']))
                .and_then(|l| l.rsplit(' ').next())
                .and_then(|v| v.parse().ok())
                .unwrap_or(0)
        };
        Counters {
            grants: value("leasefs_acquisitions_total"),
            breaks: value("leasefs_breaks_total"),
            fences: value("leasefs_fenced_operations_total"),
        }
    }
}

/// Per-second rates between two reads of the counters.
fn rates(before: Counters, after: Counters, secs: f64) -> [f64; 3] {
    let r = |a: u64, b: u64| if secs > 0.0 { b.saturating_sub(a) as f64 / secs } else { 0.0 };
    [r(before.grants, after.grants), r(before.breaks, after.breaks), r(before.fences, after.fences)]
}

/// What one refresh shows.
pub struct Frame {
    pub clock: String,
    pub rates: [f64; 3],
    pub rows: Vec<Row>,
    /// Leases held and awaited on the whole mount (before the filter).
    pub held: usize,
    pub awaited: usize,
    pub filter: String,
}

const HEADER: [&str; 7] = ["PATH", "HOLDER", "MODE", "EPOCH", "HELD", "WAITERS", "TTL"];
/// Widths of every column but the path, which takes what is left.
const WIDTHS: [usize; 6] = [18, 9, 7, 7, 7, 8];

/// `text` in at most `w` columns: a long path keeps its end.
fn fit(text: &str, w: usize, keep_end: bool) -> String {
    let n = text.chars().count();
    if n <= w {
        return text.to_string();
    }
    if w == 0 {
        return String::new();
    }
    if keep_end {
        let tail: String = text.chars().skip(n - (w - 1)).collect();
        format!("…{tail}")
    } else {
        let head: String = text.chars().take(w - 1).collect();
        format!("{head}…")
    }
}

fn cells(r: &Row) -> [String; 7] {
    let dash = |s: &str| if s.is_empty() { "-".to_string() } else { s.to_string() };
    [
        r.path.clone(),
        dash(&r.holder),
        dash(&r.mode),
        r.epoch.to_string(),
        r.held_ms.map_or("-".into(), crate::age),
        r.waiters.to_string(),
        r.ttl_ms.map_or("-".into(), |ms| crate::age(ms.max(0) as u64)),
    ]
}

/// One table line in `width` columns.
fn line(c: &[String; 7], width: usize) -> String {
    let fixed: usize = WIDTHS.iter().sum::<usize>() + WIDTHS.len();
    let path_w = width.saturating_sub(fixed).max(8);
    let mut out = format!("{:<path_w$}", fit(&c[0], path_w, true));
    for (i, w) in WIDTHS.iter().enumerate() {
        out.push(' ');
        out += &format!("{:<w$}", fit(&c[i + 1], *w, false));
    }
    fit(out.trim_end(), width, false)
}

impl Frame {
    fn header(&self) -> String {
        let [g, b, f] = self.rates;
        format!(
            "{}  held {}  awaited {}  grants {g:.1}/s  breaks {b:.1}/s  fences {f:.1}/s",
            self.clock, self.held, self.awaited
        )
    }

    /// The screen: `height` lines of at most `width` columns each.
    pub fn screen(&self, mount: &str, width: usize, height: usize, editing: Option<&str>) -> Vec<String> {
        let title = match self.filter.as_str() {
            "" => format!("leasefs top {mount}"),
            f => format!("leasefs top {mount}  (filter: {f})"),
        };
        let mut out = vec![fit(&title, width, false), fit(&self.header(), width, false)];
        out.push(line(&HEADER.map(String::from), width));
        let room = height.saturating_sub(out.len() + 1);
        let shown = self.rows.len().min(room);
        out.extend(self.rows[..shown].iter().map(|r| line(&cells(r), width)));
        while out.len() + 1 < height {
            out.push(String::new());
        }
        let footer = match editing {
            Some(text) => format!("filter by path: {text}_   (Enter: apply, Esc: cancel)"),
            None if shown < self.rows.len() => {
                format!("q quit  / filter   ({} more below)", self.rows.len() - shown)
            }
            None => "q quit  / filter".to_string(),
        };
        out.push(fit(&footer, width, false));
        out.truncate(height.max(1));
        out
    }

    /// Plain text for a pipe: the header, the column names and every row.
    pub fn batch(&self) -> String {
        let mut out = self.header();
        if !self.filter.is_empty() {
            out += &format!("  filter: {}", self.filter);
        }
        out += "\n";
        // Paths in full: the path column is as wide as the longest.
        let path_w = self.rows.iter().map(|r| r.path.chars().count()).max().unwrap_or(0).max(8);
        let width = path_w + WIDTHS.iter().sum::<usize>() + WIDTHS.len();
        out += &(line(&HEADER.map(String::from), width) + "\n");
        for r in &self.rows {
            out += &(line(&cells(r), width) + "\n");
        }
        out
    }
}

/// The rates are over about this long (several frames when events redraw
/// often), so a break stays visible for a while instead of for one frame.
const RATE_WINDOW: Duration = Duration::from_secs(2);

/// Reads the mount's control files.
struct Source<'a> {
    mount: &'a Path,
    /// Counters read at each frame, the oldest just over [`RATE_WINDOW`] ago.
    samples: std::collections::VecDeque<(Instant, Counters)>,
}

impl Source<'_> {
    fn frame(&mut self, filter: &str) -> Result<Frame, String> {
        let read = |name: &str| {
            let p = self.mount.join(".leasefs").join(name);
            std::fs::read_to_string(&p).map_err(|e| format!("{}: {e}", p.display()))
        };
        let leases = read("leases")?;
        let counters = Counters::parse(&read("metrics")?);
        let now = Instant::now();
        self.samples.push_back((now, counters));
        while self.samples.len() > 2 && now.duration_since(self.samples[1].0) >= RATE_WINDOW {
            self.samples.pop_front();
        }
        let (t, c) = self.samples[0];
        let rates = rates(c, counters, now.duration_since(t).as_secs_f64());
        let all: Vec<Row> = leases
            .lines()
            .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
            .map(|v| Row::of(&v))
            .collect();
        let held = all.iter().filter(|r| !r.holder.is_empty()).count();
        let awaited = all.iter().filter(|r| r.waiters > 0).count();
        let mut rows: Vec<Row> = all.into_iter().filter(|r| r.path.contains(filter)).collect();
        sort(&mut rows);
        Ok(Frame { clock: clock(), rates, rows, held, awaited, filter: filter.to_string() })
    }
}

/// The local time of day, `HH:MM:SS`.
fn clock() -> String {
    // SAFETY: time and localtime_r with our own buffers.
    unsafe {
        let t = libc::time(std::ptr::null_mut());
        let mut tm: libc::tm = std::mem::zeroed();
        libc::localtime_r(&t, &mut tm);
        format!("{:02}:{:02}:{:02}", tm.tm_hour, tm.tm_min, tm.tm_sec)
    }
}

/// The terminal in the view's mode (no echo, keys as typed, the alternate
/// screen, no cursor) until dropped, also when the view panics.
struct Terminal {
    saved: Option<libc::termios>,
}

impl Terminal {
    fn enter() -> Terminal {
        // SAFETY: tcgetattr/tcsetattr on fd 0 with a termios we own.
        let saved = unsafe {
            let mut t: libc::termios = std::mem::zeroed();
            (libc::isatty(0) == 1 && libc::tcgetattr(0, &mut t) == 0).then(|| {
                let mut raw = t;
                raw.c_lflag &= !(libc::ICANON | libc::ECHO);
                raw.c_cc[libc::VMIN] = 0;
                raw.c_cc[libc::VTIME] = 0;
                libc::tcsetattr(0, libc::TCSANOW, &raw);
                t
            })
        };
        print!("\x1b[?1049h\x1b[?25l");
        let _ = std::io::stdout().flush();
        Terminal { saved }
    }
}

impl Drop for Terminal {
    fn drop(&mut self) {
        print!("\x1b[?25h\x1b[?1049l");
        let _ = std::io::stdout().flush();
        if let Some(t) = &self.saved {
            // SAFETY: restoring the attributes read in `enter`.
            unsafe { libc::tcsetattr(0, libc::TCSANOW, t) };
        }
    }
}

/// Columns and rows of the terminal on stdout (80x24 when it says none).
fn size() -> (usize, usize) {
    // SAFETY: TIOCGWINSZ fills a winsize we own.
    let ws = unsafe {
        let mut ws: libc::winsize = std::mem::zeroed();
        (libc::ioctl(1, libc::TIOCGWINSZ, &mut ws) == 0).then_some(ws)
    };
    match ws {
        Some(w) if w.ws_col > 0 && w.ws_row > 0 => (w.ws_col as usize, w.ws_row as usize),
        _ => (80, 24),
    }
}

fn drain(f: &mut impl Read) -> Vec<u8> {
    let mut buf = [0u8; 64 * 1024];
    let mut out = Vec::new();
    while let Ok(n) = f.read(&mut buf) {
        if n == 0 {
            break;
        }
        out.extend_from_slice(&buf[..n]);
        if n < buf.len() {
            break;
        }
    }
    out
}

fn fail(msg: String) -> ExitCode {
    eprintln!("leasefs: {msg}");
    ExitCode::FAILURE
}

/// The filter being typed after `/`.
enum Keys {
    Normal,
    Editing(String),
}

/// What a key typed into the view does.
enum Typed {
    Quit,
    Redraw,
    Nothing,
}

impl Keys {
    /// Take the key `b`: `q` quits, `/` starts a filter, which Enter
    /// applies to `filter` and Escape abandons.
    fn typed(&mut self, filter: &mut String, b: u8) -> Typed {
        match (&mut *self, b) {
            (Keys::Normal, b'q' | b'Q') => Typed::Quit,
            (Keys::Normal, b'/') => {
                *self = Keys::Editing(String::new());
                Typed::Redraw
            }
            (Keys::Normal, _) => Typed::Nothing,
            (Keys::Editing(t), b'\r' | b'\n') => {
                *filter = std::mem::take(t);
                *self = Keys::Normal;
                Typed::Redraw
            }
            (Keys::Editing(_), 0x1b) => {
                *self = Keys::Normal;
                Typed::Redraw
            }
            (Keys::Editing(t), 0x7f | 0x08) => {
                t.pop();
                Typed::Redraw
            }
            (Keys::Editing(t), c) if (0x20..0x7f).contains(&c) => {
                t.push(c as char);
                Typed::Redraw
            }
            (Keys::Editing(_), _) => Typed::Nothing,
        }
    }
}

/// The terminal output that redraws the whole screen with `frame`.
fn paint(frame: &Frame, mount_text: &str, editing: Option<&str>) -> String {
    let (w, h) = size();
    let lines = frame.screen(mount_text, w, h, editing);
    let mut out = String::from("\x1b[H");
    for (i, l) in lines.iter().enumerate() {
        out += l;
        out += "\x1b[K";
        if i + 1 < lines.len() {
            out += "\r\n";
        }
    }
    out += "\x1b[J";
    out
}

/// The mount's event stream, non-blocking (it only wakes the view).
fn open_events(mount: &Path) -> Option<std::fs::File> {
    let events = std::fs::File::open(mount.join(".leasefs/events")).ok()?;
    // SAFETY: making our own descriptor non-blocking.
    unsafe { libc::fcntl(events.as_raw_fd(), libc::F_SETFL, libc::O_NONBLOCK) };
    Some(events)
}

/// Run the view until `q`, a signal, or `iterations` refreshes.
pub fn top(spec: &TopSpec) -> ExitCode {
    let mount_text = spec.mount.display().to_string();
    let mut source = Source { mount: spec.mount, samples: Default::default() };
    // SIGINT, SIGTERM, SIGHUP end the view; SIGWINCH redraws it.
    let sigs = match crate::wakeup::catch(&[libc::SIGINT, libc::SIGTERM, libc::SIGHUP, libc::SIGWINCH]) {
        Ok(fd) => fd,
        Err(e) => return fail(format!("signals: {e}")),
    };
    // Events only wake the view; a mount without them still refreshes.
    let mut events = open_events(spec.mount);
    // SAFETY: isatty on fds 0 and 1.
    let (tty_out, tty_in) = unsafe { (libc::isatty(1) == 1, libc::isatty(0) == 1) };
    let mut filter = spec.filter.clone();
    let mut keys = Keys::Normal;
    let mut count = 0u64;
    // A first read, so the first frame already has rates to show.
    let _ = source.frame(&filter);
    std::thread::sleep(Duration::from_millis(200).min(spec.delay));
    let term = tty_out.then(Terminal::enter);
    let mut stdout = std::io::stdout();
    let mut stdin = std::io::stdin();
    loop {
        let frame = match source.frame(&filter) {
            Ok(f) => f,
            Err(e) => {
                drop(term);
                return fail(e);
            }
        };
        if tty_out {
            let editing = match &keys {
                Keys::Editing(t) => Some(t.as_str()),
                Keys::Normal => None,
            };
            let _ = stdout.write_all(paint(&frame, &mount_text, editing).as_bytes());
        } else {
            if stdout.write_all((frame.batch() + "\n").as_bytes()).is_err() {
                return ExitCode::SUCCESS;
            }
        }
        let _ = stdout.flush();
        count += 1;
        if spec.iterations.is_some_and(|n| count >= n) {
            return ExitCode::SUCCESS;
        }
        let drawn = Instant::now();
        let due = drawn + spec.delay;
        // Wait for the next refresh, a key, an event (redraw soon) or a signal.
        loop {
            let mut fds = vec![sigs];
            if tty_in && tty_out {
                fds.push(0);
            }
            if let Some(e) = &events {
                fds.push(e.as_raw_fd());
            }
            let left = due.saturating_duration_since(Instant::now());
            if left.is_zero() {
                break;
            }
            let ready = crate::wakeup::readable(&fds, Some(left));
            if ready[0] {
                crate::wakeup::drain(sigs);
                let sig = crate::wakeup::take_signal();
                if sig == libc::SIGWINCH {
                    break;
                }
                if sig != 0 {
                    return ExitCode::SUCCESS;
                }
            }
            if tty_in && tty_out && ready[1] {
                let mut redraw = false;
                for b in drain(&mut stdin) {
                    match keys.typed(&mut filter, b) {
                        Typed::Quit => return ExitCode::SUCCESS,
                        Typed::Redraw => redraw = true,
                        Typed::Nothing => {}
                    }
                }
                if redraw {
                    break;
                }
            }
            if events.is_some() && ready[ready.len() - 1] {
                let e = events.as_mut().expect("checked");
                let got = drain(e);
                if got.is_empty() {
                    // The stream ended (unmounted): stop listening.
                    events = None;
                }
                // Redraw soon, but not more than every EVENT_REDRAW.
                std::thread::sleep(EVENT_REDRAW.saturating_sub(drawn.elapsed()));
                break;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(path: &str, waiters: u64, held: u64) -> Row {
        Row {
            path: path.into(),
            holder: "1/x".into(),
            mode: "exclusive".into(),
            epoch: 1,
            held_ms: Some(held),
            waiters,
            ttl_ms: None,
        }
    }

    #[test]
    fn rows_sort_by_waiters_then_age() {
        let mut rows = vec![row("/a", 0, 10), row("/b", 2, 5), row("/c", 0, 99), row("/d", 2, 50)];
        sort(&mut rows);
        let order: Vec<&str> = rows.iter().map(|r| r.path.as_str()).collect();
        assert_eq!(order, ["/d", "/b", "/c", "/a"]);
    }

    #[test]
    fn a_lease_row_shows_holder_mode_epoch_and_ttl() {
        let v = serde_json::json!({"path": "/jobs/a", "epoch": 7, "waiters": 2, "expires_in_ms": 1500,
            "holders": [{"pid": 42, "comm": "flock", "mode": "shared", "since_ms_ago": 3000},
                        {"pid": 43, "comm": "sh", "mode": "shared", "since_ms_ago": 100}]});
        let r = Row::of(&v);
        assert_eq!(r.holder, "42/flock+1");
        assert_eq!(
            (r.mode.as_str(), r.epoch, r.held_ms, r.waiters, r.ttl_ms),
            ("shared", 7, Some(3000), 2, Some(1500))
        );
        assert_eq!(cells(&r)[4], "3.0s");
        assert_eq!(cells(&r)[6], "1.5s");
    }

    #[test]
    fn counters_come_from_the_metrics_and_rates_from_two_reads() {
        let text = "# HELP x\nleasefs_acquisitions_total{mount=\"/m\"} 12\nleasefs_breaks_total{mount=\"/m\"} 3\n\
                    leasefs_fenced_operations_total{mount=\"/m\"} 1\n";
        let c = Counters::parse(text);
        assert_eq!(c, Counters { grants: 12, breaks: 3, fences: 1 });
        assert_eq!(rates(Counters::default(), c, 2.0), [6.0, 1.5, 0.5]);
    }

    #[test]
    fn the_screen_fits_80_by_24_and_says_what_it_left_out() {
        let long = format!("/{}", "deep/".repeat(30));
        let mut rows: Vec<Row> = (0..40).map(|i| row(&format!("/l{i}"), 0, i)).collect();
        rows.insert(0, row(&long, 3, 1));
        let f = Frame {
            clock: "12:00:00".into(),
            rates: [1.0, 0.0, 0.0],
            rows,
            held: 41,
            awaited: 1,
            filter: String::new(),
        };
        let s = f.screen("/run/leases", 80, 24, None);
        assert_eq!(s.len(), 24);
        assert!(s.iter().all(|l| l.chars().count() <= 80), "{s:#?}");
        assert!(s[3].starts_with('…') && s[3].contains(" 3 "), "a long path keeps its end: {}", s[3]);
        assert!(s[23].contains("(21 more below)"), "{}", s[23]);
        assert!(s[1].contains("grants 1.0/s"));
        let e = f.screen("/run/leases", 80, 24, Some("jo"));
        assert!(e[23].starts_with("filter by path: jo_"), "{}", e[23]);
    }
}
