//! The rendezvous's wire messages: frames, their encoding and decoding.
//! The table of messages is in the [module docs](super) ("Wire format").

use std::io::{self, Read};
use std::time::Duration;

pub const MAGIC: u32 = 0x4350_4e42; // "CPNB"
/// 2: Welcome carries the init/finalize cycle (repeated init).
/// 3: Gather and Bye carry the PE's wait timeout.
pub const VERSION: u16 = 3;
/// Largest frame (`len` field), the `u32` limit.
pub const MAX_FRAME: usize = u32::MAX as usize;
/// Largest frame accepted before the handshake is done (Hello, Welcome,
/// Reject, Aborted); a stray client cannot make the server allocate much.
pub const HANDSHAKE_MAX: usize = 8 << 10;
/// Reasons are cut to this many bytes.
pub const MAX_REASON: usize = 4 << 10;

pub const HELLO: u8 = 0x01;
pub const GATHER: u8 = 0x02;
pub const BYE: u8 = 0x03;
pub const ABORT: u8 = 0x04;
pub const WELCOME: u8 = 0x81;
pub const REJECT: u8 = 0x82;
pub const GATHERED: u8 = 0x83;
pub const BYE_ACK: u8 = 0x84;
pub const ABORTED: u8 = 0x85;

/// A message from a PE to the server.
#[derive(Debug)]
pub enum ToServer {
    Hello {
        magic: u32,
        version: u16,
        pe: i32,
        n_pes: i32,
    },
    Gather {
        round: u64,
        /// The PE's wait timeout for this round, see [`timeout_ms`].
        timeout_ms: u64,
        data: Vec<u8>,
    },
    Bye {
        /// The PE's wait timeout for finalize, see [`timeout_ms`].
        timeout_ms: u64,
    },
    Abort {
        reason: String,
    },
}

/// A message from the server to a PE.
#[derive(Debug)]
pub enum ToClient {
    Welcome { cycle: u64 },
    Reject { reason: String },
    Gathered { round: u64, blobs: Vec<Vec<u8>> },
    ByeAck,
    Aborted { pe: i32, reason: String },
}

/// A wait timeout on the wire: whole milliseconds, rounded up (at least
/// 1); 0 means none (wait forever).
pub fn timeout_ms(t: Option<Duration>) -> u64 {
    t.map_or(0, |d| {
        let ms = d.as_nanos().div_ceil(1_000_000);
        u64::try_from(ms).unwrap_or(u64::MAX).max(1)
    })
}

/// The inverse of [`timeout_ms`].
pub fn timeout_from_ms(ms: u64) -> Option<Duration> {
    (ms != 0).then(|| Duration::from_millis(ms))
}

/// A frame with room for `body_len` bytes of body, header filled in.
fn frame(kind: u8, body_len: usize) -> io::Result<Vec<u8>> {
    let len = body_len
        .checked_add(1)
        .filter(|&l| l <= MAX_FRAME)
        .ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "message of {body_len} bytes exceeds the rendezvous frame limit of {MAX_FRAME} bytes"
                ),
            )
        })?;
    let mut f = Vec::with_capacity(4 + len);
    f.extend_from_slice(&(len as u32).to_le_bytes());
    f.push(kind);
    Ok(f)
}

fn cut(reason: &str) -> &str {
    if reason.len() <= MAX_REASON {
        return reason;
    }
    let mut end = MAX_REASON;
    while !reason.is_char_boundary(end) {
        end -= 1;
    }
    &reason[..end]
}

fn fixed(kind: u8, body: &[u8]) -> Vec<u8> {
    let mut f = Vec::with_capacity(5 + body.len());
    f.extend_from_slice(&(1 + body.len() as u32).to_le_bytes());
    f.push(kind);
    f.extend_from_slice(body);
    f
}

pub fn hello(pe: i32, n_pes: i32) -> Vec<u8> {
    let mut b = Vec::with_capacity(14);
    b.extend_from_slice(&MAGIC.to_le_bytes());
    b.extend_from_slice(&VERSION.to_le_bytes());
    b.extend_from_slice(&pe.to_le_bytes());
    b.extend_from_slice(&n_pes.to_le_bytes());
    fixed(HELLO, &b)
}

pub fn gather(round: u64, timeout: Option<Duration>, data: &[u8]) -> io::Result<Vec<u8>> {
    let mut f = frame(GATHER, 16 + data.len())?;
    f.extend_from_slice(&round.to_le_bytes());
    f.extend_from_slice(&timeout_ms(timeout).to_le_bytes());
    f.extend_from_slice(data);
    Ok(f)
}

pub fn bye(timeout: Option<Duration>) -> Vec<u8> {
    fixed(BYE, &timeout_ms(timeout).to_le_bytes())
}

pub fn abort(reason: &str) -> Vec<u8> {
    fixed(ABORT, cut(reason).as_bytes())
}

pub fn welcome(cycle: u64) -> Vec<u8> {
    fixed(WELCOME, &cycle.to_le_bytes())
}

pub fn reject(reason: &str) -> Vec<u8> {
    fixed(REJECT, cut(reason).as_bytes())
}

pub fn gathered(round: u64, blobs: &[Vec<u8>]) -> io::Result<Vec<u8>> {
    let body = blobs
        .iter()
        .try_fold(12usize, |acc, b| acc.checked_add(4 + b.len()))
        .unwrap_or(usize::MAX);
    let mut f = frame(GATHERED, body)?;
    f.extend_from_slice(&round.to_le_bytes());
    f.extend_from_slice(&(blobs.len() as u32).to_le_bytes());
    for b in blobs {
        // Each blob fits: the whole frame does.
        f.extend_from_slice(&(b.len() as u32).to_le_bytes());
        f.extend_from_slice(b);
    }
    Ok(f)
}

pub fn bye_ack() -> Vec<u8> {
    fixed(BYE_ACK, &[])
}

pub fn aborted(pe: i32, reason: &str) -> Vec<u8> {
    let reason = cut(reason).as_bytes();
    let mut b = Vec::with_capacity(4 + reason.len());
    b.extend_from_slice(&pe.to_le_bytes());
    b.extend_from_slice(reason);
    fixed(ABORTED, &b)
}

/// Reads one frame of at most `max` bytes (`len` field). `Ok(None)` on a
/// clean EOF at a frame boundary; `UnexpectedEof` inside a frame;
/// `InvalidData` for a `len` of 0 or over `max`.
pub fn read_frame(r: &mut impl Read, max: usize) -> io::Result<Option<(u8, Vec<u8>)>> {
    let mut len = [0u8; 4];
    let mut got = 0;
    while got < len.len() {
        match r.read(&mut len[got..]) {
            Ok(0) if got == 0 => return Ok(None),
            Ok(0) => return Err(io::ErrorKind::UnexpectedEof.into()),
            Ok(k) => got += k,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    let len = u32::from_le_bytes(len) as usize;
    if len == 0 || len > max {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("frame length {len} outside 1..={max} (not a cpnet rendezvous peer?)"),
        ));
    }
    let mut kind = [0u8; 1];
    r.read_exact(&mut kind)?;
    let mut body = vec![0u8; len - 1];
    r.read_exact(&mut body)?;
    Ok(Some((kind[0], body)))
}

/// A cursor over a body; every take is bounds-checked.
struct Body<'a>(&'a [u8]);

impl<'a> Body<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], String> {
        if self.0.len() < n {
            return Err(format!(
                "truncated message: needed {n} more bytes, {} left",
                self.0.len()
            ));
        }
        let (head, tail) = self.0.split_at(n);
        self.0 = tail;
        Ok(head)
    }
    fn array<const N: usize>(&mut self) -> Result<[u8; N], String> {
        let mut a = [0u8; N];
        a.copy_from_slice(self.take(N)?);
        Ok(a)
    }
    fn u16(&mut self) -> Result<u16, String> {
        Ok(u16::from_le_bytes(self.array()?))
    }
    fn u32(&mut self) -> Result<u32, String> {
        Ok(u32::from_le_bytes(self.array()?))
    }
    fn i32(&mut self) -> Result<i32, String> {
        Ok(i32::from_le_bytes(self.array()?))
    }
    fn u64(&mut self) -> Result<u64, String> {
        Ok(u64::from_le_bytes(self.array()?))
    }
    fn text(self) -> String {
        String::from_utf8_lossy(self.0).into_owned()
    }
    fn end(self, what: &str) -> Result<(), String> {
        if self.0.is_empty() {
            Ok(())
        } else {
            Err(format!("{} trailing bytes after {what}", self.0.len()))
        }
    }
}

pub fn decode_to_server(kind: u8, body: Vec<u8>) -> Result<ToServer, String> {
    let mut b = Body(&body);
    Ok(match kind {
        HELLO => {
            let m = ToServer::Hello {
                magic: b.u32()?,
                version: b.u16()?,
                pe: b.i32()?,
                n_pes: b.i32()?,
            };
            b.end("Hello")?;
            m
        }
        GATHER => {
            let round = b.u64()?;
            let timeout_ms = b.u64()?;
            let mut data = body;
            data.drain(..16);
            ToServer::Gather {
                round,
                timeout_ms,
                data,
            }
        }
        BYE => {
            let timeout_ms = b.u64()?;
            b.end("Bye")?;
            ToServer::Bye { timeout_ms }
        }
        ABORT => ToServer::Abort { reason: b.text() },
        other => return Err(format!("unknown message kind {other:#04x} from a PE")),
    })
}

pub fn decode_to_client(kind: u8, body: &[u8]) -> Result<ToClient, String> {
    let mut b = Body(body);
    Ok(match kind {
        WELCOME => {
            let cycle = b.u64()?;
            b.end("Welcome")?;
            ToClient::Welcome { cycle }
        }
        REJECT => ToClient::Reject { reason: b.text() },
        GATHERED => {
            let round = b.u64()?;
            let n = b.u32()? as usize;
            // Each blob takes at least 4 bytes: bound `n` before allocating.
            if n > b.0.len() / 4 {
                return Err(format!("Gathered claims {n} blobs in {} bytes", b.0.len()));
            }
            let mut blobs = Vec::with_capacity(n);
            for _ in 0..n {
                let len = b.u32()? as usize;
                blobs.push(b.take(len)?.to_vec());
            }
            b.end("Gathered")?;
            ToClient::Gathered { round, blobs }
        }
        BYE_ACK => {
            b.end("ByeAck")?;
            ToClient::ByeAck
        }
        ABORTED => ToClient::Aborted {
            pe: b.i32()?,
            reason: b.text(),
        },
        other => return Err(format!("unknown message kind {other:#04x} from the server")),
    })
}

/// Writes a whole frame; `Interrupted` is retried by `write_all`.
pub(super) fn send_frame(stream: &mut std::net::TcpStream, frame: &[u8]) -> io::Result<()> {
    use std::io::Write;
    stream.write_all(frame)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn roundtrip_client(frame: Vec<u8>) -> ToClient {
        let (kind, body) = read_frame(&mut frame.as_slice(), MAX_FRAME)
            .unwrap()
            .unwrap();
        decode_to_client(kind, &body).unwrap()
    }

    fn roundtrip_server(frame: Vec<u8>) -> ToServer {
        let (kind, body) = read_frame(&mut frame.as_slice(), MAX_FRAME)
            .unwrap()
            .unwrap();
        decode_to_server(kind, body).unwrap()
    }

    #[test]
    fn hello_layout_is_fixed() {
        let f = hello(3, 8);
        assert_eq!(f.len(), 4 + 1 + 14);
        assert_eq!(&f[..5], &[15, 0, 0, 0, HELLO]);
        assert_eq!(&f[5..9], b"BNPC"); // MAGIC little-endian
        match roundtrip_server(f) {
            ToServer::Hello {
                magic,
                version,
                pe,
                n_pes,
            } => assert_eq!((magic, version, pe, n_pes), (MAGIC, VERSION, 3, 8)),
            m => panic!("{m:?}"),
        }
    }

    #[test]
    fn welcome_carries_the_cycle() {
        let f = welcome(5);
        assert_eq!(&f[..5], &[9, 0, 0, 0, WELCOME]);
        match roundtrip_client(f) {
            ToClient::Welcome { cycle } => assert_eq!(cycle, 5),
            m => panic!("{m:?}"),
        }
        // Version 1's empty Welcome is refused, not misread.
        assert!(decode_to_client(WELCOME, &[]).is_err());
    }

    #[test]
    fn gather_zero_length_and_data() {
        let t = Some(Duration::from_millis(1500));
        for data in [&b""[..], b"abc"] {
            match roundtrip_server(gather(7, t, data).unwrap()) {
                ToServer::Gather {
                    round,
                    timeout_ms,
                    data: d,
                } => {
                    assert_eq!((round, timeout_ms, d.as_slice()), (7, 1500, data));
                }
                m => panic!("{m:?}"),
            }
        }
        // Version 2's Gather (no timeout) is refused, not misread.
        assert!(decode_to_server(GATHER, vec![0; 8]).is_err());
    }

    #[test]
    fn bye_carries_the_timeout() {
        let f = bye(None);
        assert_eq!(&f[..5], &[9, 0, 0, 0, BYE]);
        match roundtrip_server(f) {
            ToServer::Bye { timeout_ms } => assert_eq!(timeout_ms, 0),
            m => panic!("{m:?}"),
        }
        assert!(decode_to_server(BYE, vec![]).is_err(), "version 2's empty Bye");
    }

    #[test]
    fn timeouts_round_up_to_milliseconds_and_zero_is_none() {
        assert_eq!(timeout_ms(None), 0);
        assert_eq!(timeout_ms(Some(Duration::ZERO)), 1);
        assert_eq!(timeout_ms(Some(Duration::from_nanos(1))), 1);
        assert_eq!(timeout_ms(Some(Duration::from_micros(1500))), 2);
        assert_eq!(timeout_ms(Some(Duration::from_secs(60))), 60_000);
        assert_eq!(timeout_ms(Some(Duration::MAX)), u64::MAX);
        assert_eq!(timeout_from_ms(0), None);
        assert_eq!(timeout_from_ms(60_000), Some(Duration::from_secs(60)));
    }

    #[test]
    fn gathered_keeps_order_and_empty_blobs() {
        let blobs = vec![b"x".to_vec(), vec![], vec![9; 1000]];
        match roundtrip_client(gathered(2, &blobs).unwrap()) {
            ToClient::Gathered { round, blobs: b } => assert_eq!((round, b), (2, blobs)),
            m => panic!("{m:?}"),
        }
    }

    #[test]
    fn aborted_and_reasons_are_cut() {
        let long = "é".repeat(MAX_REASON); // 2 bytes per char
        match roundtrip_client(aborted(-1, &long)) {
            ToClient::Aborted { pe, reason } => {
                assert_eq!(pe, -1);
                assert_eq!(reason.len(), MAX_REASON);
            }
            m => panic!("{m:?}"),
        }
    }

    #[test]
    fn eof_at_boundary_vs_inside_frame() {
        assert!(read_frame(&mut &[][..], 16).unwrap().is_none());
        let e = read_frame(&mut &[5u8, 0][..], 16).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::UnexpectedEof);
        let e = read_frame(&mut &[5u8, 0, 0, 0, BYE][..], 16).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::UnexpectedEof);
    }

    #[test]
    fn bad_lengths_are_refused_before_allocating() {
        let e = read_frame(&mut &[0u8, 0, 0, 0][..], 16).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidData);
        let e = read_frame(&mut &[17u8, 0, 0, 0][..], 16).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidData);
        // A Gathered that claims more blobs than it can hold.
        let mut body = 0u64.to_le_bytes().to_vec();
        body.extend_from_slice(&u32::MAX.to_le_bytes());
        assert!(decode_to_client(GATHERED, &body).is_err());
    }

    #[test]
    fn unknown_kind_and_trailing_bytes() {
        assert!(decode_to_server(0x7f, vec![]).is_err());
        assert!(decode_to_server(BYE, vec![1; 9]).is_err());
        assert!(decode_to_client(0x01, &[]).is_err());
        assert!(decode_to_client(BYE_ACK, &[0]).is_err());
    }
}
