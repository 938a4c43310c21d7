//! A minimal protobuf wire-format codec for the messages of ABI v1: it
//! decodes exactly the fields it knows, skips unknown ones as the protobuf
//! spec requires, and encodes in field-number order like the reference
//! implementation.

use super::*;
use std::fmt;

/// Bytes that are not valid protobuf wire format (or a string that is not
/// UTF-8).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DecodeError;

impl fmt::Display for DecodeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("malformed protobuf input")
    }
}

impl std::error::Error for DecodeError {}

type R<T> = Result<T, DecodeError>;

const VARINT: u8 = 0;
const FIXED64: u8 = 1;
const BYTES: u8 = 2;
const FIXED32: u8 = 5;

/// Walks one message's fields.
struct Reader<'a> {
    b: &'a [u8],
}

impl<'a> Reader<'a> {
    fn varint(&mut self) -> R<u64> {
        let mut v = 0u64;
        for i in 0..10 {
            let c = *self.b.get(i).ok_or(DecodeError)?;
            v |= u64::from(c & 0x7f) << (7 * i);
            if c < 0x80 {
                self.b = &self.b[i + 1..];
                return Ok(v);
            }
        }
        Err(DecodeError)
    }

    /// The next field's number and wire type, or None at the end.
    fn next(&mut self) -> R<Option<(u32, u8)>> {
        if self.b.is_empty() {
            return Ok(None);
        }
        let t = self.varint()?;
        let num = t >> 3;
        if num == 0 || num > i32::MAX as u64 {
            return Err(DecodeError);
        }
        Ok(Some((num as u32, (t & 7) as u8)))
    }

    fn take(&mut self, n: usize) -> R<&'a [u8]> {
        if n > self.b.len() {
            return Err(DecodeError);
        }
        let (v, rest) = self.b.split_at(n);
        self.b = rest;
        Ok(v)
    }

    fn bytes(&mut self, typ: u8) -> R<&'a [u8]> {
        if typ != BYTES {
            return Err(DecodeError);
        }
        let n = self.varint()?;
        if n > self.b.len() as u64 {
            return Err(DecodeError);
        }
        self.take(n as usize)
    }

    fn skip(&mut self, typ: u8) -> R<()> {
        match typ {
            VARINT => self.varint().map(drop),
            FIXED64 => self.take(8).map(drop),
            BYTES => self.bytes(typ).map(drop),
            FIXED32 => self.take(4).map(drop),
            _ => Err(DecodeError),
        }
    }

    fn string(&mut self, typ: u8) -> R<String> {
        let b = self.bytes(typ)?;
        String::from_utf8(b.to_vec()).map_err(|_| DecodeError)
    }

    fn uint(&mut self, typ: u8) -> R<u64> {
        if typ != VARINT {
            return Err(DecodeError);
        }
        self.varint()
    }

    fn sub(&mut self, typ: u8) -> R<Reader<'a>> {
        Ok(Reader { b: self.bytes(typ)? })
    }

    /// A repeated uint32: one value, or a packed run of them.
    fn uint32s(&mut self, typ: u8, vs: &mut Vec<u32>) -> R<()> {
        match typ {
            VARINT => vs.push(self.varint()? as u32),
            BYTES => {
                let mut s = self.sub(typ)?;
                while !s.b.is_empty() {
                    vs.push(s.varint()? as u32);
                }
            }
            _ => return Err(DecodeError),
        }
        Ok(())
    }

    /// A google.protobuf.Duration; negative ones are zero.
    fn duration(&mut self, typ: u8) -> R<Duration> {
        let mut s = self.sub(typ)?;
        let (mut secs, mut nanos) = (0i64, 0i32);
        while let Some((num, t)) = s.next()? {
            match num {
                1 => secs = s.uint(t)? as i64,
                2 => nanos = s.uint(t)? as i32,
                _ => s.skip(t)?,
            }
        }
        if secs < 0 || nanos < 0 {
            return Ok(Duration::ZERO);
        }
        Ok(Duration::new(secs as u64, (nanos as u32).min(999_999_999)))
    }

    fn map_entry(&mut self, typ: u8, m: &mut BTreeMap<String, String>) -> R<()> {
        let mut s = self.sub(typ)?;
        let (mut k, mut v) = (String::new(), String::new());
        while let Some((num, t)) = s.next()? {
            match num {
                1 => k = s.string(t)?,
                2 => v = s.string(t)?,
                _ => s.skip(t)?,
            }
        }
        m.insert(k, v);
        Ok(())
    }
}

pub(crate) fn decode_request_input(b: &[u8]) -> R<RequestInput> {
    let mut in_ = RequestInput::default();
    let mut r = Reader { b };
    while let Some((num, t)) = r.next()? {
        match num {
            1 => decode_execution(&mut r.sub(t)?, &mut in_.execution)?,
            2 => in_.tenant = r.string(t)?,
            3 => in_.door = r.string(t)?,
            4 => in_.request_id = r.string(t)?,
            5 => r.map_entry(t, &mut in_.annotations)?,
            6 => decode_egress(&mut r.sub(t)?, &mut in_.egress)?,
            7 => decode_api_call(&mut r.sub(t)?, in_.api_call.get_or_insert_with(Default::default))?,
            8 => in_.subject = r.string(t)?,
            _ => r.skip(t)?,
        }
    }
    Ok(in_)
}

fn decode_execution(r: &mut Reader, e: &mut Execution) -> R<()> {
    while let Some((num, t)) = r.next()? {
        match num {
            1 => e.language = r.string(t)?,
            2 => e.code = r.string(t)?,
            3 => e.session_id = r.string(t)?,
            4 => e.timeout = r.duration(t)?,
            5 => e.stdin = r.bytes(t)?.to_vec(),
            6 => {
                let mut s = r.sub(t)?;
                let mut f = File::default();
                while let Some((n, t)) = s.next()? {
                    match n {
                        1 => f.path = s.string(t)?,
                        2 => f.content = s.bytes(t)?.to_vec(),
                        _ => s.skip(t)?,
                    }
                }
                e.files.push(f);
            }
            7 => {
                let mut s = r.sub(t)?;
                while let Some((n, t)) = s.next()? {
                    match n {
                        1 => e.memory_bytes = s.uint(t)?,
                        2 => e.output_bytes = s.uint(t)?,
                        _ => s.skip(t)?,
                    }
                }
            }
            _ => r.skip(t)?,
        }
    }
    Ok(())
}

fn decode_egress(r: &mut Reader, e: &mut Egress) -> R<()> {
    while let Some((num, t)) = r.next()? {
        match num {
            1 => {
                let mut s = r.sub(t)?;
                let mut rule = EgressRule::default();
                while let Some((n, t)) = s.next()? {
                    match n {
                        1 => rule.host = s.string(t)?,
                        2 => s.uint32s(t, &mut rule.ports)?,
                        _ => s.skip(t)?,
                    }
                }
                e.allow.push(rule);
            }
            2 => {
                let mut s = r.sub(t)?;
                while let Some((n, t)) = s.next()? {
                    match n {
                        1 => e.limits.connections = s.uint(t)? as u32,
                        2 => e.limits.bytes = s.uint(t)?,
                        3 => e.limits.connection_time = s.duration(t)?,
                        _ => s.skip(t)?,
                    }
                }
            }
            _ => r.skip(t)?,
        }
    }
    Ok(())
}

fn decode_api_call(r: &mut Reader, c: &mut ApiCall) -> R<()> {
    while let Some((num, t)) = r.next()? {
        match num {
            1 => c.api = r.string(t)?,
            2 => c.tool = r.string(t)?,
            3 => c.arguments_json = r.string(t)?,
            4 => c.method = r.string(t)?,
            5 => c.url = r.string(t)?,
            _ => r.skip(t)?,
        }
    }
    Ok(())
}

pub(crate) fn decode_result_input(b: &[u8]) -> R<ResultInput> {
    let mut in_ = ResultInput::default();
    let mut r = Reader { b };
    while let Some((num, t)) = r.next()? {
        match num {
            1 => {
                let mut s = r.sub(t)?;
                let res = &mut in_.result;
                while let Some((n, t)) = s.next()? {
                    match n {
                        1 => res.exit_code = s.uint(t)? as i32,
                        2 => res.stdout = s.string(t)?,
                        3 => res.stderr = s.string(t)?,
                        4 => res.timed_out = s.uint(t)? != 0,
                        5 => res.truncated = s.uint(t)? != 0,
                        6 => res.oom_killed = s.uint(t)? != 0,
                        7 => res.duration = s.duration(t)?,
                        8 => res.agent = s.string(t)?,
                        9 => res.session_id = s.string(t)?,
                        _ => s.skip(t)?,
                    }
                }
            }
            2 => in_.tenant = r.string(t)?,
            3 => in_.door = r.string(t)?,
            4 => in_.request_id = r.string(t)?,
            5 => in_.language = r.string(t)?,
            6 => r.map_entry(t, &mut in_.annotations)?,
            _ => r.skip(t)?,
        }
    }
    Ok(in_)
}

fn put_varint(b: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        b.push(v as u8 | 0x80);
        v >>= 7;
    }
    b.push(v as u8);
}

fn put_tag(b: &mut Vec<u8>, num: u32, typ: u8) {
    put_varint(b, u64::from(num) << 3 | u64::from(typ));
}

fn put_uint(b: &mut Vec<u8>, num: u32, v: u64) {
    if v != 0 {
        put_tag(b, num, VARINT);
        put_varint(b, v);
    }
}

fn put_bytes(b: &mut Vec<u8>, num: u32, v: &[u8]) {
    put_tag(b, num, BYTES);
    put_varint(b, v.len() as u64);
    b.extend_from_slice(v);
}

fn put_str(b: &mut Vec<u8>, num: u32, s: &str) {
    if !s.is_empty() {
        put_bytes(b, num, s.as_bytes());
    }
}

/// Appends a nested message that f writes.
fn put_message(b: &mut Vec<u8>, num: u32, f: impl FnOnce(&mut Vec<u8>)) {
    let mut m = Vec::new();
    f(&mut m);
    put_bytes(b, num, &m);
}

fn put_duration(b: &mut Vec<u8>, num: u32, d: Duration) {
    if d != Duration::ZERO {
        put_message(b, num, |m| {
            put_uint(m, 1, d.as_secs());
            put_uint(m, 2, u64::from(d.subsec_nanos()));
        });
    }
}

fn put_map(b: &mut Vec<u8>, num: u32, m: &BTreeMap<String, String>) {
    for (k, v) in m {
        put_message(b, num, |e| {
            put_str(e, 1, k);
            put_str(e, 2, v);
        });
    }
}

fn put_egress(b: &mut Vec<u8>, e: &Egress) {
    for rule in &e.allow {
        put_message(b, 1, |r| {
            put_str(r, 1, &rule.host);
            if !rule.ports.is_empty() {
                put_message(r, 2, |p| {
                    for &port in &rule.ports {
                        put_varint(p, u64::from(port));
                    }
                });
            }
        });
    }
    let l = &e.limits;
    if l.connections != 0 || l.bytes != 0 || l.connection_time != Duration::ZERO {
        put_message(b, 2, |m| {
            put_uint(m, 1, u64::from(l.connections));
            put_uint(m, 2, l.bytes);
            put_duration(m, 3, l.connection_time);
        });
    }
}

pub(crate) fn encode_request_decision(d: &RequestDecision, b: &mut Vec<u8>) {
    put_uint(b, 1, d.verdict as i64 as u64);
    put_str(b, 2, &d.reason);
    let w = &d.rewrite;
    if w.code.is_some() || w.language.is_some() || w.stdin.is_some() {
        put_message(b, 3, |m| {
            if let Some(code) = &w.code {
                put_bytes(m, 1, code.as_bytes());
            }
            if let Some(language) = &w.language {
                put_bytes(m, 2, language.as_bytes());
            }
            if let Some(stdin) = &w.stdin {
                put_bytes(m, 3, stdin);
            }
        });
    }
    let l = &d.limits;
    if *l != Limits::default() {
        put_message(b, 4, |m| {
            put_duration(m, 1, l.timeout);
            put_uint(m, 2, l.memory_bytes);
            put_uint(m, 3, l.output_bytes);
        });
    }
    put_map(b, 5, &d.route);
    put_uint(b, 6, d.route_priority as i64 as u64);
    put_map(b, 7, &d.annotations);
    if let Some(e) = &d.egress {
        put_message(b, 8, |m| put_egress(m, e));
    }
}

pub(crate) fn encode_result_decision(d: &ResultDecision, b: &mut Vec<u8>) {
    put_uint(b, 1, d.verdict as i64 as u64);
    put_str(b, 2, &d.reason);
    for x in &d.redactions {
        put_message(b, 3, |m| {
            put_uint(m, 1, x.stream as i64 as u64);
            put_uint(m, 2, u64::from(x.start));
            put_uint(m, 3, u64::from(x.end));
            put_str(m, 4, &x.replacement);
        });
    }
    if let Some(s) = &d.stdout {
        put_bytes(b, 4, s.as_bytes());
    }
    if let Some(s) = &d.stderr {
        put_bytes(b, 5, s.as_bytes());
    }
    put_map(b, 6, &d.annotations);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn request_input_round_trip_of_known_bytes() {
        // tenant "acme", an unknown field 99 (varint), execution {language "python"}.
        let b = [0x12, 4, b'a', b'c', b'm', b'e', 0x98, 0x06, 7, 0x0a, 8, 0x0a, 6, b'p', b'y', b't', b'h', b'o', b'n'];
        let in_ = decode_request_input(&b).unwrap();
        assert_eq!(in_.tenant, "acme");
        assert_eq!(in_.execution.language, "python");
        assert!(decode_request_input(&[0x12, 9, b'a']).is_err());
    }

    #[test]
    fn deny_encodes_verdict_and_reason() {
        assert_eq!(RequestDecision::deny("no").encode(), vec![0x08, 2, 0x12, 2, b'n', b'o']);
        assert_eq!(ResultDecision::allow().encode(), vec![0x08, 1]);
    }
}
