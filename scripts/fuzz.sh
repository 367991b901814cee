#!/usr/bin/env bash
# Runs sigil's fuzz targets with cargo-fuzz (nightly).
#   scripts/fuzz.sh smoke            # CI: a short run of every target
#   scripts/fuzz.sh run TARGET RUNS  # e.g. scripts/fuzz.sh run admission 1000000
#   scripts/fuzz.sh run bundle_oracle 1000000   # sigil vs sigstore-verify (feature
#                                    # `oracle`; not in the smoke: it builds a second verifier)
# The smoke builds unoptimized (`--dev`, still with AddressSanitizer): a
# release build of the tree with cargo-fuzz's one codegen unit per crate took
# 19 of CI's 34 minutes, the unoptimized one about 6. Each target then runs
# its seeds and mutations for up to SMOKE_RUNS runs or SMOKE_SECONDS seconds.
# Long runs (`run`) stay optimized.
set -euo pipefail
cd "$(dirname "$0")/.."
command -v cargo-fuzz >/dev/null || cargo install cargo-fuzz --locked
targets=(reference policy admission manifest signature attest tuf crl backstop)
seeds() {
  case "$1" in
    admission) echo "fuzz/seeds/empty crates/sigil/tests/fixtures/admission_requests" ;;
    # The conformance cases that use the suite's defaults (public-good
    # root, a.txt, the default identity): what the target judges against.
    bundle_oracle)
      for d in crates/sigil-verify/tests/vectors/sigstore-conformance/*/; do
        [ -e "$d/key.pub" ] || [ -e "$d/trusted_root.json" ] || [ -e "$d/artifact" ] \
          || [ -e "$d/identity" ] || [ -e "$d/issuer" ] || printf '%s ' "$d"
      done ;;
    *) echo "fuzz/seeds/$1" ;;
  esac
}
build() {
  echo "== building fuzz targets (nightly, sanitizer${1:+, $1})"
  cargo +nightly fuzz build ${1:-}
}
run() {
  local t=$1 runs=$2 profile=${3:-} log status=0
  mkdir -p "fuzz/corpus/$t" fuzz/seeds/empty
  log=$(mktemp)
  # shellcheck disable=SC2046
  cargo +nightly fuzz run $profile "$t" "fuzz/corpus/$t" $(seeds "$t") -- -runs="$runs" ${FUZZ_SECONDS:+-max_total_time=$FUZZ_SECONDS} -max_len=65536 -timeout=10 -print_final_stats=1 >"$log" 2>&1 || status=$?
  grep -E "stat::number_of_executed_units|^Done|ERROR|panicked|SUMMARY" "$log" || true
  [ "$status" -eq 0 ] || tail -n 40 "$log"
  rm -f "$log"
  return "$status"
}
case "${1:-smoke}" in
  smoke)
    build --dev
    for t in "${targets[@]}"; do
      echo "== fuzz $t"
      FUZZ_SECONDS="${SMOKE_SECONDS:-10}" run "$t" "${SMOKE_RUNS:-20000}" --dev
    done ;;
  run)
    if [ "$2" = bundle_oracle ]; then
      build "--features oracle"; run "$2" "${3:-1000000}" "--features oracle"
    else
      build; run "$2" "${3:-1000000}"
    fi ;;
  *) echo "usage: $0 smoke | run TARGET [RUNS]" >&2; exit 2 ;;
esac
