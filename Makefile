# codemode. `make up` runs the whole stack; `make test` runs every test.
# Both prepare the host first (idempotent): see agent/host/setup.sh.

SHELL := /bin/bash
GO    ?= go
BUF   ?= npx --yes @bufbuild/buf@1.75.0
BIN   := bin

.PHONY: all setup build generate checkgenerate lint breaking test up clean

all: build

setup:
	bash agent/host/setup.sh

build:
	mkdir -p $(BIN)
	CGO_ENABLED=0 $(GO) build -o $(BIN)/ ./edge/cmd/edge ./controlplane/cmd/controlplane ./agent/cmd/agent

generate:
	$(BUF) generate

# Fails when gen/ is not what the protos generate.
checkgenerate: generate
	@if [ -n "$$(git status --porcelain -- gen proto)" ]; then \
		echo "gen/ is stale: run 'make generate' and commit the result"; git status --porcelain -- gen proto; exit 1; fi

lint:
	$(BUF) lint
	$(GO) vet ./...

breaking:
	@if git rev-parse -q --verify main >/dev/null; then $(BUF) breaking --against '.git#branch=main'; fi

test: setup lint breaking checkgenerate
	$(GO) test -race -count=1 ./...

clean:
	rm -rf $(BIN)
