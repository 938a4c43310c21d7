#!/usr/bin/env bash
# Installs what the playground's build and the Node tests in edge/e2e need:
# edge/web/node_modules (npm ci, skipped while package-lock.json is unchanged)
# and Debian's Chromium at /usr/bin/chromium (skipped when present).
# Idempotent; run from anywhere, as root for the apt step.
set -euo pipefail
cd "$(dirname "$0")"

stamp=node_modules/.codemode-lock-sha256
sum=$(sha256sum package-lock.json | cut -d' ' -f1)
if [[ "$(cat "$stamp" 2>/dev/null || true)" != "$sum" ]]; then
	echo "edge/web: npm ci"
	npm ci --no-audit --no-fund --loglevel=error
	echo "$sum" > "$stamp"
fi

if [[ ! -x /usr/bin/chromium ]]; then
	echo "edge/web: apt-get install chromium"
	export DEBIAN_FRONTEND=noninteractive
	apt-get update -q
	apt-get install -y -q chromium
fi
