/*
 * decisions answers, by tenant, a decision made with each of the SDK's
 * helpers, for the test that checks what the host makes of them
 * (edge/internal/policytool).
 */
#include "codemode_policy.h"

static cm_egress_rule github = {{"api.github.com", 14}, {443}, 1};

static cm_request_decision request(const cm_request_input *in) {
	cm_request_decision d = cm_allow();
	if (cm_eq(in->tenant, "rewrite")) {
		cm_rewrite_code(&d, cm_cstr("print(2)"));
		cm_rewrite_language(&d, cm_cstr("bash"));
		cm_str stdin_bytes = {"\x00\x01\xff", 3};
		cm_rewrite_stdin(&d, stdin_bytes);
	} else if (cm_eq(in->tenant, "limits")) {
		cm_limit_timeout(&d, 1500000000);
		cm_limit_memory(&d, 1 << 20);
		cm_limit_output(&d, 1000);
	} else if (cm_eq(in->tenant, "route")) {
		cm_route(&d, "pool", "gpu");
		d.route_priority = 3;
	} else if (cm_eq(in->tenant, "egress")) {
		cm_egress e = {&github, 1, 2, 1000, 5000000000};
		cm_narrow_egress(&d, e);
	} else if (cm_eq(in->tenant, "nothing")) {
		cm_egress e = {0};
		cm_narrow_egress(&d, e);
	} else if (cm_eq(in->tenant, "annotate")) {
		cm_annotate(&d, cm_cstr("a"), cm_cstr("1"));
		cm_annotate(&d, cm_cstr("b"), cm_cstr("2"));
	} else {
		return cm_deny("no decision for tenant");
	}
	return d;
}

static cm_result_decision result(const cm_result_input *in) {
	cm_result_decision d = cm_allow_result();
	if (cm_eq(in->tenant, "replace")) {
		cm_replace_stdout(&d, cm_cstr("new out"));
		cm_replace_stderr(&d, cm_cstr(""));
	} else if (cm_eq(in->tenant, "redact")) {
		cm_redact(&d, CM_STDOUT, 0, 3, "XXX");
		cm_redact(&d, CM_STDERR, 1, 2, "");
		cm_annotate_result(&d, cm_cstr("redacted"), cm_cstr("2"));
	} else {
		return cm_deny_result("withheld");
	}
	return d;
}

CODEMODE_REQUEST(request)
CODEMODE_RESULT(result)
