#!/usr/bin/env bash
# Before a device call that compares trees (gpu_session.sh trees): for each
# NAME=REF, write ab/NAME/<dir>%<file> for every file of the code directories
# in which REF differs from the checkout, so that the device can rebuild REF's
# tree from this one without .git (pass carry ["ab"]: ab/ is ignored). The
# checkout itself is the tree "new".
#   bash tools/ab_trees.sh base=main ring=prepared/ring-down-bulk
set -euo pipefail
cd "$(dirname "$0")/.."
[ $# -gt 0 ] || { echo "usage: $0 NAME=REF ..." >&2; exit 2; }
for spec in "$@"; do
  name=${spec%%=*} ref=${spec#*=}
  [[ $name =~ ^[A-Za-z0-9_-]+$ && $name != new && $spec == *=* ]] || { echo "bad NAME=REF: $spec (NAME: letters, digits, - or _; not 'new')" >&2; exit 2; }
  git rev-parse --verify -q "$ref^{commit}" > /dev/null || { echo "$ref: not a commit" >&2; exit 2; }
  rm -rf "ab/$name"; mkdir -p "ab/$name"
  n=0
  while IFS= read -r f; do
    if git cat-file -e "$ref:$f" 2> /dev/null; then git show "$ref:$f" > "ab/$name/${f//\//%}"; n=$((n + 1))
    else echo "$name: $f is not in $ref (the tree keeps this checkout's)" >&2; fi
  done < <(git diff --name-only "$ref" -- isa ops runtime scheduler gpuvm tools tests)
  echo "ab/$name: $n files of $ref ($(git rev-parse --short "$ref"))"
done
