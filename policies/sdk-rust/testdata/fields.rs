//! fields allows every request and result and annotates it with the fields
//! the SDK decoded, for the test that compares them with what the host sent
//! (edge/internal/policytool).

use codemode_policy::{policy, RequestDecision, RequestInput, ResultDecision, ResultInput};

fn request(input: &RequestInput) -> RequestDecision {
    let e = &input.execution;
    let files: Vec<String> = e.files.iter().map(|f| format!("{}={}", f.path, f.content.len())).collect();
    let rules: Vec<String> = input
        .egress
        .allow
        .iter()
        .map(|r| format!("{}:{}", r.host, r.ports.iter().map(|p| p.to_string()).collect::<Vec<_>>().join("/")))
        .collect();
    let l = &input.egress.limits;
    let mut d = RequestDecision::allow()
        .annotate(
            "execution",
            format!(
                "{}|{}|{}|{}|{}|{}|{}|{}",
                e.language,
                e.code,
                e.session_id,
                e.timeout.as_nanos(),
                e.stdin.iter().map(|b| b.to_string()).collect::<Vec<_>>().join("."),
                files.join(","),
                e.memory_bytes,
                e.output_bytes
            ),
        )
        .annotate("caller", format!("{}|{}|{}|{}", input.tenant, input.door, input.request_id, input.subject))
        .annotate(
            "egress",
            format!("{}|{}|{}|{}", rules.join(","), l.connections, l.bytes, l.connection_time.as_nanos()),
        );
    if let Some(c) = &input.api_call {
        d = d.annotate("api", format!("{}|{}|{}|{}|{}", c.api, c.tool, c.arguments_json, c.method, c.url));
    }
    d
}

fn result(input: &ResultInput) -> ResultDecision {
    let r = &input.result;
    ResultDecision::allow()
        .annotate(
            "result",
            format!(
                "{}|{}|{}|{}|{}|{}|{}|{}|{}",
                r.exit_code,
                r.stdout,
                r.stderr,
                r.timed_out,
                r.truncated,
                r.oom_killed,
                r.duration.as_nanos(),
                r.agent,
                r.session_id
            ),
        )
        .annotate("caller", format!("{}|{}|{}|{}", input.tenant, input.door, input.request_id, input.language))
        .annotate(
            "annotations",
            format!("{}|{}", input.annotations.len(), input.annotations.get("k").map(String::as_str).unwrap_or("-")),
        )
}

policy! { request: request, result: result }
