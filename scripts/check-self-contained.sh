#!/usr/bin/env bash
# The repository stands alone: no file that builds or tests sigil may read
# anything outside it (a user's clone has nothing beside it). Fails, naming
# the lines, when a path in crates/, fuzz/ or scripts/ climbs out of the
# repository or names the shared folder that sits beside it in development.
set -euo pipefail
cd "$(dirname "$0")/.."
pattern='\.\./shared|shared/vectors|shared/seeds|shared/notes|(\.\./){3,}'
if hits=$(grep -rnE "$pattern" crates fuzz scripts \
    --include='*.rs' --include='*.toml' --include='*.sh' --include='*.yaml' --include='*.json' \
    --exclude-dir=target --exclude-dir=corpus --exclude-dir=artifacts \
    | grep -v '^scripts/check-self-contained.sh:'); then
  echo "files point outside the repository (copy what they need into it, with its attribution):" >&2
  echo "$hits" >&2
  exit 1
fi
echo "self-contained: nothing in crates/, fuzz/ or scripts/ points outside the repository"
