/*
 * redact is a result-phase policy that removes secrets from a run's output
 * before the caller sees it: AWS access key ids (AKIA... and ASIA..., 20
 * characters) and PEM private key blocks ("-----BEGIN ... PRIVATE
 * KEY-----" up to the matching END line, or to the end of the output if it
 * was cut short). Each is replaced by "[REDACTED aws-access-key-id]" or
 * "[REDACTED private-key]". The C port of policies/examples/redact.
 */
#include <string.h>

#include "codemode_policy.h"

static bool is_key_char(char c) { return (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9'); }

static bool has_prefix(const char *s, size_t n, const char *prefix) {
	size_t p = strlen(prefix);
	return n >= p && memcmp(s, prefix, p) == 0;
}

/* find returns the offset of needle in s[0:n], or -1. */
static long find(const char *s, size_t n, const char *needle) {
	size_t k = strlen(needle);
	for (size_t i = 0; i + k <= n; i++)
		if (memcmp(s + i, needle, k) == 0)
			return (long)i;
	return -1;
}

/* access_key_at returns the length of an AWS access key id at s[i:], or 0. */
static size_t access_key_at(const char *s, size_t n, size_t i) {
	const size_t len = 20;
	if (i + len > n || !(has_prefix(s + i, n - i, "AKIA") || has_prefix(s + i, n - i, "ASIA")))
		return 0;
	if (i > 0 && is_key_char(s[i - 1]))
		return 0;
	for (size_t j = i + 4; j < i + len; j++)
		if (!is_key_char(s[j]))
			return 0;
	if (i + len < n && is_key_char(s[i + len]))
		return 0;
	return len;
}

/* private_key_at returns the length of a PEM private key block at s[i:], or 0. */
static size_t private_key_at(const char *s, size_t n, size_t i) {
	const char *rest = s + i;
	size_t left = n - i;
	if (!has_prefix(rest, left, "-----BEGIN "))
		return 0;
	size_t header = left;
	const char *eol = memchr(rest, '\n', left);
	if (eol)
		header = (size_t)(eol - rest);
	while (header > 0 && rest[header - 1] == '\r')
		header--;
	const char *mark = "PRIVATE KEY-----";
	size_t m = strlen(mark);
	if (header < m || memcmp(rest + header - m, mark, m) != 0)
		return 0;
	long end = find(rest, left, "-----END ");
	if (end < 0)
		return left; /* cut short: redact to the end */
	size_t j = (size_t)end + strlen("-----END ");
	long k = find(rest + j, left - j, "-----");
	if (k < 0)
		return left;
	return j + (size_t)k + 5;
}

/* scan adds the redactions of one stream, in order and without overlaps. */
static void scan(cm_result_decision *d, int stream, cm_str text) {
	const char *s = text.ptr;
	size_t n = text.len;
	for (size_t i = 0; i < n;) {
		size_t k = 0;
		if (s[i] == 'A' && (k = access_key_at(s, n, i)) > 0)
			cm_redact(d, stream, i, i + k, "[REDACTED aws-access-key-id]");
		else if (s[i] == '-' && (k = private_key_at(s, n, i)) > 0)
			cm_redact(d, stream, i, i + k, "[REDACTED private-key]");
		i += k > 0 ? k : 1;
	}
}

static cm_result_decision result(const cm_result_input *in) {
	cm_result_decision d = cm_allow_result();
	scan(&d, CM_STDOUT, in->result.stdout_text);
	scan(&d, CM_STDERR, in->result.stderr_text);
	return d;
}

CODEMODE_RESULT(result)
