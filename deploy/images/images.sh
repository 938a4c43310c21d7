#!/usr/bin/env bash
# Builds the OCI images of the edge and the control plane with the local
# Docker Engine (`make images`): IMAGE_PREFIX-edge:TAG and
# IMAGE_PREFIX-controlplane:TAG, each the static binary alone, from scratch
# (see Dockerfile). Nothing is pulled. The agent is not an image: it drives
# the host's dockerd and runsc, and is installed on the host (setup.sh).
set -euo pipefail
cd "$(dirname "$0")/../.."

version=${VERSION:-$(git describe --tags --always --dirty 2>/dev/null || echo devel)}
tag=${IMAGE_TAG:-$version}
prefix=${IMAGE_PREFIX:-codemode}
module=$(go list -m)

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
for svc in edge controlplane; do
	mkdir -p "$work/$svc"
	CGO_ENABLED=0 go build -trimpath -ldflags "-s -w -X $module/internal/version.version=$version" \
		-o "$work/$svc/$svc" "./$svc/cmd/$svc"
	chmod 0555 "$work/$svc/$svc"
	sed "s/@SERVICE@/$svc/g" deploy/images/Dockerfile >"$work/$svc/Dockerfile"
	# The classic builder: it needs nothing but the engine (FROM scratch).
	if ! out=$(DOCKER_BUILDKIT=0 docker build -q --pull=false --build-arg VERSION="$version" \
		-t "$prefix-$svc:$tag" "$work/$svc" 2>&1); then
		echo "$out" >&2
		exit 1
	fi
	echo "images: $prefix-$svc:$tag"
done
