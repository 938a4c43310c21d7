# codemode. `make up` runs the whole stack; `make test` runs every test.
# Both prepare the host first, idempotently: see agent/host/setup.sh.

SHELL := /bin/bash
GO    ?= go
BUF   ?= npx --yes @bufbuild/buf@1.75.0
BIN   := bin
export BUF

# Addresses of `make up`; mcp-codemode's variables work too. A bare PORT or :PORT
# means 127.0.0.1:PORT: the stack listens on loopback only unless a host is
# named (HOST:PORT is used as given).
EDGE_ADDR    ?= 127.0.0.1:8000
WORKER_PORT  ?= 127.0.0.1:30031
CONTROLPLANE_ADDR ?= 127.0.0.1:8080
# The cluster secret internal calls carry as a bearer token; `make up` creates
# it once (32 random bytes, base64, mode 0600) and gives its path to all three.
CODEMODE_STATE_DIR  ?= /var/lib/codemode
CODEMODE_CLUSTER_SECRET_FILE ?= $(CODEMODE_STATE_DIR)/cluster-secret

# Loopback addresses where `make up` serves each service's Prometheus metrics
# (deploy/prometheus/prometheus.yml scrapes these).
EDGE_METRICS_ADDR         ?= 127.0.0.1:9100
CONTROLPLANE_METRICS_ADDR ?= 127.0.0.1:9101
AGENT_METRICS_ADDR        ?= 127.0.0.1:9102

# What runs of `make up` may reach outside their sandboxes: a JSON file of
# tenants' egress (see docs/code-mode.md); empty: nothing.
EGRESS ?=

# Seconds `make up` waits for the edge to answer before it gives up.
UP_TIMEOUT ?= 120

# Addresses of `make up-cluster`, all on loopback: a Redis, three agents
# (named $(CLUSTER_NAME)-1..3), two control planes sharing the Redis, and
# two edges each listing both control planes.
CLUSTER_NAME          ?= codemode-cluster
CLUSTER_REDIS         ?= 127.0.0.1:6380
CLUSTER_AGENTS        ?= 127.0.0.1:30041 127.0.0.1:30042 127.0.0.1:30043
CLUSTER_CONTROLPLANES ?= 127.0.0.1:8081 127.0.0.1:8082
CLUSTER_EDGES         ?= 127.0.0.1:8001 127.0.0.1:8002
# Loopback addresses where `make up-cluster` serves each service's Prometheus
# metrics: the first to the first of CLUSTER_AGENTS, and so on, one per
# service (deploy/prometheus/prometheus.yml scrapes these).
CLUSTER_AGENTS_METRICS        ?= 127.0.0.1:9111 127.0.0.1:9112 127.0.0.1:9113
CLUSTER_CONTROLPLANES_METRICS ?= 127.0.0.1:9121 127.0.0.1:9122
CLUSTER_EDGES_METRICS         ?= 127.0.0.1:9131 127.0.0.1:9132
# The password of that Redis, made once like the cluster secret: whoever can
# write to the Redis could otherwise change which agents the control planes
# route to. It reaches redis-server on its standard input and the control
# planes in REDIS_URL, never on a command line.
CLUSTER_REDIS_PASSWORD_FILE ?= $(CODEMODE_STATE_DIR)/cluster-redis-password

# $(call listen_addr,ADDR): PORT and :PORT become 127.0.0.1:PORT.
listen_addr = $(if $(findstring :,$(patsubst :%,%,$(1))),$(1),127.0.0.1:$(patsubst :%,%,$(1)))
# $(call dial_addr,ADDR): where to reach a listener on ADDR from this host.
dial_addr = $(if $(filter 0.0.0.0:% [::]:%,$(1)),127.0.0.1:$(lastword $(subst :, ,$(1))),$(1))
up_agent        := $(call listen_addr,$(WORKER_PORT))
up_controlplane := $(call listen_addr,$(CONTROLPLANE_ADDR))
up_edge         := $(call listen_addr,$(EDGE_ADDR))
comma := ,
space := $(subst ,, )
# Ports no egress rule of the cluster's sandboxes opens: the control planes',
# the edges' and Redis's.
cluster_deny := $(subst $(space),$(comma),$(strip $(foreach a,$(CLUSTER_CONTROLPLANES) $(CLUSTER_EDGES) $(CLUSTER_REDIS),:$(lastword $(subst :, ,$(a))))))

# `make dist`: release archives of every binary, in DIST, for DIST_PLATFORMS
# (GOOS/GOARCH, space-separated), stamped with VERSION (default: git describe).
DIST           ?= dist
DIST_PLATFORMS ?= linux/amd64
VERSION        ?=

# Where `make certs` keeps a development CA and the edge's certificate.
CERTS_DIR ?= $(CODEMODE_STATE_DIR)/certs

.PHONY: all setup build generate web checkgenerate lint breaking test up up-cluster cluster-secret cluster-redis-password certs dist images clean policies bench bench-agent bench-policy bench-tls

all: build

## setup: prepare this host (Docker Engine, runsc, sandbox image, the policy toolchains); idempotent
setup:
	bash agent/host/setup.sh
	bash edge/web/setup.sh
	bash policies/setup.sh

## build: build the three services and the in-sandbox runner into bin/
build:
	mkdir -p $(BIN)
	CGO_ENABLED=0 $(GO) build -trimpath -o $(BIN)/ ./edge/cmd/edge ./controlplane/cmd/controlplane ./agent/cmd/agent ./agent/cmd/runner

## generate: regenerate gen/ from proto/
generate:
	$(BUF) generate

## web: rebuild the playground (edge/web/dist, edge/web/src/gen) from its sources and the protos
web:
	npm run --prefix edge/web build

## checkgenerate: fail when generated code is not what its sources generate
checkgenerate: generate web
	@if [ -n "$$(git status --porcelain -- gen proto edge/web/dist edge/web/src/gen)" ]; then \
		echo "generated code is stale: run 'make generate web' and commit the result"; \
		git status --porcelain -- gen proto edge/web/dist edge/web/src/gen; exit 1; fi

## lint: buf lint, gofmt and go vet
lint:
	$(BUF) lint
	@fmt=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$fmt" ]; then echo "not gofmt'ed: $$fmt"; exit 1; fi
	$(GO) vet ./...

## breaking: buf breaking against main
breaking:
	@if git rev-parse -q --verify main >/dev/null; then $(BUF) breaking --against '.git#branch=main'; fi

## test: set up, lint, check generated code, and run every test with -race
test: setup lint breaking checkgenerate
	$(GO) test -race -count=1 -timeout 25m ./...

# $(call secret_file,FILE,FILTER): create FILE once, 32 random bytes in base64
# passed through FILTER, written to a file of mode 0600 from the start
# (mktemp) and linked into place, so that concurrent runs keep the first.
define secret_file
@f='$(1)'; mkdir -p "$$(dirname "$$f")"; \
if [ ! -s "$$f" ]; then \
	tmp=$$(mktemp "$$f.XXXXXX") && head -c 32 /dev/urandom | base64 | $(2) >"$$tmp" && \
	{ ln "$$tmp" "$$f" 2>/dev/null || [ -s "$$f" ] || mv -f "$$tmp" "$$f"; }; rm -f "$$tmp"; \
fi; \
chmod 600 "$$f"
endef

# cluster-secret: create the cluster secret file once (32 random bytes, base64, mode 0600)
cluster-secret:
	$(call secret_file,$(CODEMODE_CLUSTER_SECRET_FILE),cat)

# cluster-redis-password: create the password of up-cluster's Redis once (32
# random bytes, base64 with the URL-safe alphabet and no padding, so that it
# goes into a redis:// URL as it is; mode 0600)
cluster-redis-password:
	$(call secret_file,$(CLUSTER_REDIS_PASSWORD_FILE),tr '+/' '-_' | tr -d '=')

## dist: reproducible release archives of edge, controlplane, agent and runner, with SHA256SUMS, in $(DIST)
dist:
	VERSION='$(VERSION)' DIST='$(DIST)' DIST_PLATFORMS='$(DIST_PLATFORMS)' bash deploy/dist.sh

## images: OCI images of the edge and the control plane (from scratch, non-root, with a health check) in the local Docker Engine; IMAGE_TAG, IMAGE_PREFIX
images: setup
	VERSION='$(VERSION)' bash deploy/images/images.sh

## certs: a development CA (made once) and a certificate for the edge on localhost, in $(CERTS_DIR); see docs/deploying.md
certs:
	$(GO) run ./internal/tlsconfig/devcerts -dir $(CERTS_DIR) -cert edge=localhost,127.0.0.1,::1

## up: set up, build, and run agent, control plane and edge on this host; Ctrl-C stops all three
up: setup build cluster-secret
	@for a in $(call dial_addr,$(up_agent)) $(call dial_addr,$(up_controlplane)) $(call dial_addr,$(up_edge)) $(EDGE_METRICS_ADDR) $(CONTROLPLANE_METRICS_ADDR) $(AGENT_METRICS_ADDR); do \
		h=$${a%:*}; h=$${h#[}; h=$${h%]}; \
		if (exec 3<>"/dev/tcp/$$h/$${a##*:}") 2>/dev/null; then \
			echo "$$a is already in use: is codemode (or something else) running there? Stop it first."; exit 1; fi; \
	done
	@set -m; pids=(); names=(); \
	stop() { trap - INT TERM; echo; echo "stopping..."; kill -TERM "$${pids[@]}" 2>/dev/null; wait "$${pids[@]}" 2>/dev/null; echo "stopped"; exit $${1:-0}; }; \
	trap stop INT TERM; \
	export CODEMODE_CLUSTER_SECRET_FILE='$(CODEMODE_CLUSTER_SECRET_FILE)'; \
	EGRESS_DENY=:$(lastword $(subst :, ,$(up_controlplane))),:$(lastword $(subst :, ,$(up_edge))) \
		METRICS_ADDR=$(AGENT_METRICS_ADDR) WORKER_PORT=$(up_agent) $(BIN)/agent & pids+=($$!); names+=(agent); \
	METRICS_ADDR=$(CONTROLPLANE_METRICS_ADDR) REMOTE_HOSTS=$(call dial_addr,$(up_agent)) CONTROLPLANE_ADDR=$(up_controlplane) $(BIN)/controlplane & pids+=($$!); names+=(controlplane); \
	METRICS_ADDR=$(EDGE_METRICS_ADDR) CODEMODE_EGRESS='$(EGRESS)' CODE_EXECUTION_HOST=http://$(call dial_addr,$(up_controlplane)) EDGE_ADDR=$(up_edge) $(BIN)/edge & pids+=($$!); names+=(edge); \
	running() { for p in "$${pids[@]}"; do kill -0 "$$p" 2>/dev/null || return 1; done; }; \
	e=$(call dial_addr,$(up_edge)); up=; deadline=$$((SECONDS + $(UP_TIMEOUT))); \
	while running && [ $$SECONDS -lt $$deadline ]; do \
		curl -fsS -m 5 -o /dev/null -X POST -H 'Content-Type: application/json' -d '{}' \
			http://$$e/codemode.edge.v1.ExecutionService/ListLanguages 2>/dev/null && { up=1; break; }; sleep 0.1; done; \
	if [ -z "$$up" ]; then echo "codemode did not come up within $(UP_TIMEOUT)s (see the logs above)"; stop 1; fi; \
	while running && [ $$SECONDS -lt $$deadline ]; do \
		c=$$(curl -s -m 5 -o /dev/null -w '%{http_code}' http://$$e/status); \
		[ "$$c" != 503 ] && [ "$$c" != 000 ] && break; sleep 0.2; done; \
	echo; \
	echo "codemode is up:"; \
	echo "  web playground     http://$$e/"; \
	echo "  MCP                http://$$e/mcp  (without code execution: /no-code/mcp)"; \
	echo "  Connect / gRPC / gRPC-Web   $$e  codemode.edge.v1.ExecutionService"; \
	echo "  POST /run, GET /status      http://$$e  (internal copies, with the cluster secret: http://$(call dial_addr,$(up_controlplane)))"; \
	echo "  agent              $(call dial_addr,$(up_agent))"; \
	echo "  metrics            http://$(EDGE_METRICS_ADDR)/metrics (edge), http://$(CONTROLPLANE_METRICS_ADDR)/metrics (control plane), http://$(AGENT_METRICS_ADDR)/metrics (agent)"; \
	echo "Claude Code (HTTP, stdio) and the MCP Inspector:"; \
	echo "  claude mcp add --transport http codemode http://$$e/mcp"; \
	echo "  claude mcp add codemode-stdio -- $(abspath $(BIN))/edge mcp-stdio --url http://$$e"; \
	echo "  npx @modelcontextprotocol/inspector@0.15.0 --cli http://$$e/mcp --method tools/list"; \
	echo "  npx @modelcontextprotocol/inspector@0.15.0 --cli http://$$e/no-code/mcp --method tools/list"; \
	echo "Ctrl-C stops all three."; \
	wait -n "$${pids[@]}"; \
	for k in "$${!pids[@]}"; do kill -0 "$${pids[$$k]}" 2>/dev/null || echo "$${names[$$k]} exited"; done; \
	stop 1

## up-cluster: set up, build, and run on loopback a Redis, three agents, two control planes sharing it and two edges, each service restarted if it dies; Ctrl-C stops all
up-cluster: setup build cluster-secret cluster-redis-password
	@$(foreach k,AGENTS CONTROLPLANES EDGES,[ $(words $(CLUSTER_$(k))) = $(words $(CLUSTER_$(k)_METRICS)) ] || \
		{ echo "CLUSTER_$(k)_METRICS has $(words $(CLUSTER_$(k)_METRICS)) addresses for the $(words $(CLUSTER_$(k))) of CLUSTER_$(k): give one per service"; exit 1; };)
	@for a in $(CLUSTER_REDIS) $(CLUSTER_AGENTS) $(CLUSTER_CONTROLPLANES) $(CLUSTER_EDGES) $(CLUSTER_AGENTS_METRICS) $(CLUSTER_CONTROLPLANES_METRICS) $(CLUSTER_EDGES_METRICS); do \
		if (exec 3<>"/dev/tcp/$${a%:*}/$${a##*:}") 2>/dev/null; then \
			echo "$$a is already in use: is codemode (or something else) running there? Stop it first."; exit 1; fi; \
	done
	@set -m; pids=(); names=(); \
	stop() { trap - INT TERM; echo; echo "stopping..."; kill -TERM "$${pids[@]}" 2>/dev/null; wait "$${pids[@]}" 2>/dev/null; echo "stopped"; exit $${1:-0}; }; \
	trap stop INT TERM; \
	supervise() { \
		name=$$1; shift; delay=1; child=; \
		trap '[ -n "$$child" ] && kill -TERM "$$child" 2>/dev/null; wait "$$child" 2>/dev/null; exit 0' TERM; \
		while :; do \
			"$$@" & child=$$!; wait "$$child"; rc=$$?; \
			why="status $$rc"; [ "$$rc" -gt 128 ] && why="killed by signal $$((rc - 128))"; \
			echo "$$name exited ($$why); the others go on serving; restarting it in $${delay}s"; \
			sleep "$$delay" & child=$$!; wait "$$child"; delay=$$((delay * 2)); [ "$$delay" -gt 30 ] && delay=30; \
		done; \
	}; \
	export CODEMODE_CLUSTER_SECRET_FILE='$(CODEMODE_CLUSTER_SECRET_FILE)'; \
	r='$(CLUSTER_REDIS)'; rdir='$(CODEMODE_STATE_DIR)/cluster-redis'; mkdir -p "$$rdir"; \
	rpw=$$(<'$(CLUSTER_REDIS_PASSWORD_FILE)'); \
	printf 'port %s\nbind %s\nsave ""\nappendonly no\ndir "%s"\nloglevel warning\nrequirepass %s\n' "$${r##*:}" "$${r%:*}" "$$rdir" "$$rpw" | \
		redis-server - & pids+=($$!); names+=(redis); \
	cps=; for c in $(CLUSTER_CONTROLPLANES); do cps="$$cps$${cps:+,}http://$$c"; done; \
	rcps=; for c in $(CLUSTER_CONTROLPLANES); do rcps="http://$$c$${rcps:+,}$$rcps"; done; \
	am=($(CLUSTER_AGENTS_METRICS)); cm=($(CLUSTER_CONTROLPLANES_METRICS)); em=($(CLUSTER_EDGES_METRICS)); \
	i=0; for a in $(CLUSTER_AGENTS); do i=$$((i + 1)); \
		EGRESS_DENY='$(cluster_deny)' supervise agent-$$i $(BIN)/agent --addr "$$a" --advertise-addr "$$a" --name "$(CLUSTER_NAME)-$$i" --controlplanes "$$cps" \
			--metrics-addr "$${am[i-1]}" & pids+=($$!); names+=(agent-$$i); \
	done; \
	i=0; for c in $(CLUSTER_CONTROLPLANES); do i=$$((i + 1)); \
		REDIS_URL="redis://:$$rpw@$$r/0" supervise controlplane-$$c $(BIN)/controlplane --addr "$$c" --agents= --metrics-addr "$${cm[i-1]}" & pids+=($$!); names+=(controlplane-$$c); \
	done; \
	i=0; for e in $(CLUSTER_EDGES); do i=$$((i + 1)); order=$$cps; [ $$((i % 2)) = 0 ] && order=$$rcps; \
		CODEMODE_EGRESS='$(EGRESS)' supervise edge-$$e $(BIN)/edge --addr "$$e" --controlplane "$$order" --metrics-addr "$${em[i-1]}" & pids+=($$!); names+=(edge-$$e); \
	done; \
	running() { for p in "$${pids[@]}"; do kill -0 "$$p" 2>/dev/null || return 1; done; }; \
	deadline=$$((SECONDS + $(UP_TIMEOUT))); \
	for e in $(CLUSTER_EDGES); do up=; \
		while running && [ $$SECONDS -lt $$deadline ]; do \
			curl -fsS -m 5 -o /dev/null -X POST -H 'Content-Type: application/json' -d '{}' \
				http://$$e/codemode.edge.v1.ExecutionService/ListLanguages 2>/dev/null && { up=1; break; }; sleep 0.1; done; \
		if [ -z "$$up" ]; then echo "the cluster did not come up within $(UP_TIMEOUT)s (see the logs above)"; stop 1; fi; \
		while running && [ $$SECONDS -lt $$deadline ]; do \
			c=$$(curl -s -m 5 -o /dev/null -w '%{http_code}' http://$$e/status); \
			[ "$$c" != 503 ] && [ "$$c" != 000 ] && break; sleep 0.2; done; \
	done; \
	echo; \
	echo "the codemode cluster is up:"; \
	for e in $(CLUSTER_EDGES); do echo "  edge               http://$$e/  (MCP: /mcp; Connect: codemode.edge.v1.ExecutionService)"; done; \
	echo "  control planes     $(CLUSTER_CONTROLPLANES)  (sharing redis://$$r/0, password in $(CLUSTER_REDIS_PASSWORD_FILE))"; \
	echo "  agents             $(CLUSTER_AGENTS)  (joined by heartbeat)"; \
	i=0; for a in $(CLUSTER_AGENTS); do echo "  metrics            http://$${am[i]}/metrics  (agent-$$((i + 1)), $$a)"; i=$$((i + 1)); done; \
	i=0; for c in $(CLUSTER_CONTROLPLANES); do echo "  metrics            http://$${cm[i]}/metrics  (control plane $$c)"; i=$$((i + 1)); done; \
	i=0; for e in $(CLUSTER_EDGES); do echo "  metrics            http://$${em[i]}/metrics  (edge $$e)"; i=$$((i + 1)); done; \
	echo "A service that dies is reported and started again after a back-off (1 s, doubling to 30 s); Redis is not."; \
	echo "Ctrl-C stops all."; \
	wait -n "$${pids[@]}"; \
	for k in "$${!pids[@]}"; do kill -0 "$${pids[$$k]}" 2>/dev/null || echo "$${names[$$k]} exited"; done; \
	stop 1

## policies: build the example Wasm policies and a config loading them into bin/policies
# Each language needs its toolchain (make setup installs them all, see
# policies/setup.sh): Go, the go command; WebAssembly text, wat2wasm (wabt);
# Rust, Debian's rustc with libstd-rust-dev-wasm32; C, clang-14, lld-14,
# wasi-libc and libclang-rt-14-dev-wasm32.
policies:
	bash policies/build.sh $(BIN)/policies

## bench: the whole stack, every door at concurrency 1, 4 and 16 against the agent and its baselines; writes BENCHMARKS.md and BENCHMARKS.png
bench: setup
	$(GO) run ./edge/cmd/stackbench -markdown BENCHMARKS.md -png BENCHMARKS.png

## bench-tls: print(1) through a stack with TLS on every link against a plain one, in turns, and the TLS handshake's cost (a part of make bench)
bench-tls: setup
	$(GO) run ./edge/cmd/stackbench -only tls

## bench-agent: the agent against docker exec and in-sandbox interpreter starts, one table
bench-agent: setup
	$(GO) run ./agent/cmd/agentbench -n 100

## bench-policy: policy compile, instantiate and call; the example chain; edge overhead
bench-policy: setup
	$(GO) test -run '^$$' -bench 'Instantiate|Call|Evaluate|Chain' -benchtime 3000x ./edge/internal/policy/
	$(GO) test -run '^$$' -bench Compile -benchtime 3x ./edge/internal/policy/
	$(GO) test -run '^$$' -bench PolicyOverhead -benchtime 60x ./edge/e2e/

clean:
	rm -rf $(BIN)
