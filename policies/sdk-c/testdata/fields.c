/*
 * fields allows every request and result and annotates it with the fields
 * the SDK decoded, for the test that compares them with what the host sent
 * (edge/internal/policytool).
 */
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "codemode_policy.h"

static char execution[256], caller[256], egress[256], api[256];

#define S(s) (int)(s).len, (s).ptr

/* add appends printf output to buf, within its size. */
__attribute__((format(printf, 3, 4))) static void add(char *buf, size_t size, const char *fmt, ...) {
	size_t n = strlen(buf);
	if (n >= size)
		return;
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(buf + n, size - n, fmt, ap);
	va_end(ap);
}

static cm_request_decision request(const cm_request_input *in) {
	const cm_execution *e = &in->execution;
	execution[0] = caller[0] = egress[0] = api[0] = 0;
	add(execution, sizeof execution, "%.*s|%.*s|%.*s|%" PRId64 "|", S(e->language), S(e->code), S(e->session_id), e->timeout_ns);
	for (size_t i = 0; i < e->stdin_bytes.len; i++)
		add(execution, sizeof execution, "%s%u", i ? "." : "", (unsigned)(uint8_t)e->stdin_bytes.ptr[i]);
	add(execution, sizeof execution, "|");
	for (size_t i = 0; i < e->n_files; i++)
		add(execution, sizeof execution, "%s%.*s=%zu", i ? "," : "", S(e->files[i].path), e->files[i].content.len);
	add(execution, sizeof execution, "|%" PRIu64 "|%" PRIu64, e->memory_bytes, e->output_bytes);
	add(caller, sizeof caller, "%.*s|%.*s|%.*s|%.*s", S(in->tenant), S(in->door), S(in->request_id), S(in->subject));
	for (size_t i = 0; i < in->egress.n_allow; i++) {
		const cm_egress_rule *r = &in->egress.allow[i];
		add(egress, sizeof egress, "%s%.*s:", i ? "," : "", S(r->host));
		for (size_t j = 0; j < r->n_ports; j++)
			add(egress, sizeof egress, "%s%" PRIu32, j ? "/" : "", r->ports[j]);
	}
	add(egress, sizeof egress, "|%" PRIu32 "|%" PRIu64 "|%" PRId64, in->egress.connections, in->egress.bytes,
	    in->egress.connection_time_ns);
	cm_request_decision d = cm_allow();
	cm_annotate(&d, cm_cstr("execution"), cm_cstr(execution));
	cm_annotate(&d, cm_cstr("caller"), cm_cstr(caller));
	cm_annotate(&d, cm_cstr("egress"), cm_cstr(egress));
	if (in->api_call.present) {
		const cm_api_call *c = &in->api_call;
		add(api, sizeof api, "%.*s|%.*s|%.*s|%.*s|%.*s", S(c->api), S(c->tool), S(c->arguments_json), S(c->method), S(c->url));
		cm_annotate(&d, cm_cstr("api"), cm_cstr(api));
	}
	return d;
}

static char result_text[256], annotations[256];

static cm_result_decision result(const cm_result_input *in) {
	const cm_result *r = &in->result;
	result_text[0] = caller[0] = annotations[0] = 0;
	add(result_text, sizeof result_text, "%" PRId32 "|%.*s|%.*s|%s|%s|%s|%" PRId64 "|%.*s|%.*s", r->exit_code,
	    S(r->stdout_text), S(r->stderr_text), r->timed_out ? "true" : "false", r->truncated ? "true" : "false",
	    r->oom_killed ? "true" : "false", r->duration_ns, S(r->agent), S(r->session_id));
	add(caller, sizeof caller, "%.*s|%.*s|%.*s|%.*s", S(in->tenant), S(in->door), S(in->request_id), S(in->language));
	const char *k = "-";
	static char value[256];
	for (size_t i = 0; i < in->n_annotations; i++) {
		if (cm_eq(in->annotations[i].key, "k")) {
			snprintf(value, sizeof value, "%.*s", S(in->annotations[i].value));
			k = value;
		}
	}
	add(annotations, sizeof annotations, "%zu|%s", in->n_annotations, k);
	cm_result_decision d = cm_allow_result();
	cm_annotate_result(&d, cm_cstr("result"), cm_cstr(result_text));
	cm_annotate_result(&d, cm_cstr("caller"), cm_cstr(caller));
	cm_annotate_result(&d, cm_cstr("annotations"), cm_cstr(annotations));
	return d;
}

CODEMODE_REQUEST(request)
CODEMODE_RESULT(result)
