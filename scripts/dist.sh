#!/usr/bin/env bash
# Builds sigil as the image ships it (the Dockerfile runs this): Cargo
# profile `dist` (fat LTO, one codegen unit, stripped), linked with packed
# relative relocations (DT_RELR: glibc 2.36, the image's Debian 12) and, on
# x86_64 (where Rust links with its own lld), with the functions a start
# runs laid out together (crates/sigil/startup.order; regenerate it with
# scripts/startup-order.sh). Only the final link takes these flags
# (`cargo rustc`), so every crate compiles exactly as `cargo build` would.
#   scripts/dist.sh             # target/dist/sigil
#   scripts/dist.sh --symbols   # the same, not stripped (for profiling)
#   scripts/dist.sh --static    # target/dist/sigil-static: linked statically
#                               # against musl (the node verifier hosts run)
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "${1:-}" = --static ]; then
  # What the node DaemonSet copies onto hosts: containerd runs it with the
  # host's libraries, so it must need none (any Linux of this architecture).
  triple="$(uname -m)-unknown-linux-musl"
  rustup target list --installed | grep -qx "$triple" || rustup target add "$triple"
  command -v musl-gcc >/dev/null \
    || { echo "dist.sh --static: musl-gcc is missing (Debian: apt-get install musl-tools)" >&2; exit 1; }
  cargo build --profile dist --locked -p sigil --bin sigil --target "$triple"
  target=$(realpath -m "${CARGO_TARGET_DIR:-target}")
  mkdir -p "$target/dist"
  cp "$target/$triple/dist/sigil" "$target/dist/sigil-static"
  exit 0
fi
link=(-C link-arg=-Wl,-z,pack-relative-relocs)
if [ "$(uname -m)" = x86_64 ]; then
  # Cargo does not track a file a link argument names: the linker reads a
  # copy named by the order's content, so a changed order file changes the
  # arguments and relinks (else a built target directory kept the old layout).
  target=$(realpath -m "${CARGO_TARGET_DIR:-target}")
  order="$target/startup-$(sha256sum crates/sigil/startup.order | cut -c1-16).order"
  mkdir -p "$target"
  [ -f "$order" ] || cp crates/sigil/startup.order "$order"
  link+=(-C "link-arg=-Wl,--symbol-ordering-file=$order"
         -C link-arg=-Wl,--no-warn-symbol-ordering)
fi
[ "${1:-}" = --symbols ] && link+=(-C strip=none)
exec cargo rustc --profile dist --locked -p sigil --bin sigil -- "${link[@]}"
