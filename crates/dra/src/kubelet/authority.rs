//! The kubelet's plugin watcher dials a registration socket naming its path as the HTTP/2
//! `:authority` (`/var/lib/kubelet/plugins_registry/plexus.dev-reg.sock`), which is no authority,
//! and h2 — the HTTP/2 of tonic — refuses such a request with PROTOCOL_ERROR (hyperium/h2#487).
//! [`LocalAuthority`] sits between the socket and the server and rewrites the `:authority` of
//! each request the client sends to `localhost`, what gRPC clients send on unix sockets: the
//! client's header blocks are decoded (HPACK, with the client's dynamic table) and encoded again
//! for the server (with a table of its own); every other frame, and everything the server sends,
//! passes untouched.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
const HEADERS: u8 = 0x1;
const CONTINUATION: u8 = 0x9;
const END_STREAM: u8 = 0x1;
const END_HEADERS: u8 = 0x4;
const PADDED: u8 = 0x8;
const PRIORITY: u8 = 0x20;
/// The largest frame a client may send before it has seen the server's settings (RFC 9113 §4.2),
/// and the largest header block kept: a kubelet's requests are a few hundred bytes.
const MAX_FRAME: usize = 16_384;
const MAX_BLOCK: usize = 64 * 1024;

/// A header block being gathered: its stream, whether the request ends with it, its fragments.
struct Block {
    stream: u32,
    end_stream: bool,
    bytes: Vec<u8>,
}

/// A connection whose client requests name `localhost` as their authority.
pub struct LocalAuthority<S> {
    inner: S,
    /// Bytes read from the client, not yet a whole frame.
    raw: Vec<u8>,
    /// Bytes ready for the server.
    ready: Vec<u8>,
    preface_seen: bool,
    block: Option<Block>,
    decoder: loona_hpack::Decoder<'static>,
    encoder: loona_hpack::Encoder<'static>,
    eof: bool,
}

impl<S> LocalAuthority<S> {
    pub fn new(inner: S) -> LocalAuthority<S> {
        LocalAuthority {
            inner,
            raw: Vec::new(),
            ready: Vec::new(),
            preface_seen: false,
            block: None,
            decoder: loona_hpack::Decoder::new(),
            encoder: loona_hpack::Encoder::new(),
            eof: false,
        }
    }

    pub fn get_ref(&self) -> &S {
        &self.inner
    }

    /// Move every whole frame of `raw` to `ready`, header blocks rewritten.
    fn process(&mut self) -> io::Result<()> {
        if !self.preface_seen {
            if self.raw.len() < PREFACE.len() {
                return Ok(());
            }
            if &self.raw[..PREFACE.len()] != PREFACE {
                return Err(io::Error::new(io::ErrorKind::InvalidData, "not an HTTP/2 client"));
            }
            self.ready.extend(self.raw.drain(..PREFACE.len()));
            self.preface_seen = true;
        }
        while self.raw.len() >= 9 {
            let len = usize::from(self.raw[0]) << 16 | usize::from(self.raw[1]) << 8 | usize::from(self.raw[2]);
            if len > MAX_FRAME * 64 {
                return Err(io::Error::new(io::ErrorKind::InvalidData, "frame too large"));
            }
            if self.raw.len() < 9 + len {
                return Ok(());
            }
            let frame: Vec<u8> = self.raw.drain(..9 + len).collect();
            let (kind, flags) = (frame[3], frame[4]);
            let stream = u32::from_be_bytes([frame[5], frame[6], frame[7], frame[8]]) & 0x7fff_ffff;
            match kind {
                HEADERS => {
                    let mut payload = &frame[9..];
                    if flags & PADDED != 0 {
                        let pad = usize::from(*payload.first().ok_or_else(bad)?);
                        payload = payload.get(1..payload.len().checked_sub(pad).ok_or_else(bad)?).ok_or_else(bad)?;
                    }
                    if flags & PRIORITY != 0 {
                        payload = payload.get(5..).ok_or_else(bad)?;
                    }
                    self.block = Some(Block { stream, end_stream: flags & END_STREAM != 0, bytes: payload.to_vec() });
                    if flags & END_HEADERS != 0 {
                        self.finish_block()?;
                    }
                }
                CONTINUATION => {
                    let block = self.block.as_mut().filter(|b| b.stream == stream).ok_or_else(bad)?;
                    block.bytes.extend_from_slice(&frame[9..]);
                    if block.bytes.len() > MAX_BLOCK {
                        return Err(io::Error::new(io::ErrorKind::InvalidData, "header block too large"));
                    }
                    if flags & END_HEADERS != 0 {
                        self.finish_block()?;
                    }
                }
                _ => self.ready.extend_from_slice(&frame),
            }
        }
        Ok(())
    }

    /// The gathered header block, its `:authority` made `localhost`, as one HEADERS frame.
    fn finish_block(&mut self) -> io::Result<()> {
        let block = self.block.take().ok_or_else(bad)?;
        let headers = self
            .decoder
            .decode(&block.bytes)
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, format!("{e:?}")))?;
        let rewritten: Vec<(&[u8], &[u8])> = headers
            .iter()
            .map(|(n, v)| {
                if n.as_slice() == b":authority" {
                    (n.as_slice(), &b"localhost"[..])
                } else {
                    (n.as_slice(), v.as_slice())
                }
            })
            .collect();
        let encoded = self.encoder.encode(rewritten);
        if encoded.len() > MAX_FRAME {
            return Err(io::Error::new(io::ErrorKind::InvalidData, "header block too large"));
        }
        let len = encoded.len() as u32;
        self.ready.extend_from_slice(&len.to_be_bytes()[1..]);
        self.ready.push(HEADERS);
        self.ready.push(END_HEADERS | if block.end_stream { END_STREAM } else { 0 });
        self.ready.extend_from_slice(&block.stream.to_be_bytes());
        self.ready.extend_from_slice(&encoded);
        Ok(())
    }
}

fn bad() -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, "malformed HTTP/2 frame")
}

impl<S: AsyncRead + Unpin> AsyncRead for LocalAuthority<S> {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        let this = &mut *self;
        loop {
            if !this.ready.is_empty() {
                let n = this.ready.len().min(buf.remaining());
                buf.put_slice(&this.ready[..n]);
                this.ready.drain(..n);
                return Poll::Ready(Ok(()));
            }
            if this.eof {
                return Poll::Ready(Ok(()));
            }
            let mut chunk = [0u8; 8192];
            let mut read = ReadBuf::new(&mut chunk);
            match Pin::new(&mut this.inner).poll_read(cx, &mut read) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                Poll::Ready(Ok(())) if read.filled().is_empty() => this.eof = true,
                Poll::Ready(Ok(())) => {
                    this.raw.extend_from_slice(read.filled());
                    this.process()?;
                }
            }
        }
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for LocalAuthority<S> {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }
    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }
    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

impl tonic::transport::server::Connected for LocalAuthority<tokio::net::UnixStream> {
    type ConnectInfo = ();
    fn connect_info(&self) -> Self::ConnectInfo {}
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncReadExt;

    fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
        let mut f = (payload.len() as u32).to_be_bytes()[1..].to_vec();
        f.extend([kind, flags]);
        f.extend(stream.to_be_bytes());
        f.extend(payload);
        f
    }

    #[test]
    fn a_path_as_authority_becomes_localhost_across_continuations_and_other_frames_pass() {
        let mut client = loona_hpack::Encoder::new();
        let socket = b"/var/lib/kubelet/plugins_registry/plexus.dev-reg.sock";
        let block = client.encode(vec![
            (&b":method"[..], &b"POST"[..]),
            (b":scheme", b"http"),
            (b":path", b"/pluginregistration.Registration/GetInfo"),
            (b":authority", &socket[..]),
            (b"content-type", b"application/grpc"),
        ]);
        let (a, b) = block.split_at(10);
        let settings = frame(0x4, 0, 0, &[]);
        // HEADERS padded and with a priority, then a CONTINUATION, then a DATA frame.
        let mut first = vec![3u8];
        first.extend([0, 0, 0, 0, 16]);
        first.extend(a);
        first.extend([0, 0, 0]);
        let mut wire = PREFACE.to_vec();
        wire.extend(&settings);
        wire.extend(frame(HEADERS, PADDED | PRIORITY, 1, &first));
        wire.extend(frame(CONTINUATION, END_HEADERS, 1, b));
        wire.extend(frame(0x0, END_STREAM, 1, b"\0\0\0\0\0"));
        let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
        let out = rt.block_on(async {
            let mut conn = LocalAuthority::new(&wire[..]);
            let mut out = Vec::new();
            conn.read_to_end(&mut out).await.unwrap();
            out
        });
        assert_eq!(&out[..PREFACE.len()], PREFACE);
        let rest = &out[PREFACE.len()..];
        assert_eq!(&rest[..settings.len()], &settings[..]);
        let headers = &rest[settings.len()..];
        let len = usize::from(headers[0]) << 16 | usize::from(headers[1]) << 8 | usize::from(headers[2]);
        assert_eq!((headers[3], headers[4]), (HEADERS, END_HEADERS));
        let decoded = loona_hpack::Decoder::new().decode(&headers[9..9 + len]).unwrap();
        let get = |n: &[u8]| decoded.iter().find(|(k, _)| k == n).map(|(_, v)| v.clone());
        assert_eq!(get(b":authority").as_deref(), Some(&b"localhost"[..]));
        assert_eq!(get(b":path").as_deref(), Some(&b"/pluginregistration.Registration/GetInfo"[..]));
        assert_eq!(&headers[9 + len..], &frame(0x0, END_STREAM, 1, b"\0\0\0\0\0")[..]);
    }

    #[test]
    fn a_client_that_does_not_speak_http2_is_refused() {
        let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
        let e = rt.block_on(async {
            let mut conn = LocalAuthority::new(&b"GET / HTTP/1.1\r\nHost: x\r\n\r\n"[..]);
            conn.read_to_end(&mut Vec::new()).await.unwrap_err()
        });
        assert_eq!(e.kind(), io::ErrorKind::InvalidData);
    }
}
