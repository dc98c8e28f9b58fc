//! `--metrics-addr HOST:PORT`: the metrics served over HTTP at `/metrics`
//! for Prometheus, by one thread (a scrape is a few hundred bytes; requests
//! are answered one at a time, each bounded by a 5 s socket timeout).

use std::io::{BufRead, BufReader, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::{Arc, Weak};
use std::time::Duration;

use leasefs::fs::Fs;

/// Bind `addr` (before the filesystem starts, so it can say where its
/// metrics are served); the listener and the address bound (the port when
/// `:0` was asked).
pub fn bind(addr: &str) -> std::io::Result<(TcpListener, SocketAddr)> {
    let listener = TcpListener::bind(addr)?;
    let bound = listener.local_addr()?;
    Ok((listener, bound))
}

/// Serve `/metrics` from `fs` on `listener` until the filesystem is gone.
pub fn serve(listener: TcpListener, fs: &Arc<Fs>) -> std::io::Result<()> {
    let fs = Arc::downgrade(fs);
    std::thread::Builder::new().name("metrics-http".into()).spawn(move || {
        for conn in listener.incoming() {
            let Ok(conn) = conn else { continue };
            if let Err(e) = answer(conn, &fs) {
                tracing::debug!("metrics request: {e}");
            }
            if fs.strong_count() == 0 {
                return;
            }
        }
    })?;
    Ok(())
}

fn answer(mut conn: TcpStream, fs: &Weak<Fs>) -> std::io::Result<()> {
    conn.set_read_timeout(Some(Duration::from_secs(5)))?;
    conn.set_write_timeout(Some(Duration::from_secs(5)))?;
    let mut reader = BufReader::new(conn.try_clone()?);
    let mut request = String::new();
    reader.read_line(&mut request)?;
    // Skip the headers.
    let mut line = String::new();
    while reader.read_line(&mut line)? > 2 {
        line.clear();
    }
    let mut parts = request.split_whitespace();
    let (method, path) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
    let (status, kind, body) = match (method, path.split('?').next().unwrap_or("")) {
        ("GET" | "HEAD", "/metrics") => match fs.upgrade() {
            Some(fs) => ("200 OK", "text/plain; version=0.0.4; charset=utf-8", fs.metrics()),
            None => ("503 Service Unavailable", "text/plain", "unmounted\n".to_string()),
        },
        ("GET" | "HEAD", _) => ("404 Not Found", "text/plain", "only /metrics is served here\n".to_string()),
        _ => ("405 Method Not Allowed", "text/plain", "GET /metrics\n".to_string()),
    };
    let head = format!(
        "HTTP/1.1 {status}\r\nContent-Type: {kind}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    conn.write_all(head.as_bytes())?;
    if method != "HEAD" {
        conn.write_all(body.as_bytes())?;
    }
    conn.flush()
}
