//! The codemode policy SDK for Rust: write a WebAssembly policy (ABI v1,
//! `policies/ABI.md`) as one function over typed inputs and decisions; the
//! SDK decodes the host's protobuf input, encodes the decision and exports
//! what the ABI asks for.
//!
//! ```ignore
//! use codemode_policy::{policy, RequestDecision, RequestInput};
//!
//! fn request(input: &RequestInput) -> RequestDecision {
//!     if input.execution.language == "bash" && input.tenant == "anonymous" {
//!         return RequestDecision::deny("sign in to run bash");
//!     }
//!     RequestDecision::allow().route("pool", "general")
//! }
//!
//! policy! { request: request }
//! ```
//!
//! Build for `wasm32-wasi` as a `cdylib` (see `policies/README.md`).
//!
//! The messages are decoded and encoded by a small hand-written protobuf
//! codec (`wire`), which knows exactly the fields of ABI v1 and skips the
//! ones it does not know, as later hosts may add input fields. It has no
//! dependencies beyond `std`, so it builds offline.
//!
//! Handlers run one call at a time per instance; the host keeps several
//! instances, each with its own memory. State kept in statics (for example
//! the configuration `init` parsed, in a `thread_local!`) lives as long as
//! the instance, which the host may discard and replace at any time.

use std::collections::BTreeMap;
use std::time::Duration;

mod wire;

pub use wire::DecodeError;

/// A policy's answer; `codemode.policy.v1.Verdict`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Verdict {
    /// No verdict: the host counts the decision as malformed.
    #[default]
    Unspecified = 0,
    /// Let the request (or result) through, with the decision's changes.
    Allow = 1,
    /// Refuse the request (or withhold the result) with the reason.
    Deny = 2,
}

/// An output stream; `codemode.policy.v1.Stream`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Stream {
    /// Not a stream: a redaction of it is refused.
    #[default]
    Unspecified = 0,
    /// Standard output.
    Stdout = 1,
    /// Standard error.
    Stderr = 2,
}

/// A file written into the sandbox's `/workspace` before the run.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct File {
    pub path: String,
    pub content: Vec<u8>,
}

/// What the caller asked to run; `codemode.execution.v1.Execution`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Execution {
    /// A name of the agents' language table (`ListLanguages`), e.g. "python";
    /// aliases arrive as the table's name.
    pub language: String,
    /// Source code; empty when a session is opened or an API tool is called.
    pub code: String,
    /// Session to run in, or empty.
    pub session_id: String,
    /// Wall-clock limit; zero for the edge's default.
    pub timeout: Duration,
    /// Standard input.
    pub stdin: Vec<u8>,
    /// Files written before the run.
    pub files: Vec<File>,
    /// `limits.memory_bytes`; 0 for the default.
    pub memory_bytes: u64,
    /// `limits.output_bytes`; 0 for the default.
    pub output_bytes: u64,
}

/// One destination of a run's egress; `codemode.execution.v1.EgressRule`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct EgressRule {
    /// A name ("api.example.com"), every name below a domain
    /// ("*.example.com"), an address ("192.0.2.7") or a prefix
    /// ("192.0.2.0/24"). Names ending in ".api.codemode" are the edge's
    /// configured APIs.
    pub host: String,
    /// Ports; none: 80 and 443.
    pub ports: Vec<u32>,
}

/// Bounds of a run's egress; zero is the agent's default.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct EgressLimits {
    /// Connections a run may open.
    pub connections: u32,
    /// Bytes a run may send and receive, all connections together.
    pub bytes: u64,
    /// How long one connection may stay open.
    pub connection_time: Duration,
}

/// What a run may reach outside its sandbox; `codemode.execution.v1.Egress`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Egress {
    pub allow: Vec<EgressRule>,
    pub limits: EgressLimits,
}

/// A call of a declared API tool; `codemode.policy.v1.ApiCall`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ApiCall {
    /// The API's name ("github").
    pub api: String,
    /// The tool's name ("github_list_repos").
    pub tool: String,
    /// The tool's arguments, a JSON object.
    pub arguments_json: String,
    /// Method and URL the call goes to, arguments filled in.
    pub method: String,
    pub url: String,
}

/// The input of the request phase; `codemode.policy.v1.RequestInput`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RequestInput {
    pub execution: Execution,
    /// Tenant of the caller's API key; "anonymous" without one.
    pub tenant: String,
    /// Door: "connect", "grpc", "grpcweb", "mcp", "mcp-api", ...
    pub door: String,
    pub request_id: String,
    /// Annotations set by earlier policies of the chain.
    pub annotations: BTreeMap<String, String>,
    /// What the run may reach: the tenant's egress as earlier policies
    /// narrowed it. No rules: nothing.
    pub egress: Egress,
    /// Set when the request is a call of a declared API tool (door
    /// "mcp-api"); the execution then means nothing.
    pub api_call: Option<ApiCall>,
    /// Who the caller is within its tenant when it came with an OpenID
    /// provider's token: a hash of the issuer and the token's subject;
    /// empty for API keys.
    pub subject: String,
}

/// Fields of the execution to replace; `None` leaves a field alone.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Rewrite {
    pub code: Option<String>,
    pub language: Option<String>,
    pub stdin: Option<Vec<u8>>,
}

/// Limits a decision applies; zero is no opinion. Each may only tighten
/// what the request allows.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Limits {
    pub timeout: Duration,
    pub memory_bytes: u64,
    pub output_bytes: u64,
}

/// The answer of the request phase; `codemode.policy.v1.RequestDecision`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RequestDecision {
    pub verdict: Verdict,
    /// Shown to the caller when denied; at most 1024 bytes.
    pub reason: String,
    pub rewrite: Rewrite,
    pub limits: Limits,
    /// Agent labels the run must go to (among the configured labels).
    pub route: BTreeMap<String, String>,
    /// Settles route labels several policies set: the highest wins.
    pub route_priority: i32,
    /// For logs and later policies; at most 16.
    pub annotations: BTreeMap<String, String>,
    /// When set, what the run may reach: the host narrows it to what the
    /// input's egress allows too, so a policy can take egress away, never
    /// add it. Set with no rules: nothing. `None`: unchanged.
    pub egress: Option<Egress>,
}

/// What came of a run; `codemode.execution.v1.Result`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RunResult {
    pub exit_code: i32,
    pub stdout: String,
    pub stderr: String,
    pub timed_out: bool,
    pub truncated: bool,
    pub oom_killed: bool,
    pub duration: Duration,
    pub agent: String,
    pub session_id: String,
}

/// The input of the result phase; `codemode.policy.v1.ResultInput`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ResultInput {
    pub result: RunResult,
    pub tenant: String,
    pub door: String,
    pub request_id: String,
    pub language: String,
    /// Annotations the request phase set.
    pub annotations: BTreeMap<String, String>,
}

/// Replaces the bytes `[start, end)` of one stream with `replacement`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Redaction {
    pub stream: Stream,
    pub start: u32,
    pub end: u32,
    pub replacement: String,
}

/// The answer of the result phase; `codemode.policy.v1.ResultDecision`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ResultDecision {
    pub verdict: Verdict,
    /// Shown to the caller when the result is withheld.
    pub reason: String,
    /// In order, not overlapping, in byte offsets of the input's output.
    pub redactions: Vec<Redaction>,
    /// Replace the whole stream (instead of its redactions).
    pub stdout: Option<String>,
    pub stderr: Option<String>,
    pub annotations: BTreeMap<String, String>,
}

impl RequestDecision {
    /// Lets the request through unchanged.
    pub fn allow() -> Self {
        RequestDecision { verdict: Verdict::Allow, ..Default::default() }
    }

    /// Refuses the request with `reason`.
    pub fn deny(reason: impl Into<String>) -> Self {
        RequestDecision { verdict: Verdict::Deny, reason: reason.into(), ..Default::default() }
    }

    /// Replaces the code.
    pub fn rewrite_code(mut self, code: impl Into<String>) -> Self {
        self.rewrite.code = Some(code.into());
        self
    }

    /// Replaces the language (a name the agents run).
    pub fn rewrite_language(mut self, language: impl Into<String>) -> Self {
        self.rewrite.language = Some(language.into());
        self
    }

    /// Replaces the standard input.
    pub fn rewrite_stdin(mut self, stdin: impl Into<Vec<u8>>) -> Self {
        self.rewrite.stdin = Some(stdin.into());
        self
    }

    /// Lowers the run's timeout.
    pub fn limit_timeout(mut self, timeout: Duration) -> Self {
        self.limits.timeout = timeout;
        self
    }

    /// Lowers the run's memory.
    pub fn limit_memory(mut self, bytes: u64) -> Self {
        self.limits.memory_bytes = bytes;
        self
    }

    /// Lowers the output kept.
    pub fn limit_output(mut self, bytes: u64) -> Self {
        self.limits.output_bytes = bytes;
        self
    }

    /// Sends the run to agents with the label `key=value`.
    pub fn route(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.route.insert(key.into(), value.into());
        self
    }

    /// Narrows what the run may reach to `egress` (see [`RequestDecision::egress`]).
    pub fn narrow_egress(mut self, egress: Egress) -> Self {
        self.egress = Some(egress);
        self
    }

    /// Adds an annotation for logs and later policies.
    pub fn annotate(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.annotations.insert(key.into(), value.into());
        self
    }

    /// The decision's protobuf bytes.
    pub fn encode(&self) -> Vec<u8> {
        let mut b = Vec::new();
        wire::encode_request_decision(self, &mut b);
        b
    }
}

impl ResultDecision {
    /// Lets the result through unchanged.
    pub fn allow() -> Self {
        ResultDecision { verdict: Verdict::Allow, ..Default::default() }
    }

    /// Withholds the result; the caller gets `reason`.
    pub fn deny(reason: impl Into<String>) -> Self {
        ResultDecision { verdict: Verdict::Deny, reason: reason.into(), ..Default::default() }
    }

    /// Replaces the bytes `[start, end)` of `stream`; redactions must come
    /// in order and not overlap.
    pub fn redact(mut self, stream: Stream, start: usize, end: usize, replacement: impl Into<String>) -> Self {
        self.redactions.push(Redaction { stream, start: start as u32, end: end as u32, replacement: replacement.into() });
        self
    }

    /// Replaces the whole of stdout.
    pub fn replace_stdout(mut self, stdout: impl Into<String>) -> Self {
        self.stdout = Some(stdout.into());
        self
    }

    /// Replaces the whole of stderr.
    pub fn replace_stderr(mut self, stderr: impl Into<String>) -> Self {
        self.stderr = Some(stderr.into());
        self
    }

    /// Adds an annotation for logs.
    pub fn annotate(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.annotations.insert(key.into(), value.into());
        self
    }

    /// The decision's protobuf bytes.
    pub fn encode(&self) -> Vec<u8> {
        let mut b = Vec::new();
        wire::encode_result_decision(self, &mut b);
        b
    }
}

impl RequestInput {
    /// Decodes a `RequestInput`'s protobuf bytes.
    pub fn decode(b: &[u8]) -> Result<Self, DecodeError> {
        wire::decode_request_input(b)
    }
}

impl ResultInput {
    /// Decodes a `ResultInput`'s protobuf bytes.
    pub fn decode(b: &[u8]) -> Result<Self, DecodeError> {
        wire::decode_result_input(b)
    }
}

/// The exports of ABI v1, called by the code [`policy!`] generates.
#[doc(hidden)]
pub mod abi {
    use super::*;
    use std::cell::RefCell;

    thread_local! {
        // The stable buffer the host writes inputs into; it only grows.
        static INPUT: RefCell<Vec<u8>> = RefCell::new(Vec::new());
        // The last answer, kept until the next call.
        static OUTPUT: RefCell<Vec<u8>> = RefCell::new(Vec::new());
    }

    pub fn buffer(size: i32) -> i32 {
        let size = (size as u32 as usize).max(4096);
        INPUT.with(|input| {
            let mut input = input.borrow_mut();
            if input.len() < size {
                *input = vec![0; size];
            }
            input.as_mut_ptr() as usize as i32
        })
    }

    fn answer(bytes: Vec<u8>) -> i64 {
        OUTPUT.with(|out| {
            let mut out = out.borrow_mut();
            *out = bytes;
            if out.is_empty() {
                return 0;
            }
            ((out.as_ptr() as usize as u64) << 32 | out.len() as u64) as i64
        })
    }

    fn with_input<T>(len: i32, f: impl FnOnce(&[u8]) -> T) -> T {
        INPUT.with(|input| f(&input.borrow()[..len as u32 as usize]))
    }

    pub fn init(len: i32, f: impl FnOnce(&[u8]) -> Result<(), String>) -> i64 {
        match with_input(len, f) {
            Ok(()) => answer(Vec::new()),
            Err(msg) if msg.is_empty() => answer(b"init failed".to_vec()),
            Err(msg) => answer(msg.into_bytes()),
        }
    }

    pub fn request(len: i32, f: impl FnOnce(&RequestInput) -> RequestDecision) -> i64 {
        let input = with_input(len, RequestInput::decode)
            .unwrap_or_else(|e| panic!("codemode policy: decode request input: {}", e));
        answer(f(&input).encode())
    }

    pub fn result(len: i32, f: impl FnOnce(&ResultInput) -> ResultDecision) -> i64 {
        let input = with_input(len, ResultInput::decode)
            .unwrap_or_else(|e| panic!("codemode policy: decode result input: {}", e));
        answer(f(&input).encode())
    }
}

/// Exports a policy: `init` (optional) receives the configuration bytes once
/// per instance, `request` and `result` decide each evaluation of their
/// phase. Use it once per crate, at the top level:
///
/// ```ignore
/// policy! { init: parse_config, request: decide }
/// policy! { result: redact }
/// ```
#[macro_export]
macro_rules! policy {
    ($($kind:ident : $f:expr),+ $(,)?) => {
        #[no_mangle]
        pub extern "C" fn codemode_abi_version() -> i32 { 1 }
        #[no_mangle]
        pub extern "C" fn codemode_buffer(size: i32) -> i32 { $crate::abi::buffer(size) }
        $( $crate::policy!(@export $kind $f); )+
    };
    (@export init $f:expr) => {
        #[no_mangle]
        pub extern "C" fn codemode_init(len: i32) -> i64 { $crate::abi::init(len, $f) }
    };
    (@export request $f:expr) => {
        #[no_mangle]
        pub extern "C" fn codemode_request(len: i32) -> i64 { $crate::abi::request(len, $f) }
    };
    (@export result $f:expr) => {
        #[no_mangle]
        pub extern "C" fn codemode_result(len: i32) -> i64 { $crate::abi::result(len, $f) }
    };
}
