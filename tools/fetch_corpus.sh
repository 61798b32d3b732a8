#!/usr/bin/env bash
# Real photographs for the demo, tests and benchmarks: the wallpapers shipped in Debian's
# plasma-workspace-wallpapers and mate-backgrounds packages (about 55 JPEGs from 400x250
# to 5120x2880 with mixed chroma subsampling, plus PNGs that exercise conversion).
# Usage: tools/fetch_corpus.sh DIR   -- idempotent; prints how many images DIR holds.
set -euo pipefail
dest=${1:?usage: fetch_corpus.sh DIR}
pkgs=(plasma-workspace-wallpapers mate-backgrounds)
count() { find "$dest" -maxdepth 1 -type f | wc -l; }
if [ -f "$dest/.complete" ]; then count; exit 0; fi
mkdir -p "$dest"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
(cd "$tmp" && { apt-get download -qq "${pkgs[@]}" 2>/dev/null ||
  { apt-get update -qq && apt-get download -qq "${pkgs[@]}"; }; }) 2>&1 | grep -v unsandboxed || true
for deb in "$tmp"/*.deb; do dpkg-deb -x "$deb" "$tmp/x"; done
# Flat names: <theme>_<folder>_<file>, with anything unusual replaced by '_'.
find "$tmp/x" -type f \( -iname '*.jpg' -o -iname '*.jpeg' -o -iname '*.png' \) -print0 |
  while IFS= read -r -d '' f; do
    rel=${f#"$tmp"/x/usr/share/}
    rel=${rel#wallpapers/}; rel=${rel#backgrounds/}
    ext=${f##*.}; ext=$(echo "$ext" | tr 'A-Z' 'a-z'); [ "$ext" = jpeg ] && ext=jpg
    name=$(echo "${rel%.*}" | sed 's#/contents/#_#; s#/#_#g' | tr -c 'A-Za-z0-9._\n-' '_')
    cp "$f" "$dest/$name.$ext"
  done
touch "$dest/.complete"
count
