/*
 * codemode_policy.c: the exports of ABI v1 and a minimal protobuf codec for
 * its messages. It decodes exactly the fields it knows, skips unknown ones
 * as the protobuf spec requires (later hosts may add input fields), and
 * encodes in field-number order. See codemode_policy.h.
 */
#include "codemode_policy.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* --- strings ------------------------------------------------------------ */

cm_str cm_cstr(const char *s) {
	cm_str v = {s, s ? strlen(s) : 0};
	return v;
}

bool cm_equal(cm_str a, cm_str b) {
	return a.len == b.len && (a.len == 0 || memcmp(a.ptr, b.ptr, a.len) == 0);
}

bool cm_eq(cm_str a, const char *b) { return cm_equal(a, cm_cstr(b)); }

/* --- state of the instance ---------------------------------------------- */

/* One call runs at a time in an instance: no locking. */
static uint8_t *input;     /* the stable buffer the host writes into */
static size_t input_cap;   /* it only grows */
static uint8_t *output;    /* the last answer, kept until the next call */
static size_t output_len, output_cap;

/* Growable arrays the decoder fills, reused by every call. */
static cm_file *files;
static size_t files_cap;
static cm_egress_rule *rules;
static size_t rules_cap;
static cm_pair *pairs;
static size_t pairs_cap;

static void fail(const char *what) {
	fprintf(stderr, "codemode policy: %s\n", what);
	__builtin_trap();
}

static void *grow(void *p, size_t *cap, size_t need, size_t size) {
	if (need <= *cap)
		return p;
	size_t n = *cap ? *cap : 8;
	while (n < need)
		n *= 2;
	p = realloc(p, n * size);
	if (!p)
		fail("out of memory");
	*cap = n;
	return p;
}

__attribute__((export_name("codemode_abi_version"))) int32_t codemode_abi_version(void) { return 1; }

__attribute__((export_name("codemode_buffer"))) int32_t codemode_buffer(int32_t size) {
	size_t n = (uint32_t)size < 4096 ? 4096 : (uint32_t)size;
	if (input_cap < n) {
		free(input);
		input = malloc(n);
		if (!input)
			fail("out of memory for the input buffer");
		input_cap = n;
	}
	return (int32_t)(uintptr_t)input;
}

static int64_t answer(void) {
	if (output_len == 0)
		return 0;
	return (int64_t)((uint64_t)(uintptr_t)output << 32 | (uint64_t)output_len);
}

/* --- decoding ----------------------------------------------------------- */

enum { VARINT = 0, FIXED64 = 1, BYTES = 2, FIXED32 = 5 };

typedef struct {
	const uint8_t *p, *end;
	bool err;
} reader;

static uint64_t varint(reader *r) {
	uint64_t v = 0;
	for (int i = 0; i < 10; i++) {
		if (r->p >= r->end)
			break;
		uint8_t c = *r->p++;
		v |= (uint64_t)(c & 0x7f) << (7 * i);
		if (c < 0x80)
			return v;
	}
	r->err = true;
	r->p = r->end;
	return 0;
}

static bool next(reader *r, uint32_t *num, int *typ) {
	if (r->err || r->p >= r->end)
		return false;
	uint64_t t = varint(r);
	if (r->err || t >> 3 == 0 || t >> 3 > 0x7fffffff) {
		r->err = true;
		return false;
	}
	*num = (uint32_t)(t >> 3);
	*typ = (int)(t & 7);
	return true;
}

static cm_str bytes(reader *r, int typ) {
	cm_str s = {0, 0};
	if (typ != BYTES) {
		r->err = true;
		return s;
	}
	uint64_t n = varint(r);
	if (r->err || n > (uint64_t)(r->end - r->p)) {
		r->err = true;
		r->p = r->end;
		return s;
	}
	s.ptr = (const char *)r->p;
	s.len = (size_t)n;
	r->p += n;
	return s;
}

static void skip(reader *r, int typ) {
	switch (typ) {
	case VARINT:
		varint(r);
		return;
	case FIXED64:
	case FIXED32: {
		size_t n = typ == FIXED64 ? 8 : 4;
		if ((size_t)(r->end - r->p) < n) {
			r->err = true;
			return;
		}
		r->p += n;
		return;
	}
	case BYTES:
		bytes(r, typ);
		return;
	}
	r->err = true;
}

static uint64_t uint_(reader *r, int typ) {
	if (typ != VARINT) {
		r->err = true;
		return 0;
	}
	return varint(r);
}

static reader sub(reader *r, int typ) {
	cm_str s = bytes(r, typ);
	reader out = {(const uint8_t *)s.ptr, (const uint8_t *)s.ptr + s.len, r->err};
	return out;
}

/* A google.protobuf.Duration, in nanoseconds. */
static int64_t duration(reader *r, int typ) {
	reader s = sub(r, typ);
	int64_t secs = 0, nanos = 0;
	uint32_t num;
	int t;
	while (next(&s, &num, &t)) {
		if (num == 1)
			secs = (int64_t)uint_(&s, t);
		else if (num == 2)
			nanos = (int32_t)uint_(&s, t);
		else
			skip(&s, t);
	}
	if (s.err)
		r->err = true;
	if (secs > INT64_MAX / 1000000000)
		return INT64_MAX;
	return secs * 1000000000 + nanos;
}

static void map_entry(reader *r, int typ, size_t *n) {
	reader s = sub(r, typ);
	cm_pair kv = {{0, 0}, {0, 0}};
	uint32_t num;
	int t;
	while (next(&s, &num, &t)) {
		if (num == 1)
			kv.key = bytes(&s, t);
		else if (num == 2)
			kv.value = bytes(&s, t);
		else
			skip(&s, t);
	}
	if (s.err)
		r->err = true;
	pairs = grow(pairs, &pairs_cap, *n + 1, sizeof *pairs);
	pairs[(*n)++] = kv;
}

static void decode_execution(reader *r, cm_execution *e) {
	uint32_t num;
	int t;
	size_t n = 0;
	while (next(r, &num, &t)) {
		switch (num) {
		case 1: e->language = bytes(r, t); break;
		case 2: e->code = bytes(r, t); break;
		case 3: e->session_id = bytes(r, t); break;
		case 4: e->timeout_ns = duration(r, t); break;
		case 5: e->stdin_bytes = bytes(r, t); break;
		case 6: {
			reader s = sub(r, t);
			cm_file f = {{0, 0}, {0, 0}};
			uint32_t fn;
			int ft;
			while (next(&s, &fn, &ft)) {
				if (fn == 1)
					f.path = bytes(&s, ft);
				else if (fn == 2)
					f.content = bytes(&s, ft);
				else
					skip(&s, ft);
			}
			r->err |= s.err;
			files = grow(files, &files_cap, n + 1, sizeof *files);
			files[n++] = f;
			break;
		}
		case 7: {
			reader s = sub(r, t);
			uint32_t ln;
			int lt;
			while (next(&s, &ln, &lt)) {
				if (ln == 1)
					e->memory_bytes = uint_(&s, lt);
				else if (ln == 2)
					e->output_bytes = uint_(&s, lt);
				else
					skip(&s, lt);
			}
			r->err |= s.err;
			break;
		}
		default: skip(r, t);
		}
	}
	e->files = files;
	e->n_files = n;
}

static void decode_ports(reader *r, int typ, cm_egress_rule *rule) {
	if (typ == VARINT) {
		uint32_t p = (uint32_t)varint(r);
		if (rule->n_ports < CM_MAX_PORTS)
			rule->ports[rule->n_ports++] = p;
		return;
	}
	reader s = sub(r, typ);
	while (!s.err && s.p < s.end) {
		uint32_t p = (uint32_t)varint(&s);
		if (rule->n_ports < CM_MAX_PORTS)
			rule->ports[rule->n_ports++] = p;
	}
	r->err |= s.err;
}

static void decode_egress(reader *r, cm_egress *e) {
	uint32_t num;
	int t;
	size_t n = 0;
	while (next(r, &num, &t)) {
		if (num == 1) {
			reader s = sub(r, t);
			rules = grow(rules, &rules_cap, n + 1, sizeof *rules);
			cm_egress_rule *rule = &rules[n++];
			memset(rule, 0, sizeof *rule);
			uint32_t rn;
			int rt;
			while (next(&s, &rn, &rt)) {
				if (rn == 1)
					rule->host = bytes(&s, rt);
				else if (rn == 2)
					decode_ports(&s, rt, rule);
				else
					skip(&s, rt);
			}
			r->err |= s.err;
		} else if (num == 2) {
			reader s = sub(r, t);
			uint32_t ln;
			int lt;
			while (next(&s, &ln, &lt)) {
				if (ln == 1)
					e->connections = (uint32_t)uint_(&s, lt);
				else if (ln == 2)
					e->bytes = uint_(&s, lt);
				else if (ln == 3)
					e->connection_time_ns = duration(&s, lt);
				else
					skip(&s, lt);
			}
			r->err |= s.err;
		} else {
			skip(r, t);
		}
	}
	e->allow = rules;
	e->n_allow = n;
}

static void decode_api_call(reader *r, cm_api_call *c) {
	uint32_t num;
	int t;
	c->present = true;
	while (next(r, &num, &t)) {
		switch (num) {
		case 1: c->api = bytes(r, t); break;
		case 2: c->tool = bytes(r, t); break;
		case 3: c->arguments_json = bytes(r, t); break;
		case 4: c->method = bytes(r, t); break;
		case 5: c->url = bytes(r, t); break;
		default: skip(r, t);
		}
	}
}

static bool decode_request_input(const uint8_t *b, size_t len, cm_request_input *in) {
	memset(in, 0, sizeof *in);
	reader r = {b, b + len, false};
	uint32_t num;
	int t;
	size_t n_pairs = 0;
	while (next(&r, &num, &t)) {
		switch (num) {
		case 1: {
			reader s = sub(&r, t);
			decode_execution(&s, &in->execution);
			r.err |= s.err;
			break;
		}
		case 2: in->tenant = bytes(&r, t); break;
		case 3: in->door = bytes(&r, t); break;
		case 4: in->request_id = bytes(&r, t); break;
		case 5: map_entry(&r, t, &n_pairs); break;
		case 6: {
			reader s = sub(&r, t);
			decode_egress(&s, &in->egress);
			r.err |= s.err;
			break;
		}
		case 7: {
			reader s = sub(&r, t);
			decode_api_call(&s, &in->api_call);
			r.err |= s.err;
			break;
		}
		case 8: in->subject = bytes(&r, t); break;
		default: skip(&r, t);
		}
	}
	in->annotations = pairs;
	in->n_annotations = n_pairs;
	return !r.err;
}

static bool decode_result_input(const uint8_t *b, size_t len, cm_result_input *in) {
	memset(in, 0, sizeof *in);
	reader r = {b, b + len, false};
	uint32_t num;
	int t;
	size_t n_pairs = 0;
	while (next(&r, &num, &t)) {
		switch (num) {
		case 1: {
			reader s = sub(&r, t);
			cm_result *res = &in->result;
			uint32_t rn;
			int rt;
			while (next(&s, &rn, &rt)) {
				switch (rn) {
				case 1: res->exit_code = (int32_t)uint_(&s, rt); break;
				case 2: res->stdout_text = bytes(&s, rt); break;
				case 3: res->stderr_text = bytes(&s, rt); break;
				case 4: res->timed_out = uint_(&s, rt) != 0; break;
				case 5: res->truncated = uint_(&s, rt) != 0; break;
				case 6: res->oom_killed = uint_(&s, rt) != 0; break;
				case 7: res->duration_ns = duration(&s, rt); break;
				case 8: res->agent = bytes(&s, rt); break;
				case 9: res->session_id = bytes(&s, rt); break;
				default: skip(&s, rt);
				}
			}
			r.err |= s.err;
			break;
		}
		case 2: in->tenant = bytes(&r, t); break;
		case 3: in->door = bytes(&r, t); break;
		case 4: in->request_id = bytes(&r, t); break;
		case 5: in->language = bytes(&r, t); break;
		case 6: map_entry(&r, t, &n_pairs); break;
		default: skip(&r, t);
		}
	}
	in->annotations = pairs;
	in->n_annotations = n_pairs;
	return !r.err;
}

/* --- encoding ----------------------------------------------------------- */

typedef struct {
	uint8_t *p;
	size_t len, cap;
} writer;

static void put(writer *w, const void *b, size_t n) {
	if (n == 0)
		return;
	w->p = grow(w->p, &w->cap, w->len + n, 1);
	memcpy(w->p + w->len, b, n);
	w->len += n;
}

static void put_varint(writer *w, uint64_t v) {
	uint8_t b[10];
	size_t n = 0;
	while (v >= 0x80) {
		b[n++] = (uint8_t)v | 0x80;
		v >>= 7;
	}
	b[n++] = (uint8_t)v;
	put(w, b, n);
}

static void put_tag(writer *w, uint32_t num, int typ) { put_varint(w, (uint64_t)num << 3 | (uint64_t)typ); }

static void put_uint(writer *w, uint32_t num, uint64_t v) {
	if (v != 0) {
		put_tag(w, num, VARINT);
		put_varint(w, v);
	}
}

static void put_bytes(writer *w, uint32_t num, cm_str s) {
	put_tag(w, num, BYTES);
	put_varint(w, s.len);
	put(w, s.ptr, s.len);
}

static void put_str(writer *w, uint32_t num, cm_str s) {
	if (s.len > 0)
		put_bytes(w, num, s);
}

/* put_message appends m as field num and empties m. */
static void put_message(writer *w, uint32_t num, writer *m) {
	cm_str s = {(const char *)m->p, m->len};
	put_bytes(w, num, s);
	free(m->p);
	memset(m, 0, sizeof *m);
}

static void put_duration(writer *w, uint32_t num, int64_t ns) {
	if (ns == 0)
		return;
	writer m = {0};
	put_uint(&m, 1, (uint64_t)(ns / 1000000000));
	put_uint(&m, 2, (uint64_t)(int64_t)(int32_t)(ns % 1000000000));
	put_message(w, num, &m);
}

static void put_pairs(writer *w, uint32_t num, const cm_pair *kv, size_t n) {
	for (size_t i = 0; i < n; i++) {
		writer m = {0};
		put_str(&m, 1, kv[i].key);
		put_str(&m, 2, kv[i].value);
		put_message(w, num, &m);
	}
}

static void put_egress(writer *w, const cm_egress *e) {
	for (size_t i = 0; i < e->n_allow; i++) {
		const cm_egress_rule *rule = &e->allow[i];
		writer m = {0};
		put_str(&m, 1, rule->host);
		if (rule->n_ports > 0) {
			writer ports = {0};
			for (size_t j = 0; j < rule->n_ports; j++)
				put_varint(&ports, rule->ports[j]);
			put_message(&m, 2, &ports);
		}
		put_message(w, 1, &m);
	}
	if (e->connections || e->bytes || e->connection_time_ns) {
		writer m = {0};
		put_uint(&m, 1, e->connections);
		put_uint(&m, 2, e->bytes);
		put_duration(&m, 3, e->connection_time_ns);
		put_message(w, 2, &m);
	}
}

static void encode_request_decision(writer *w, const cm_request_decision *d) {
	put_uint(w, 1, (uint64_t)(int64_t)d->verdict);
	put_str(w, 2, d->reason);
	if (d->has_code || d->has_language || d->has_stdin) {
		writer m = {0};
		if (d->has_code)
			put_bytes(&m, 1, d->code);
		if (d->has_language)
			put_bytes(&m, 2, d->language);
		if (d->has_stdin)
			put_bytes(&m, 3, d->stdin_bytes);
		put_message(w, 3, &m);
	}
	if (d->timeout_ns || d->memory_bytes || d->output_bytes) {
		writer m = {0};
		put_duration(&m, 1, d->timeout_ns);
		put_uint(&m, 2, d->memory_bytes);
		put_uint(&m, 3, d->output_bytes);
		put_message(w, 4, &m);
	}
	put_pairs(w, 5, d->route, d->n_route);
	put_uint(w, 6, (uint64_t)(int64_t)d->route_priority);
	put_pairs(w, 7, d->annotations, d->n_annotations);
	if (d->has_egress) {
		writer m = {0};
		put_egress(&m, &d->egress);
		put_message(w, 8, &m);
	}
}

static void encode_result_decision(writer *w, const cm_result_decision *d) {
	put_uint(w, 1, (uint64_t)(int64_t)d->verdict);
	put_str(w, 2, d->reason);
	for (size_t i = 0; i < d->n_redactions; i++) {
		const cm_redaction *x = &d->redactions[i];
		writer m = {0};
		put_uint(&m, 1, (uint64_t)(int64_t)x->stream);
		put_uint(&m, 2, x->start);
		put_uint(&m, 3, x->end);
		put_str(&m, 4, x->replacement);
		put_message(w, 3, &m);
	}
	if (d->has_stdout)
		put_bytes(w, 4, d->stdout_text);
	if (d->has_stderr)
		put_bytes(w, 5, d->stderr_text);
	put_pairs(w, 6, d->annotations, d->n_annotations);
}

/* --- decisions ---------------------------------------------------------- */

cm_request_decision cm_allow(void) {
	cm_request_decision d;
	memset(&d, 0, sizeof d);
	d.verdict = CM_ALLOW;
	return d;
}

cm_request_decision cm_deny_str(cm_str reason) {
	cm_request_decision d = cm_allow();
	d.verdict = CM_DENY;
	d.reason = reason;
	return d;
}

cm_request_decision cm_deny(const char *reason) { return cm_deny_str(cm_cstr(reason)); }

void cm_rewrite_code(cm_request_decision *d, cm_str code) { d->has_code = true, d->code = code; }
void cm_rewrite_language(cm_request_decision *d, cm_str language) { d->has_language = true, d->language = language; }
void cm_rewrite_stdin(cm_request_decision *d, cm_str stdin_bytes) { d->has_stdin = true, d->stdin_bytes = stdin_bytes; }
void cm_limit_timeout(cm_request_decision *d, int64_t timeout_ns) { d->timeout_ns = timeout_ns; }
void cm_limit_memory(cm_request_decision *d, uint64_t bytes) { d->memory_bytes = bytes; }
void cm_limit_output(cm_request_decision *d, uint64_t bytes) { d->output_bytes = bytes; }

bool cm_route(cm_request_decision *d, const char *key, const char *value) {
	if (d->n_route >= CM_MAX_ROUTE)
		return false;
	d->route[d->n_route].key = cm_cstr(key);
	d->route[d->n_route++].value = cm_cstr(value);
	return true;
}

void cm_narrow_egress(cm_request_decision *d, cm_egress egress) {
	d->has_egress = true;
	d->egress = egress;
}

static bool annotate(cm_pair *kv, size_t *n, cm_str key, cm_str value) {
	for (size_t i = 0; i < *n; i++) {
		if (cm_equal(kv[i].key, key)) {
			kv[i].value = value;
			return true;
		}
	}
	if (*n >= CM_MAX_ANNOTATIONS)
		return false;
	kv[*n].key = key;
	kv[(*n)++].value = value;
	return true;
}

bool cm_annotate(cm_request_decision *d, cm_str key, cm_str value) {
	return annotate(d->annotations, &d->n_annotations, key, value);
}

cm_result_decision cm_allow_result(void) {
	cm_result_decision d;
	memset(&d, 0, sizeof d);
	d.verdict = CM_ALLOW;
	return d;
}

cm_result_decision cm_deny_result(const char *reason) {
	cm_result_decision d = cm_allow_result();
	d.verdict = CM_DENY;
	d.reason = cm_cstr(reason);
	return d;
}

void cm_redact(cm_result_decision *d, int stream, size_t start, size_t end, const char *replacement) {
	d->redactions = grow(d->redactions, &d->cap_redactions, d->n_redactions + 1, sizeof *d->redactions);
	cm_redaction x = {stream, (uint32_t)start, (uint32_t)end, cm_cstr(replacement)};
	d->redactions[d->n_redactions++] = x;
}

void cm_replace_stdout(cm_result_decision *d, cm_str text) { d->has_stdout = true, d->stdout_text = text; }
void cm_replace_stderr(cm_result_decision *d, cm_str text) { d->has_stderr = true, d->stderr_text = text; }

bool cm_annotate_result(cm_result_decision *d, cm_str key, cm_str value) {
	return annotate(d->annotations, &d->n_annotations, key, value);
}

/* --- the calls ---------------------------------------------------------- */

static void set_output(writer *w) {
	free(output);
	output = w->p;
	output_len = w->len;
	output_cap = w->cap;
}

int64_t cm__init(int32_t len, cm_init_handler f) {
	cm_str config = {(const char *)input, (size_t)(uint32_t)len};
	const char *err = f(config);
	writer w = {0};
	if (err) {
		put(&w, err, strlen(err));
		if (w.len == 0)
			put(&w, "init failed", 11);
	}
	set_output(&w);
	return answer();
}

int64_t cm__request(int32_t len, cm_request_handler f) {
	cm_request_input in;
	if (!decode_request_input(input, (uint32_t)len, &in))
		fail("decode request input: malformed protobuf");
	cm_request_decision d = f(&in);
	writer w = {0};
	encode_request_decision(&w, &d);
	set_output(&w);
	return answer();
}

int64_t cm__result(int32_t len, cm_result_handler f) {
	cm_result_input in;
	if (!decode_result_input(input, (uint32_t)len, &in))
		fail("decode result input: malformed protobuf");
	cm_result_decision d = f(&in);
	writer w = {0};
	encode_result_decision(&w, &d);
	free(d.redactions);
	set_output(&w);
	return answer();
}
