#!/usr/bin/env bash
# Regenerates crates/sigil/startup.order: the functions `sigil serve` runs
# from its start until Ready and a few seconds idle, as callgrind records
# them, for the linker to lay out together (scripts/dist.sh). Code the kernel
# maps at start comes in 64 KiB windows around each page that faults; with
# those functions spread over the binary, a start made 13.5 MiB of its code
# resident, laid out together 3 MiB (docs/benchmarks.md).
# Run it after a dependency or toolchain upgrade: names that no longer
# exist are ignored by the linker, so a stale file only lays out less well
# (the load benchmark's idle RSS row shows it), never wrongly.
#   scripts/startup-order.sh    # needs valgrind; about 12 min on 2 cores
set -euo pipefail
cd "$(dirname "$0")/.."
command -v valgrind >/dev/null || { echo "needs valgrind (apt-get install valgrind)" >&2; exit 2; }
work=$(mktemp -d)
trap 'kill "${pid:-}" 2>/dev/null || true; rm -rf "$work"' EXIT
touch crates/sigil/startup.order
scripts/dist.sh --symbols
cp "${CARGO_TARGET_DIR:-target}/dist/sigil" "$work/sigil"
# A policy with what a start reads: a registry, rules, a cosign key.
cat >"$work/policy.yaml" <<POLICY
apiVersion: sigil.dev/v1alpha1
kind: ImagePolicy
spec:
  registries:
    - {host: "127.0.0.1:5000", insecure: true}
  rules:
    - {name: all, match: ["**"], mode: enforce}
    - name: signed
      match: ["127.0.0.1:5000/signed/**"]
      verify:
        - {name: ci, cosign: {key: "$PWD/examples/test/cosign.pub"}}
POLICY
SIGIL_TRUST_ROOT_REFRESH=0s valgrind --tool=callgrind --demangle=no \
  --callgrind-out-file="$work/callgrind.out" "$work/sigil" serve \
  --policy "$work/policy.yaml" --listen 127.0.0.1:0 --admin-listen 127.0.0.1:0 \
  --log-format json --shutdown-delay 0s 2>"$work/log" &
pid=$!
for _ in $(seq 240); do
  grep -q 'self-check passed' "$work/log" && break
  kill -0 "$pid" 2>/dev/null || { cat "$work/log" >&2; exit 1; }
  sleep 0.5
done
grep -q 'self-check passed' "$work/log" || { echo "sigil did not become Ready under valgrind" >&2; exit 1; }
sleep 3
kill -TERM "$pid"
wait "$pid" || true
pid=
awk -v bin="$work/sigil" -f scripts/startup-order.awk "$work/callgrind.out" >"$work/order"
mv "$work/order" crates/sigil/startup.order
echo "crates/sigil/startup.order: $(wc -l <crates/sigil/startup.order) functions"
scripts/dist.sh
