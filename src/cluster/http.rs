//! The smallest HTTP/1.1 client etcd's v3 JSON gateway needs: `POST` with a
//! JSON body over a kept-alive TCP connection, bodies framed by
//! `Content-Length` or chunked, and a streamed chunked body read line by
//! line (watch). Every read and write is bounded by a deadline, so a
//! silent or half-dead member turns into `TimedOut`, never a hang.

use std::io::{self, Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::time::{Duration, Instant};

/// One connection to one endpoint (`host:port`).
pub struct Conn {
    stream: TcpStream,
    host: String,
    /// Bytes read from the socket and not yet parsed.
    raw: Vec<u8>,
}

/// A response: status code and (de-chunked) body.
pub struct Response {
    pub status: u16,
    pub body: Vec<u8>,
}

fn timed_out() -> io::Error {
    io::Error::new(io::ErrorKind::TimedOut, "no answer in time")
}

fn left(deadline: Instant) -> io::Result<Duration> {
    match deadline.checked_duration_since(Instant::now()) {
        Some(d) if !d.is_zero() => Ok(d),
        _ => Err(timed_out()),
    }
}

fn bad(what: &str) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, format!("bad HTTP response: {what}"))
}

impl Conn {
    /// Connect to `host` (`127.0.0.1:2379`) before `deadline`.
    pub fn connect(host: &str, deadline: Instant) -> io::Result<Conn> {
        let mut last = io::Error::new(io::ErrorKind::AddrNotAvailable, format!("{host}: no address"));
        for addr in host.to_socket_addrs()? {
            match TcpStream::connect_timeout(&addr, left(deadline)?) {
                Ok(stream) => {
                    stream.set_nodelay(true)?;
                    return Ok(Conn { stream, host: host.to_string(), raw: Vec::new() });
                }
                Err(e) => last = e,
            }
        }
        Err(last)
    }

    /// The endpoint this connection goes to.
    pub fn host(&self) -> &str {
        &self.host
    }

    fn send(&mut self, path: &str, body: &[u8], deadline: Instant) -> io::Result<()> {
        let head = format!(
            "POST {path} HTTP/1.1\r\nHost: {}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
            self.host,
            body.len()
        );
        self.stream.set_write_timeout(Some(left(deadline)?))?;
        let mut msg = head.into_bytes();
        msg.extend_from_slice(body);
        self.stream.write_all(&msg).map_err(|e| if e.kind() == io::ErrorKind::WouldBlock { timed_out() } else { e })
    }

    /// Read more bytes into `raw`, waiting at most until `deadline`.
    ///
    /// A read on a socket with a receive timeout is never restarted by the
    /// kernel: a signal to the thread, or the daemon being stopped and
    /// continued (`SIGSTOP`/`SIGCONT`, a debugger or `strace` attaching),
    /// ends it with `EINTR` (signal(7)). That is not the connection's
    /// fault: the read is made again with what is left of the deadline, so
    /// an answer etcd sent is not reported lost (a write would otherwise
    /// be `Indeterminate`, its caller's call `EIO`, and a watch would be
    /// opened again).
    fn fill(&mut self, deadline: Instant) -> io::Result<()> {
        let mut buf = [0u8; 16 * 1024];
        loop {
            self.stream.set_read_timeout(Some(left(deadline)?))?;
            return match self.stream.read(&mut buf) {
                Ok(0) => Err(io::Error::new(io::ErrorKind::UnexpectedEof, "connection closed")),
                Ok(n) => {
                    self.raw.extend_from_slice(&buf[..n]);
                    Ok(())
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) if matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut) => Err(timed_out()),
                Err(e) => Err(e),
            };
        }
    }

    /// Status line and headers; returns the status and how the body is framed.
    fn head(&mut self, deadline: Instant) -> io::Result<(u16, Framing)> {
        let end = loop {
            if let Some(i) = self.raw.windows(4).position(|w| w == b"\r\n\r\n") {
                break i;
            }
            if self.raw.len() > 64 * 1024 {
                return Err(bad("headers too long"));
            }
            self.fill(deadline)?;
        };
        let head = String::from_utf8_lossy(&self.raw[..end]).into_owned();
        self.raw.drain(..end + 4);
        let mut lines = head.split("\r\n");
        let status = lines
            .next()
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|s| s.parse().ok())
            .ok_or_else(|| bad("status line"))?;
        let mut framing = Framing::Close;
        for l in lines {
            let Some((k, v)) = l.split_once(':') else { continue };
            let (k, v) = (k.trim().to_ascii_lowercase(), v.trim());
            if k == "content-length" {
                framing = Framing::Length(v.parse().map_err(|_| bad("content-length"))?);
            } else if k == "transfer-encoding" && v.eq_ignore_ascii_case("chunked") {
                framing = Framing::Chunked;
            }
        }
        Ok((status, framing))
    }

    /// `POST path` with `body`; the whole response before `deadline`.
    /// The connection can be used again afterwards.
    pub fn post(&mut self, path: &str, body: &[u8], deadline: Instant) -> io::Result<Response> {
        self.send(path, body, deadline)?;
        let (status, framing) = self.head(deadline)?;
        let body = match framing {
            Framing::Length(n) => {
                while self.raw.len() < n {
                    self.fill(deadline)?;
                }
                self.raw.drain(..n).collect()
            }
            Framing::Chunked => {
                let mut out = Vec::new();
                while !self.chunk(&mut out, deadline)? {}
                out
            }
            // etcd always frames its answers; an unframed one cannot be reused.
            Framing::Close => return Err(bad("unframed body")),
        };
        Ok(Response { status, body })
    }

    /// Decode one chunk into `out`; true after the last (empty) chunk.
    fn chunk(&mut self, out: &mut Vec<u8>, deadline: Instant) -> io::Result<bool> {
        loop {
            if let Some(last) = self.try_chunk(out)? {
                return Ok(last);
            }
            self.fill(deadline)?;
        }
    }

    /// `POST path` with `body` and keep reading the chunked answer as a
    /// stream of lines (etcd's watch: one JSON object per line).
    pub fn stream(mut self, path: &str, body: &[u8], deadline: Instant) -> io::Result<LineStream> {
        self.send(path, body, deadline)?;
        let (status, framing) = self.head(deadline)?;
        if status != 200 || framing != Framing::Chunked {
            return Err(bad(&format!("stream answered {status}")));
        }
        Ok(LineStream { conn: self, decoded: Vec::new(), ended: false })
    }
}

#[derive(PartialEq, Eq, Clone, Copy)]
enum Framing {
    Length(usize),
    Chunked,
    Close,
}

/// The lines of a streamed response.
pub struct LineStream {
    conn: Conn,
    decoded: Vec<u8>,
    ended: bool,
}

impl LineStream {
    /// The next whole line, waiting at most `wait`: `Ok(None)` when none
    /// came in time (call again; nothing is lost), an error when the stream
    /// ended or broke.
    pub fn next_line(&mut self, wait: Duration) -> io::Result<Option<Vec<u8>>> {
        let deadline = Instant::now() + wait;
        loop {
            if let Some(i) = self.decoded.iter().position(|&b| b == b'\n') {
                let line: Vec<u8> = self.decoded.drain(..=i).collect();
                return Ok(Some(line));
            }
            if self.ended {
                return Err(io::Error::new(io::ErrorKind::UnexpectedEof, "stream ended"));
            }
            // Parse what is buffered without waiting; wait only for more bytes.
            match self.conn.try_chunk(&mut self.decoded) {
                Ok(Some(last)) => {
                    self.ended = last;
                    continue;
                }
                Ok(None) => {}
                Err(e) => return Err(e),
            }
            match self.conn.fill(deadline) {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::TimedOut => return Ok(None),
                Err(e) => return Err(e),
            }
        }
    }

    /// Stop the stream (closes the connection).
    pub fn close(self) {
        let _ = self.conn.stream.shutdown(std::net::Shutdown::Both);
    }
}

impl Conn {
    /// Decode one chunk if it is wholly buffered: `Some(true)` for the last.
    fn try_chunk(&mut self, out: &mut Vec<u8>) -> io::Result<Option<bool>> {
        let Some(line_end) = self.raw.windows(2).position(|w| w == b"\r\n") else { return Ok(None) };
        let size_text = String::from_utf8_lossy(&self.raw[..line_end]).into_owned();
        let size = usize::from_str_radix(size_text.split(';').next().unwrap_or("").trim(), 16)
            .map_err(|_| bad("chunk size"))?;
        if self.raw.len() < line_end + 2 + size + 2 {
            return Ok(None);
        }
        out.extend_from_slice(&self.raw[line_end + 2..line_end + 2 + size]);
        self.raw.drain(..line_end + 2 + size + 2);
        Ok(Some(size == 0))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::TcpListener;

    /// A one-shot server answering with `reply` after reading a request.
    fn serve(reply: &'static [u8], pieces: usize) -> String {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap().to_string();
        std::thread::spawn(move || {
            let (mut s, _) = l.accept().unwrap();
            let mut buf = [0u8; 4096];
            let _ = s.read(&mut buf);
            // Send in pieces so parsing has to resume mid-frame.
            let step = reply.len().div_ceil(pieces);
            for p in reply.chunks(step) {
                s.write_all(p).unwrap();
                std::thread::sleep(Duration::from_millis(5));
            }
            std::thread::sleep(Duration::from_millis(200));
        });
        addr
    }

    fn soon() -> Instant {
        Instant::now() + Duration::from_secs(5)
    }

    #[test]
    fn bodies_framed_by_length_or_chunks_are_read_whole_even_in_pieces() {
        let addr = serve(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello", 7);
        let r = Conn::connect(&addr, soon()).unwrap().post("/x", b"{}", soon()).unwrap();
        assert_eq!((r.status, r.body.as_slice()), (200, &b"hello"[..]));
        let addr = serve(
            b"HTTP/1.1 404 Not Found\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n2;x=1\r\nde\r\n0\r\n\r\n",
            9,
        );
        let r = Conn::connect(&addr, soon()).unwrap().post("/x", b"{}", soon()).unwrap();
        assert_eq!((r.status, r.body.as_slice()), (404, &b"abcde"[..]));
    }

    #[test]
    fn a_stream_yields_whole_lines_and_a_silent_server_times_out_without_losing_data() {
        let addr = serve(
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n4\r\n{a}\n\r\n6\r\n{b}\n{c\r\n3\r\n}\n\n\r\n",
            11,
        );
        let mut s = Conn::connect(&addr, soon()).unwrap().stream("/w", b"{}", soon()).unwrap();
        let mut lines = Vec::new();
        while lines.len() < 4 {
            if let Some(l) = s.next_line(Duration::from_secs(5)).unwrap() {
                lines.push(String::from_utf8(l).unwrap());
            }
        }
        assert_eq!(lines, ["{a}\n", "{b}\n", "{c}\n", "\n"]);
        // Nothing more comes: a bounded wait answers None instead of hanging.
        assert!(s.next_line(Duration::from_millis(50)).unwrap().is_none());
    }

    extern "C" fn nothing(_: libc::c_int) {}

    #[test]
    fn a_signal_during_a_read_does_not_lose_the_answer() {
        // A handler that does nothing: the blocked read ends with EINTR
        // (a socket with a receive timeout is never restarted), as it does
        // when the daemon is stopped and continued.
        let sig = libc::SIGRTMIN() + 7;
        // SAFETY: installs a handler that does nothing, for a real-time
        // signal no other code of this test binary uses.
        unsafe {
            let mut sa: libc::sigaction = std::mem::zeroed();
            sa.sa_sigaction = nothing as extern "C" fn(libc::c_int) as usize;
            sa.sa_flags = libc::SA_RESTART;
            assert_eq!(libc::sigaction(sig, &sa, std::ptr::null_mut()), 0);
        }
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap().to_string();
        let (tx, rx) = std::sync::mpsc::channel();
        let server = std::thread::spawn(move || {
            let (mut s, _) = l.accept().unwrap();
            let mut buf = [0u8; 4096];
            let _ = s.read(&mut buf);
            // The client is now blocked reading: interrupt it, twice.
            let client: libc::pthread_t = rx.recv().unwrap();
            for _ in 0..2 {
                std::thread::sleep(Duration::from_millis(100));
                // SAFETY: the client thread is alive (it joins this one).
                assert_eq!(unsafe { libc::pthread_kill(client, sig) }, 0);
            }
            std::thread::sleep(Duration::from_millis(100));
            s.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok").unwrap();
        });
        // SAFETY: pthread_self has no preconditions.
        tx.send(unsafe { libc::pthread_self() }).unwrap();
        let r = Conn::connect(&addr, soon()).unwrap().post("/x", b"{}", soon());
        server.join().unwrap();
        let r = r.expect("an interrupted read is made again");
        assert_eq!((r.status, r.body.as_slice()), (200, &b"ok"[..]));
    }

    #[test]
    fn a_server_that_never_answers_is_a_timeout_not_a_hang() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap().to_string();
        let started = Instant::now();
        let e = Conn::connect(&addr, soon())
            .unwrap()
            .post("/x", b"{}", Instant::now() + Duration::from_millis(100))
            .err()
            .unwrap();
        assert_eq!(e.kind(), io::ErrorKind::TimedOut);
        assert!(started.elapsed() < Duration::from_secs(3));
        drop(l);
    }
}
