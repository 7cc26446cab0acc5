//! A read-side filter for the registration socket that makes the kubelet's requests acceptable to
//! our HTTP/2 stack.
//!
//! The kubelet's plugin watcher (v1.37: `pluginmanager/operationexecutor`, `dial`) dials the
//! registration socket by its bare path, so grpc-go sends that path as the HTTP/2 `:authority`.
//! A path is not a valid authority, and the `h2` crate under tonic resets such streams with
//! PROTOCOL_ERROR, so registration would never succeed (the e2e test against the kubelet's own
//! code found this). The DRA socket is not affected: the kubelet dials it as `unix:<path>`, for
//! which grpc-go sends `localhost`.
//!
//! The filter decodes every header block the client sends (HPACK, with the client's dynamic
//! table), replaces an `:authority` that is not a valid authority with `localhost`, and encodes
//! the block again with literals only, so the server's decoder needs no shared table state. Every
//! other byte passes unchanged. A connection that does not start with the HTTP/2 preface passes
//! through untouched.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
const FRAME_HEADER_LEN: usize = 9;
const TYPE_HEADERS: u8 = 0x1;
const TYPE_CONTINUATION: u8 = 0x9;
const FLAG_END_STREAM: u8 = 0x1;
const FLAG_END_HEADERS: u8 = 0x4;
const FLAG_PADDED: u8 = 0x8;
const FLAG_PRIORITY: u8 = 0x20;
/// The smallest SETTINGS_MAX_FRAME_SIZE a peer may have; rewritten blocks are split to fit it.
const MAX_FRAME: usize = 16_384;
/// Largest header block we buffer across CONTINUATION frames; beyond it the connection fails.
const MAX_BLOCK: usize = 1 << 20;

/// Whether `v` parses as an HTTP authority (`host[:port]`, `user@host`, `[v6]:port`).
fn valid_authority(v: &[u8]) -> bool {
    !v.is_empty() && http::uri::Authority::try_from(v).is_ok()
}

/// HPACK integer with an `n`-bit prefix, the first byte or-ed with `first`.
fn encode_int(out: &mut Vec<u8>, first: u8, n: u8, mut value: usize) {
    let max = (1usize << n) - 1;
    if value < max {
        out.push(first | value as u8);
        return;
    }
    out.push(first | max as u8);
    value -= max;
    while value >= 128 {
        out.push((value % 128) as u8 | 0x80);
        value /= 128;
    }
    out.push(value as u8);
}

/// A header block of "literal without indexing, new name" fields (raw strings): no table state.
fn encode_literals(headers: &[(Vec<u8>, Vec<u8>)]) -> Vec<u8> {
    let mut out = Vec::new();
    for (name, value) in headers {
        out.push(0x00);
        encode_int(&mut out, 0x00, 7, name.len());
        out.extend_from_slice(name);
        encode_int(&mut out, 0x00, 7, value.len());
        out.extend_from_slice(value);
    }
    out
}

fn frame(out: &mut Vec<u8>, ty: u8, flags: u8, stream: u32, payload: &[u8]) {
    let len = payload.len() as u32;
    out.extend_from_slice(&len.to_be_bytes()[1..]);
    out.push(ty);
    out.push(flags);
    out.extend_from_slice(&stream.to_be_bytes());
    out.extend_from_slice(payload);
}

/// The part of the stream already read and not yet rewritten.
struct Pending {
    stream: u32,
    end_stream: bool,
    priority: Option<[u8; 5]>,
    block: Vec<u8>,
}

/// Rewrites the client-to-server direction of one HTTP/2 connection (see the module docs).
pub struct Rewriter {
    decoder: hpack::Decoder<'static>,
    /// Bytes of the preface still to see; `None` once the connection passes through untouched.
    preface_left: Option<usize>,
    input: Vec<u8>,
    pending: Option<Pending>,
}

impl Default for Rewriter {
    fn default() -> Self {
        Rewriter {
            decoder: hpack::Decoder::new(),
            preface_left: Some(PREFACE.len()),
            input: Vec::new(),
            pending: None,
        }
    }
}

fn bad(msg: impl Into<String>) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, msg.into())
}

impl Rewriter {
    /// Feed bytes read from the client; returns the bytes to hand to the server.
    pub fn feed(&mut self, data: &[u8]) -> io::Result<Vec<u8>> {
        let Some(left) = self.preface_left else { return Ok(data.to_vec()) };
        self.input.extend_from_slice(data);
        let mut out = Vec::new();
        if left > 0 {
            let seen = PREFACE.len() - left;
            let n = left.min(self.input.len());
            if self.input[..n] != PREFACE[seen..seen + n] {
                // Not HTTP/2 with prior knowledge: not ours to touch.
                self.preface_left = None;
                return Ok(std::mem::take(&mut self.input));
            }
            out.extend(self.input.drain(..n));
            self.preface_left = Some(left - n);
            if left - n > 0 {
                return Ok(out);
            }
        }
        while self.input.len() >= FRAME_HEADER_LEN {
            let len = u32::from_be_bytes([0, self.input[0], self.input[1], self.input[2]]) as usize;
            if self.input.len() < FRAME_HEADER_LEN + len {
                break;
            }
            let ty = self.input[3];
            let flags = self.input[4];
            let stream = u32::from_be_bytes([self.input[5], self.input[6], self.input[7], self.input[8]])
                & 0x7fff_ffff;
            let whole: Vec<u8> = self.input.drain(..FRAME_HEADER_LEN + len).collect();
            let payload = &whole[FRAME_HEADER_LEN..];
            match ty {
                TYPE_HEADERS => {
                    let mut p = payload;
                    let mut pad = 0;
                    if flags & FLAG_PADDED != 0 {
                        pad = *p.first().ok_or_else(|| bad("HEADERS without pad length"))? as usize;
                        p = &p[1..];
                    }
                    let mut priority = None;
                    if flags & FLAG_PRIORITY != 0 {
                        let b: [u8; 5] =
                            p.get(..5).and_then(|s| s.try_into().ok()).ok_or_else(|| bad("short HEADERS"))?;
                        priority = Some(b);
                        p = &p[5..];
                    }
                    let block = p.get(..p.len().saturating_sub(pad)).ok_or_else(|| bad("bad padding"))?;
                    self.pending = Some(Pending {
                        stream,
                        end_stream: flags & FLAG_END_STREAM != 0,
                        priority,
                        block: block.to_vec(),
                    });
                }
                TYPE_CONTINUATION => {
                    let p = self.pending.as_mut().ok_or_else(|| bad("CONTINUATION without HEADERS"))?;
                    p.block.extend_from_slice(payload);
                    if p.block.len() > MAX_BLOCK {
                        return Err(bad("header block too large"));
                    }
                }
                _ => {
                    out.extend_from_slice(&whole);
                    continue;
                }
            }
            if flags & FLAG_END_HEADERS != 0 {
                let p = self.pending.take().ok_or_else(|| bad("END_HEADERS without HEADERS"))?;
                self.emit(&mut out, p)?;
            }
        }
        Ok(out)
    }

    fn emit(&mut self, out: &mut Vec<u8>, p: Pending) -> io::Result<()> {
        let mut headers = self.decoder.decode(&p.block).map_err(|e| bad(format!("HPACK: {e:?}")))?;
        for (name, value) in headers.iter_mut() {
            if name.as_slice() == b":authority" && !valid_authority(value) {
                *value = b"localhost".to_vec();
            }
        }
        let mut block = Vec::new();
        if let Some(prio) = p.priority {
            block.extend_from_slice(&prio);
        }
        block.extend(encode_literals(&headers));
        let mut flags = if p.end_stream { FLAG_END_STREAM } else { 0 };
        if p.priority.is_some() {
            flags |= FLAG_PRIORITY;
        }
        let mut chunks = block.chunks(MAX_FRAME).peekable();
        let mut ty = TYPE_HEADERS;
        while let Some(chunk) = chunks.next() {
            let last = chunks.peek().is_none();
            frame(out, ty, if last { flags | FLAG_END_HEADERS } else { flags }, p.stream, chunk);
            ty = TYPE_CONTINUATION;
            flags = 0;
        }
        if block.is_empty() {
            frame(out, TYPE_HEADERS, flags | FLAG_END_HEADERS, p.stream, &[]);
        }
        Ok(())
    }
}

/// A connection whose incoming bytes go through a [`Rewriter`].
pub struct FixAuthority<S> {
    inner: S,
    rewriter: Rewriter,
    ready: Vec<u8>,
    eof: bool,
}

impl<S> FixAuthority<S> {
    pub fn new(inner: S) -> Self {
        FixAuthority { inner, rewriter: Rewriter::default(), ready: Vec::new(), eof: false }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for FixAuthority<S> {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
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
            let mut tmp = [0u8; 8192];
            let mut rb = ReadBuf::new(&mut tmp);
            match Pin::new(&mut this.inner).poll_read(cx, &mut rb) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                Poll::Ready(Ok(())) if rb.filled().is_empty() => this.eof = true,
                Poll::Ready(Ok(())) => this.ready = this.rewriter.feed(rb.filled())?,
            }
        }
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for FixAuthority<S> {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write(cx, buf)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }
}

impl<S: Send + Sync + 'static> tonic::transport::server::Connected for FixAuthority<S> {
    type ConnectInfo = ();

    fn connect_info(&self) -> Self::ConnectInfo {}
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(encoder: &mut hpack::Encoder<'_>, authority: &[u8], flags: u8) -> Vec<u8> {
        let block = encoder.encode(vec![
            (&b":method"[..], &b"POST"[..]),
            (&b":scheme"[..], &b"http"[..]),
            (&b":path"[..], &b"/pluginregistration.Registration/GetInfo"[..]),
            (&b":authority"[..], authority),
            (&b"content-type"[..], &b"application/grpc"[..]),
        ]);
        let mut out = Vec::new();
        frame(&mut out, TYPE_HEADERS, flags | FLAG_END_HEADERS, 1, &block);
        out
    }

    fn headers_of(bytes: &[u8]) -> Vec<(Vec<u8>, Vec<u8>)> {
        assert_eq!(bytes[3], TYPE_HEADERS);
        let len = u32::from_be_bytes([0, bytes[0], bytes[1], bytes[2]]) as usize;
        hpack::Decoder::new().decode(&bytes[FRAME_HEADER_LEN..FRAME_HEADER_LEN + len]).unwrap()
    }

    #[test]
    fn a_socket_path_authority_becomes_localhost_and_the_rest_passes() {
        let mut enc = hpack::Encoder::new();
        let mut rw = Rewriter::default();
        let mut input = PREFACE.to_vec();
        let mut settings = Vec::new();
        frame(&mut settings, 0x4, 0, 0, &[]);
        input.extend_from_slice(&settings);
        input.extend(request(&mut enc, b"/var/lib/kubelet/plugins_registry/x-reg.sock", FLAG_END_STREAM));
        // Fed in awkward pieces, as a socket may deliver them.
        let mut out = Vec::new();
        for piece in input.chunks(7) {
            out.extend(rw.feed(piece).unwrap());
        }
        assert!(out.starts_with(PREFACE));
        let rest = &out[PREFACE.len()..];
        assert_eq!(&rest[..settings.len()], &settings[..]);
        let h = headers_of(&rest[settings.len()..]);
        assert!(h.contains(&(b":authority".to_vec(), b"localhost".to_vec())), "{h:?}");
        assert!(h.contains(&(b":path".to_vec(), b"/pluginregistration.Registration/GetInfo".to_vec())));
        assert_eq!(rest[settings.len() + 4], FLAG_END_STREAM | FLAG_END_HEADERS);

        // A second request on the connection refers to the client's dynamic table.
        let second = rw.feed(&request(&mut enc, b"/var/lib/kubelet/plugins_registry/x-reg.sock", 0)).unwrap();
        assert!(headers_of(&second).contains(&(b":authority".to_vec(), b"localhost".to_vec())));
        // A valid authority is left alone.
        let third = rw.feed(&request(&mut enc, b"localhost:1234", 0)).unwrap();
        assert!(headers_of(&third).contains(&(b":authority".to_vec(), b"localhost:1234".to_vec())));
    }

    #[test]
    fn non_http2_connections_pass_untouched() {
        let mut rw = Rewriter::default();
        assert_eq!(rw.feed(b"GET / HTTP/1.1\r\n").unwrap(), b"GET / HTTP/1.1\r\n");
        assert_eq!(rw.feed(b"Host: x\r\n").unwrap(), b"Host: x\r\n");
    }

    #[test]
    fn long_integers_use_continuation_bytes() {
        let mut out = Vec::new();
        encode_int(&mut out, 0, 7, 1337);
        assert_eq!(out, [0x7f, 0xba, 0x09]);
    }
}
