/*
 * tenantblock is a request-phase policy: it denies every request from the
 * tenant named in its configuration (the configuration bytes are the tenant
 * name, at most 256 bytes) and allows all others. The C port of
 * policies/examples/tenantblock/tenantblock.wat.
 */
#include <string.h>

#include "codemode_policy.h"

static char blocked[256];
static size_t blocked_len;

static const char *init(cm_str config) {
	if (config.len > sizeof blocked)
		return "config too long";
	memcpy(blocked, config.ptr, config.len);
	blocked_len = config.len;
	return NULL;
}

static cm_request_decision request(const cm_request_input *in) {
	cm_str b = {blocked, blocked_len};
	if (in->tenant.len > 0 && cm_equal(in->tenant, b))
		return cm_deny("tenant is suspended by the tenant policy");
	return cm_allow();
}

CODEMODE_INIT(init)
CODEMODE_REQUEST(request)
