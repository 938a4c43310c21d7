//! egress is a request-phase policy that narrows, per tenant, what runs may
//! reach outside their sandboxes, and can keep a tenant's API tool calls
//! read-only. The Rust port of policies/examples/egress, with the same
//! configuration: one line per tenant, "tenant: directive, ...", "*" for
//! every tenant without its own line, "#" for comments. Directives:
//! https-only, no-wildcards, connections N, read-only-apis.

use std::cell::RefCell;
use std::collections::BTreeMap;

use codemode_policy::{policy, Egress, EgressLimits, RequestDecision, RequestInput};

/// What one configuration line says.
#[derive(Clone, Default)]
struct Rules {
    https_only: bool,
    no_wildcards: bool,
    read_only_apis: bool,
    connections: u32,
    /// The directives that narrow egress, for the annotation.
    names: String,
}

thread_local! {
    static BY_TENANT: RefCell<BTreeMap<String, Rules>> = RefCell::new(BTreeMap::new());
}

fn init(config: &[u8]) -> Result<(), String> {
    let config = std::str::from_utf8(config).map_err(|_| "config is not UTF-8".to_string())?;
    let mut by_tenant = BTreeMap::new();
    for (i, line) in config.split('\n').enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let (tenant, directives) = line
            .split_once(':')
            .ok_or_else(|| format!("line {}: want \"tenant: directive, ...\"", i + 1))?;
        let mut r = Rules::default();
        let mut names = Vec::new();
        for d in directives.split(',') {
            let f: Vec<&str> = d.split_whitespace().collect();
            match f.as_slice() {
                [] => {}
                ["https-only"] => {
                    r.https_only = true;
                    names.push(f[0].to_string());
                }
                ["no-wildcards"] => {
                    r.no_wildcards = true;
                    names.push(f[0].to_string());
                }
                ["read-only-apis"] => r.read_only_apis = true,
                ["connections", n] => {
                    r.connections = match n.parse::<u32>() {
                        Ok(n) if n > 0 => n,
                        _ => return Err(format!("line {}: connections wants a positive number, not {:?}", i + 1, n)),
                    };
                    names.push(format!("connections {}", n));
                }
                _ => {
                    return Err(format!(
                        "line {}: unknown directive {:?} (want https-only, no-wildcards, connections N or read-only-apis)",
                        i + 1,
                        d.trim()
                    ))
                }
            }
        }
        r.names = names.join(", ");
        by_tenant.insert(tenant.trim().to_string(), r);
    }
    BY_TENANT.with(|t| *t.borrow_mut() = by_tenant);
    Ok(())
}

fn request(input: &RequestInput) -> RequestDecision {
    let rules = BY_TENANT.with(|t| {
        let t = t.borrow();
        t.get(&input.tenant).or_else(|| t.get("*")).cloned()
    });
    let r = match rules {
        Some(r) => r,
        None => return RequestDecision::allow(),
    };
    if let Some(c) = &input.api_call {
        let reads = c.method.eq_ignore_ascii_case("GET") || c.method.eq_ignore_ascii_case("HEAD");
        if r.read_only_apis && !reads {
            return RequestDecision::deny(format!(
                "tenant {} may only read through API tools; {} is a {}",
                input.tenant, c.tool, c.method
            ));
        }
    }
    if r.names.is_empty() {
        return RequestDecision::allow();
    }
    let mut egress = Egress { allow: Vec::new(), limits: EgressLimits { connections: r.connections, ..Default::default() } };
    for rule in &input.egress.allow {
        if r.no_wildcards && (rule.host.starts_with("*.") || rule.host.contains('/')) {
            continue;
        }
        let mut rule = rule.clone();
        if r.https_only && !is_api(&rule.host) {
            if !allows_https(&rule.ports) {
                continue;
            }
            rule.ports = vec![443];
        }
        egress.allow.push(rule);
    }
    let note = format!("kept {} of {} rules ({})", egress.allow.len(), input.egress.allow.len(), r.names);
    RequestDecision::allow().narrow_egress(egress).annotate("egress", note)
}

/// Whether host names one of the edge's configured APIs.
fn is_api(host: &str) -> bool {
    host.trim_end_matches('.').to_ascii_lowercase().ends_with(".api.codemode")
}

/// Whether a rule's ports include 443 (none: 80 and 443).
fn allows_https(ports: &[u32]) -> bool {
    ports.is_empty() || ports.contains(&443)
}

policy! { init: init, request: request }
