//! tenantblock is a request-phase policy: it denies every request from the
//! tenant named in its configuration (the configuration bytes are the tenant
//! name, at most 256 bytes) and allows all others. The Rust port of
//! policies/examples/tenantblock/tenantblock.wat.

use std::cell::RefCell;

use codemode_policy::{policy, RequestDecision, RequestInput};

thread_local! {
    static BLOCKED: RefCell<String> = RefCell::new(String::new());
}

fn init(config: &[u8]) -> Result<(), String> {
    if config.len() > 256 {
        return Err("config too long".to_string());
    }
    let tenant = String::from_utf8(config.to_vec()).map_err(|_| "config is not UTF-8".to_string())?;
    BLOCKED.with(|b| *b.borrow_mut() = tenant);
    Ok(())
}

fn request(input: &RequestInput) -> RequestDecision {
    let blocked = BLOCKED.with(|b| !input.tenant.is_empty() && *b.borrow() == input.tenant);
    if blocked {
        return RequestDecision::deny("tenant is suspended by the tenant policy");
    }
    RequestDecision::allow()
}

policy! { init: init, request: request }
