#!/usr/bin/env bash
# Builds the Rust SDK and its examples into OUT/NAME-rust.wasm with rustc
# alone (no cargo, no network): Debian's rustc with libstd-rust-dev-wasm32
# (`make setup` installs them), or $RUSTC, or any rustc on PATH that has the
# standard library of wasm32-wasi (rustup: wasm32-wasip1).
# Usage: bash policies/sdk-rust/build.sh OUT
# Exits 3 when no such rustc is found.
set -euo pipefail
out=$(mkdir -p "${1:?usage: build.sh OUT}" && cd "$1" && pwd)
cd "$(dirname "$0")"

# target RUSTC: the WASI target whose standard library RUSTC has.
target() {
	local sysroot
	sysroot=$("$1" --print sysroot 2>/dev/null) || return 1
	for t in wasm32-wasi wasm32-wasip1; do
		if compgen -G "$sysroot/lib/rustlib/$t/lib/libstd-*.rlib" >/dev/null; then
			echo "$t"
			return 0
		fi
	done
	return 1
}
rustc= tgt=
for c in ${RUSTC:-} /usr/bin/rustc rustc; do
	if command -v "$c" >/dev/null && tgt=$(target "$c"); then
		rustc=$c
		break
	fi
done
if [ -z "$rustc" ]; then
	echo "sdk-rust: no rustc with the standard library of wasm32-wasi (Debian: apt-get install rustc libstd-rust-dev-wasm32, as make setup does)" >&2
	exit 3
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
flags=(--edition 2021 --target "$tgt" -C opt-level=s -C panic=abort)
"$rustc" "${flags[@]}" --crate-type rlib --crate-name codemode_policy src/lib.rs --out-dir "$tmp"
# With CODEMODE_SDK_TESTDATA=1, the test modules of testdata/ too.
srcs=(examples/*.rs)
[ "${CODEMODE_SDK_TESTDATA:-}" != 1 ] || srcs+=(testdata/*.rs)
for src in "${srcs[@]}"; do
	e=$(basename "$src" .rs)
	"$rustc" "${flags[@]}" --crate-type cdylib -C strip=symbols \
		--extern codemode_policy="$tmp/libcodemode_policy.rlib" "$src" -o "$out/$e-rust.wasm"
done
