#!/usr/bin/env bash
# Builds the example policies into OUT (default bin/policies) and writes
# OUT/policies.json, a policy configuration that loads them with their
# digests. Usage: bash policies/build.sh [OUT]. Exits 3 when the Rust or C
# toolchain is missing (see policies/setup.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-bin/policies}
mkdir -p "$out"
for p in languages patterns limits routes prelude redact egress; do
	GOOS=wasip1 GOARCH=wasm CGO_ENABLED=0 go build -trimpath -buildmode=c-shared -o "$out/$p.wasm" "./policies/examples/$p"
done
wat2wasm policies/examples/tenantblock/tenantblock.wat -o "$out/tenantblock.wasm"
# The Rust SDK's examples: NAME-rust.wasm.
bash policies/sdk-rust/build.sh "$out"
# The C SDK's examples: NAME-c.wasm.
bash policies/sdk-c/build.sh "$out"
sum() { sha256sum "$out/$1.wasm" | cut -d' ' -f1; }
cat > "$out/policies.json" <<JSON
{
  "fuel": 10000000,
  "deadline": "10s",
  "labels": {"pool": []},
  "policies": [
    {"name": "tenantblock", "path": "tenantblock.wasm", "sha256": "$(sum tenantblock)",
     "phase": "request", "order": 5, "config": "suspended-tenant"},
    {"name": "languages", "path": "languages.wasm", "sha256": "$(sum languages)",
     "phase": "request", "order": 10, "config": "*: python, bash, sh, javascript"},
    {"name": "patterns", "path": "patterns.wasm", "sha256": "$(sum patterns)",
     "phase": "request", "order": 20},
    {"name": "limits", "path": "limits.wasm", "sha256": "$(sum limits)",
     "phase": "request", "order": 30, "config": "*: 120s"},
    {"name": "redact", "path": "redact.wasm", "sha256": "$(sum redact)",
     "phase": "result", "order": 10}
  ]
}
JSON
echo "built $(ls "$out"/*.wasm | wc -l) policies and $out/policies.json"
