#!/usr/bin/env bash
# Builds the C SDK's examples into OUT/NAME-c.wasm with clang for
# wasm32-wasi as reactors: Debian's clang-14 and lld-14 with wasi-libc and
# libclang-rt-14-dev-wasm32 (`make setup` installs them), or $CC.
# Usage: bash policies/sdk-c/build.sh OUT
# Exits 3 when no such clang is found.
set -euo pipefail
out=$(mkdir -p "${1:?usage: build.sh OUT}" && cd "$1" && pwd)
cd "$(dirname "$0")"

# works CC: CC compiles and links a wasm32-wasi reactor.
works() {
	command -v "$1" >/dev/null || return 1
	echo 'int x;' | "$1" --target=wasm32-wasi -mexec-model=reactor -x c - -o /dev/null 2>/dev/null
}
cc=
for c in ${CC:-} clang clang-14 clang-15 clang-16 clang-19; do
	if works "$c"; then
		cc=$c
		break
	fi
done
if [ -z "$cc" ]; then
	echo "sdk-c: no clang that links for wasm32-wasi (Debian: apt-get install clang-14 lld-14 wasi-libc libclang-rt-14-dev-wasm32, as make setup does)" >&2
	exit 3
fi
# With CODEMODE_SDK_TESTDATA=1, the test modules of testdata/ too.
srcs=(examples/*.c)
[ "${CODEMODE_SDK_TESTDATA:-}" != 1 ] || srcs+=(testdata/*.c)
for src in "${srcs[@]}"; do
	e=$(basename "$src" .c)
	"$cc" --target=wasm32-wasi -mexec-model=reactor -O2 -Wall -Wextra -Werror -I. \
		-Wl,--strip-all codemode_policy.c "$src" -o "$out/$e-c.wasm"
done
