//! redact is a result-phase policy that removes secrets from a run's output
//! before the caller sees it: AWS access key ids (AKIA... and ASIA..., 20
//! characters) and PEM private key blocks ("-----BEGIN ... PRIVATE
//! KEY-----" up to the matching END line, or to the end of the output if it
//! was cut short). Each is replaced by "[REDACTED aws-access-key-id]" or
//! "[REDACTED private-key]". The Rust port of policies/examples/redact.

use codemode_policy::{policy, ResultDecision, ResultInput, Stream};

const BEGIN_MARK: &[u8] = b"-----BEGIN ";
const KEY_MARK: &[u8] = b"PRIVATE KEY-----";
const END_MARK: &[u8] = b"-----END ";

fn result(input: &ResultInput) -> ResultDecision {
    let d = ResultDecision::allow();
    let d = scan(d, Stream::Stdout, input.result.stdout.as_bytes());
    scan(d, Stream::Stderr, input.result.stderr.as_bytes())
}

/// Adds the redactions of s, in order and without overlaps.
fn scan(mut d: ResultDecision, stream: Stream, s: &[u8]) -> ResultDecision {
    let mut i = 0;
    while i < s.len() {
        let found = match s[i] {
            b'A' => access_key_at(s, i).map(|n| (n, "[REDACTED aws-access-key-id]")),
            b'-' => private_key_at(s, i).map(|n| (n, "[REDACTED private-key]")),
            _ => None,
        };
        match found {
            Some((n, replacement)) => {
                d = d.redact(stream, i, i + n, replacement);
                i += n;
            }
            None => i += 1,
        }
    }
    d
}

fn is_key_char(c: u8) -> bool {
    c.is_ascii_uppercase() || c.is_ascii_digit()
}

/// The length of an AWS access key id at s[i..].
fn access_key_at(s: &[u8], i: usize) -> Option<usize> {
    const N: usize = 20;
    let rest = &s[i..];
    if rest.len() < N || !(rest.starts_with(b"AKIA") || rest.starts_with(b"ASIA")) {
        return None;
    }
    if i > 0 && is_key_char(s[i - 1]) {
        return None;
    }
    if !rest[4..N].iter().all(|&c| is_key_char(c)) {
        return None;
    }
    if rest.len() > N && is_key_char(rest[N]) {
        return None;
    }
    Some(N)
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

/// The length of a PEM private key block at s[i..].
fn private_key_at(s: &[u8], i: usize) -> Option<usize> {
    let rest = &s[i..];
    if !rest.starts_with(BEGIN_MARK) {
        return None;
    }
    let header = match rest.iter().position(|&c| c == b'\n') {
        Some(eol) => &rest[..eol],
        None => rest,
    };
    let mut header = header;
    while let [head @ .., b'\r'] = header {
        header = head;
    }
    if !header.ends_with(KEY_MARK) {
        return None;
    }
    let end = match find(rest, END_MARK) {
        Some(end) => end,
        None => return Some(rest.len()), // cut short: redact to the end
    };
    let j = end + END_MARK.len();
    match find(&rest[j..], b"-----") {
        Some(k) => Some(j + k + 5),
        None => Some(rest.len()),
    }
}

policy! { result: result }
