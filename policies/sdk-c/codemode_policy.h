/*
 * codemode_policy.h: the codemode policy SDK for C. Write a WebAssembly
 * policy (ABI v1, policies/ABI.md) as one function over typed inputs and
 * decisions; the SDK (codemode_policy.c) decodes the host's protobuf input,
 * encodes the decision and exports what the ABI asks for.
 *
 *     #include "codemode_policy.h"
 *
 *     static cm_request_decision decide(const cm_request_input *in) {
 *         if (cm_eq(in->tenant, "anonymous") && cm_eq(in->execution.language, "bash"))
 *             return cm_deny("sign in to run bash");
 *         cm_request_decision d = cm_allow();
 *         cm_route(&d, "pool", "general");
 *         return d;
 *     }
 *     CODEMODE_REQUEST(decide)
 *
 * Build with clang for wasm32-wasi as a reactor, with Debian's wasi-libc:
 *
 *     clang --target=wasm32-wasi -mexec-model=reactor -O2 -I policies/sdk-c \
 *         policies/sdk-c/codemode_policy.c my_policy.c -o my_policy.wasm
 *
 * Strings are views (cm_str: a pointer and a length, not NUL-terminated).
 * Those of an input point into the host's buffer and stay valid until the
 * handler returns; those a decision holds must stay valid until then too
 * (literals, the input's views, or memory the policy keeps).
 *
 * Handlers run one call at a time per instance; the host may discard an
 * instance and make a fresh one at any time, so keep nothing in globals
 * that matters beyond a cache (the configuration init parsed is fine: every
 * new instance is given it again).
 */
#ifndef CODEMODE_POLICY_H
#define CODEMODE_POLICY_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* A string or bytes: a view of len bytes at ptr. */
typedef struct {
	const char *ptr;
	size_t len;
} cm_str;

/* cm_cstr views a NUL-terminated string. */
cm_str cm_cstr(const char *s);
/* cm_eq reports whether a equals the NUL-terminated string b. */
bool cm_eq(cm_str a, const char *b);
/* cm_equal reports whether a and b hold the same bytes. */
bool cm_equal(cm_str a, cm_str b);

typedef struct {
	cm_str key, value;
} cm_pair;

/* Verdicts and streams, as codemode.policy.v1 numbers them. */
enum { CM_VERDICT_UNSPECIFIED = 0, CM_ALLOW = 1, CM_DENY = 2 };
enum { CM_STREAM_UNSPECIFIED = 0, CM_STDOUT = 1, CM_STDERR = 2 };

/* A file written into the sandbox's /workspace before the run. */
typedef struct {
	cm_str path, content;
} cm_file;

/* What the caller asked to run; codemode.execution.v1.Execution. */
typedef struct {
	cm_str language; /* a name of the agents' language table */
	cm_str code;     /* empty when a session opens or an API tool is called */
	cm_str session_id;
	int64_t timeout_ns; /* 0: the edge's default */
	cm_str stdin_bytes;
	cm_file *files;
	size_t n_files;
	uint64_t memory_bytes, output_bytes; /* 0: the default */
} cm_execution;

/* One destination of a run's egress: a name, "*.domain", an address or a
 * prefix; no ports: 80 and 443. */
#define CM_MAX_PORTS 32
typedef struct {
	cm_str host;
	uint32_t ports[CM_MAX_PORTS];
	size_t n_ports;
} cm_egress_rule;

/* What a run may reach outside its sandbox; limits of 0: the default. */
typedef struct {
	cm_egress_rule *allow;
	size_t n_allow;
	uint32_t connections;
	uint64_t bytes;
	int64_t connection_time_ns;
} cm_egress;

/* A call of a declared API tool (door "mcp-api"); present tells whether
 * the input has one. */
typedef struct {
	bool present;
	cm_str api, tool, arguments_json, method, url;
} cm_api_call;

/* The input of the request phase; codemode.policy.v1.RequestInput. */
typedef struct {
	cm_execution execution;
	cm_str tenant; /* "anonymous" without an API key */
	cm_str door;   /* "connect", "grpc", "grpcweb", "mcp", "mcp-api", ... */
	cm_str request_id;
	cm_pair *annotations; /* set by earlier policies of the chain */
	size_t n_annotations;
	cm_egress egress; /* as earlier policies left it; no rules: nothing */
	cm_api_call api_call;
	cm_str subject; /* a hash of a token caller's issuer and subject; empty for API keys */
} cm_request_input;

/* What came of a run; codemode.execution.v1.Result. */
typedef struct {
	int32_t exit_code;
	cm_str stdout_text, stderr_text;
	bool timed_out, truncated, oom_killed;
	int64_t duration_ns;
	cm_str agent, session_id;
} cm_result;

/* The input of the result phase; codemode.policy.v1.ResultInput. */
typedef struct {
	cm_result result;
	cm_str tenant, door, request_id, language;
	cm_pair *annotations; /* the request phase's */
	size_t n_annotations;
} cm_result_input;

#define CM_MAX_ANNOTATIONS 16
#define CM_MAX_ROUTE 16

/* The answer of the request phase; build it with the helpers below. */
typedef struct {
	int verdict;
	cm_str reason; /* shown to the caller when denied; at most 1024 bytes */
	bool has_code, has_language, has_stdin;
	cm_str code, language, stdin_bytes; /* rewrites */
	int64_t timeout_ns;                 /* limits: 0, no opinion */
	uint64_t memory_bytes, output_bytes;
	cm_pair route[CM_MAX_ROUTE];
	size_t n_route;
	int32_t route_priority;
	cm_pair annotations[CM_MAX_ANNOTATIONS];
	size_t n_annotations;
	bool has_egress; /* narrow egress to egress (see cm_narrow_egress) */
	cm_egress egress;
} cm_request_decision;

/* Replaces the bytes [start, end) of one stream with replacement. */
typedef struct {
	int stream;
	uint32_t start, end;
	cm_str replacement;
} cm_redaction;

/* The answer of the result phase. */
typedef struct {
	int verdict;
	cm_str reason;
	cm_redaction *redactions; /* in order, not overlapping */
	size_t n_redactions, cap_redactions;
	bool has_stdout, has_stderr; /* replace a whole stream */
	cm_str stdout_text, stderr_text;
	cm_pair annotations[CM_MAX_ANNOTATIONS];
	size_t n_annotations;
} cm_result_decision;

/* Request decisions. */
cm_request_decision cm_allow(void);
cm_request_decision cm_deny(const char *reason);
cm_request_decision cm_deny_str(cm_str reason);
void cm_rewrite_code(cm_request_decision *d, cm_str code);
void cm_rewrite_language(cm_request_decision *d, cm_str language);
void cm_rewrite_stdin(cm_request_decision *d, cm_str stdin_bytes);
void cm_limit_timeout(cm_request_decision *d, int64_t timeout_ns);
void cm_limit_memory(cm_request_decision *d, uint64_t bytes);
void cm_limit_output(cm_request_decision *d, uint64_t bytes);
/* cm_route sends the run to agents labelled key=value; false when full. */
bool cm_route(cm_request_decision *d, const char *key, const char *value);
/* cm_narrow_egress sets what the run may reach: the host narrows it to what
 * the input's egress allows too, so a policy can take egress away, never
 * add it; no rules: nothing. The rules must stay valid until the handler
 * returns. */
void cm_narrow_egress(cm_request_decision *d, cm_egress egress);
/* cm_annotate adds an annotation for logs and later policies; false when
 * there are CM_MAX_ANNOTATIONS already. */
bool cm_annotate(cm_request_decision *d, cm_str key, cm_str value);

/* Result decisions. */
cm_result_decision cm_allow_result(void);
cm_result_decision cm_deny_result(const char *reason);
/* cm_redact replaces [start, end) of stream (CM_STDOUT or CM_STDERR). */
void cm_redact(cm_result_decision *d, int stream, size_t start, size_t end, const char *replacement);
void cm_replace_stdout(cm_result_decision *d, cm_str text);
void cm_replace_stderr(cm_result_decision *d, cm_str text);
bool cm_annotate_result(cm_result_decision *d, cm_str key, cm_str value);

/* Handlers. An init handler gets the configuration once per instance and
 * returns NULL, or an error message (a NUL-terminated string that stays
 * valid) when the configuration is wrong. */
typedef const char *(*cm_init_handler)(cm_str config);
typedef cm_request_decision (*cm_request_handler)(const cm_request_input *in);
typedef cm_result_decision (*cm_result_handler)(const cm_result_input *in);

int64_t cm__init(int32_t len, cm_init_handler f);
int64_t cm__request(int32_t len, cm_request_handler f);
int64_t cm__result(int32_t len, cm_result_handler f);

/* Export a handler, once each, at file scope. */
#define CODEMODE_INIT(f) \
	__attribute__((export_name("codemode_init"))) int64_t codemode_init(int32_t len) { return cm__init(len, f); }
#define CODEMODE_REQUEST(f) \
	__attribute__((export_name("codemode_request"))) int64_t codemode_request(int32_t len) { return cm__request(len, f); }
#define CODEMODE_RESULT(f) \
	__attribute__((export_name("codemode_result"))) int64_t codemode_result(int32_t len) { return cm__result(len, f); }

#ifdef __cplusplus
}
#endif

#endif
