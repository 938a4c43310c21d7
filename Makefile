# codemode. `make up` runs the whole stack; `make test` runs every test.
# Both prepare the host first, idempotently: see agent/host/setup.sh.

SHELL := /bin/bash
GO    ?= go
BUF   ?= npx --yes @bufbuild/buf@1.75.0
BIN   := bin
export BUF

# Ports of `make up`; the seed's variables work too.
EDGE_ADDR    ?= :8000
WORKER_PORT  ?= :30031
CONTROLPLANE_ADDR ?= :8080

.PHONY: all setup build generate web checkgenerate lint breaking test up clean policies bench-agent bench-policy

all: build

## setup: prepare this host (Docker Engine, runsc, sandbox image); idempotent
setup:
	bash agent/host/setup.sh
	bash edge/web/setup.sh

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

## up: set up, build, and run agent, control plane and edge on this host; Ctrl-C stops all three
up: setup build
	@set -m; pids=(); \
	stop() { trap - INT TERM; echo; echo "stopping..."; kill -TERM "$${pids[@]}" 2>/dev/null; wait "$${pids[@]}" 2>/dev/null; echo "stopped"; exit 0; }; \
	trap stop INT TERM; \
	WORKER_PORT=$(WORKER_PORT) $(BIN)/agent & pids+=($$!); \
	REMOTE_HOSTS=127.0.0.1:$(lastword $(subst :, ,$(WORKER_PORT))) CONTROLPLANE_ADDR=$(CONTROLPLANE_ADDR) $(BIN)/controlplane & pids+=($$!); \
	CODE_EXECUTION_HOST=http://127.0.0.1:$(lastword $(subst :, ,$(CONTROLPLANE_ADDR))) EDGE_ADDR=$(EDGE_ADDR) $(BIN)/edge & pids+=($$!); \
	e=$(lastword $(subst :, ,$(EDGE_ADDR))); c=$(lastword $(subst :, ,$(CONTROLPLANE_ADDR))); \
	for i in $$(seq 1 600); do curl -fsS -o /dev/null -X POST -H 'Content-Type: application/json' -d '{}' \
		http://127.0.0.1:$$e/codemode.edge.v1.ExecutionService/ListLanguages 2>/dev/null && break; sleep 0.1; done; \
	echo; \
	echo "codemode is up:"; \
	echo "  web playground     http://127.0.0.1:$$e/"; \
	echo "  MCP                http://127.0.0.1:$$e/mcp  (without code execution: /mcp-no-code-execute)"; \
	echo "  Connect / gRPC / gRPC-Web   127.0.0.1:$$e  codemode.edge.v1.ExecutionService"; \
	echo "  seed POST /run, GET /status http://127.0.0.1:$$c"; \
	echo "  agent              127.0.0.1:$(lastword $(subst :, ,$(WORKER_PORT)))"; \
	echo "Ctrl-C stops all three."; \
	wait "$${pids[@]}"

## policies: build the example Wasm policies and a config loading them into bin/policies
policies:
	bash policies/build.sh $(BIN)/policies

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
