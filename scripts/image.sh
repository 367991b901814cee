#!/usr/bin/env bash
# Builds sigil's container image without a daemon (buildah, from Debian's
# packages), as the Dockerfile describes it: FROM scratch with the stripped
# binary (`sigil`, and `sigil-krm` a symlink to it), exactly the shared
# libraries `ldd` names for it (glibc, libm, libgcc_s and the loader: aws-lc
# is linked statically), the host's CA certificates, /etc/passwd and
# /etc/group with the distroless `nonroot` user (uid/gid 65532), a
# world-writable /tmp; user 65532, entrypoint `sigil`, command `serve`,
# ports 8443 (webhook) and 8080 (admin); and `sigil-static`, the same
# program linked statically against musl (scripts/dist.sh --static), which
# the node DaemonSet copies onto hosts as containerd's verifier: it runs on
# any Linux host of its architecture, whatever its libc. The Dockerfile stays for users with
# Docker: it builds the same binary (scripts/dist.sh) onto distroless
# cc-debian12:nonroot, which holds the same libraries, certificates and user.
#
#   scripts/image.sh                          # builds target/dist/sigil first
#   scripts/image.sh --binary PATH --static-binary PATH --tag REF
#                                             # already built binaries
#
# The image lands in local container storage as REF (default
# localhost/sigil:dev); the last line printed is REF. Push it with
#   buildah push [--tls-verify=false] REF docker://HOST/sigil:TAG
set -euo pipefail
cd "$(dirname "$0")/.."

binary= static= tag=localhost/sigil:dev
while [ $# -gt 0 ]; do
  case "$1" in
    --binary) binary=${2:?--binary needs a path}; shift 2 ;;
    --binary=*) binary=${1#*=}; shift ;;
    --static-binary) static=${2:?--static-binary needs a path}; shift 2 ;;
    --static-binary=*) static=${1#*=}; shift ;;
    --tag) tag=${2:?--tag needs an image reference}; shift 2 ;;
    --tag=*) tag=${1#*=}; shift ;;
    -h|--help) sed -n '2,23p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "image.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done
for tool in buildah ldd readelf; do
  command -v "$tool" >/dev/null || { echo "image.sh: $tool is not installed (Debian: apt-get install buildah)" >&2; exit 1; }
done
if [ -z "$binary" ]; then
  scripts/dist.sh >&2
  binary=$(realpath -m "${CARGO_TARGET_DIR:-target}")/dist/sigil
fi
[ -x "$binary" ] || { echo "image.sh: $binary is not an executable" >&2; exit 1; }
if [ -z "$static" ]; then
  scripts/dist.sh --static >&2
  static=$(realpath -m "${CARGO_TARGET_DIR:-target}")/dist/sigil-static
fi
[ -x "$static" ] || { echo "image.sh: $static is not an executable" >&2; exit 1; }
if readelf -l "$static" | grep -q 'program interpreter'; then
  echo "image.sh: $static is dynamically linked; build it with scripts/dist.sh --static" >&2; exit 1
fi
certs=/etc/ssl/certs/ca-certificates.crt
[ -f "$certs" ] || { echo "image.sh: $certs is missing (Debian: apt-get install ca-certificates)" >&2; exit 1; }

root=$(mktemp -d)
ctr=
cleanup() {
  [ -z "$ctr" ] || buildah rm "$ctr" >/dev/null 2>&1 || true
  rm -rf "$root"
}
trap cleanup EXIT

mkdir -p "$root/usr/local/bin" "$root/etc/ssl/certs" "$root/tmp" "$root/home/nonroot"
# Stripped whatever the build kept (the dist profile already strips).
objcopy --strip-all "$binary" "$root/usr/local/bin/sigil" 2>/dev/null \
  || cp "$binary" "$root/usr/local/bin/sigil"
chmod 0755 "$root/usr/local/bin/sigil"
ln -s sigil "$root/usr/local/bin/sigil-krm"
objcopy --strip-all "$static" "$root/usr/local/bin/sigil-static" 2>/dev/null \
  || cp "$static" "$root/usr/local/bin/sigil-static"
chmod 0755 "$root/usr/local/bin/sigil-static"
# Exactly what the dynamic linker will load, at the paths it will look.
ldd "$binary" | awk '/=> \//{print $3} /^\t\//{print $1}' | while read -r lib; do
  mkdir -p "$root$(dirname "$lib")"
  cp -L "$lib" "$root$lib"
done
cp -L "$certs" "$root/etc/ssl/certs/ca-certificates.crt"
cat > "$root/etc/passwd" <<'EOF'
root:x:0:0:root:/root:/sbin/nologin
nobody:x:65534:65534:nobody:/nonexistent:/sbin/nologin
nonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin
EOF
cat > "$root/etc/group" <<'EOF'
root:x:0:
nobody:x:65534:
nonroot:x:65532:
EOF
chmod 1777 "$root/tmp"

ctr=$(buildah from --quiet scratch)
buildah copy --quiet "$ctr" "$root" / >/dev/null
buildah copy --quiet --chown 65532:65532 "$ctr" "$root/home/nonroot" /home/nonroot >/dev/null
buildah config \
  --user 65532:65532 \
  --workingdir /home/nonroot \
  --env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
  --entrypoint '["/usr/local/bin/sigil"]' \
  --cmd serve \
  --port 8443 --port 8080 \
  --label org.opencontainers.image.title=sigil \
  "$ctr"
buildah commit --quiet --rm "$ctr" "$tag" >/dev/null
ctr=
echo "$tag"
