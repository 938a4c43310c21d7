//! decisions answers, by tenant, a decision made with each of the SDK's
//! helpers, for the test that checks what the host makes of them
//! (edge/internal/policytool).

use std::time::Duration;

use codemode_policy::{
    policy, Egress, EgressLimits, EgressRule, RequestDecision, RequestInput, ResultDecision, ResultInput, Stream,
};

fn request(input: &RequestInput) -> RequestDecision {
    match input.tenant.as_str() {
        "rewrite" => RequestDecision::allow()
            .rewrite_code("print(2)")
            .rewrite_language("bash")
            .rewrite_stdin(vec![0u8, 1, 255]),
        "limits" => RequestDecision::allow()
            .limit_timeout(Duration::from_millis(1500))
            .limit_memory(1 << 20)
            .limit_output(1000),
        "route" => {
            let mut d = RequestDecision::allow().route("pool", "gpu");
            d.route_priority = 3;
            d
        }
        "egress" => RequestDecision::allow().narrow_egress(Egress {
            allow: vec![EgressRule { host: "api.github.com".to_string(), ports: vec![443] }],
            limits: EgressLimits { connections: 2, bytes: 1000, connection_time: Duration::from_secs(5) },
        }),
        "nothing" => RequestDecision::allow().narrow_egress(Egress::default()),
        "annotate" => RequestDecision::allow().annotate("a", "1").annotate("b", "2"),
        _ => RequestDecision::deny("no decision for tenant"),
    }
}

fn result(input: &ResultInput) -> ResultDecision {
    match input.tenant.as_str() {
        "replace" => ResultDecision::allow().replace_stdout("new out").replace_stderr(""),
        "redact" => ResultDecision::allow()
            .redact(Stream::Stdout, 0, 3, "XXX")
            .redact(Stream::Stderr, 1, 2, "")
            .annotate("redacted", "2"),
        _ => ResultDecision::deny("withheld"),
    }
}

policy! { request: request, result: result }
