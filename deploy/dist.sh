#!/usr/bin/env bash
# Builds the release archives of codemode (`make dist`): for each platform in
# DIST_PLATFORMS (default linux/amd64), DIST/codemode-VERSION-OS-ARCH.tar.gz
# holding the four static binaries (edge, controlplane, agent, runner) and
# the README, and DIST/SHA256SUMS. Reproducible: the same commit, version and
# Go toolchain give the same bytes (-trimpath, no build id, the archive's
# times set to the commit's, its owners to 0, gzip without a time stamp).
#
# VERSION defaults to `git describe --tags --always --dirty`; every binary
# answers --version with it.
set -euo pipefail
cd "$(dirname "$0")/.."

version=${VERSION:-$(git describe --tags --always --dirty 2>/dev/null || echo devel)}
out=${DIST:-dist}
platforms=${DIST_PLATFORMS:-linux/amd64}
epoch=${SOURCE_DATE_EPOCH:-$(git log -1 --format=%ct 2>/dev/null || echo 0)}
module=$(go list -m)

rm -rf "$out"
mkdir -p "$out"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
for p in $platforms; do
	os=${p%/*} arch=${p#*/}
	name=codemode-$version-$os-$arch
	mkdir -p "$work/$name"
	CGO_ENABLED=0 GOOS=$os GOARCH=$arch go build -trimpath -buildvcs=true \
		-ldflags "-s -w -buildid= -X $module/internal/version.version=$version" \
		-o "$work/$name/" ./edge/cmd/edge ./controlplane/cmd/controlplane ./agent/cmd/agent ./agent/cmd/runner
	cp README.md "$work/$name/"
	touch -d "@$epoch" "$work/$name" "$work/$name"/*
	tar --sort=name --mtime="@$epoch" --owner=0 --group=0 --numeric-owner --mode=go-w \
		-C "$work" -cf - "$name" | gzip -n >"$out/$name.tar.gz"
	echo "dist: $out/$name.tar.gz"
done
(cd "$out" && sha256sum ./*.tar.gz | sed 's# \./# #' >SHA256SUMS)
echo "dist: $out/SHA256SUMS"
