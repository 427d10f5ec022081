#!/usr/bin/env bash
# Checks, on any machine with Python 3 and PyPI (no GPU needed), that a lock file installs on its
# target platform, for each of Python 3.11 and 3.12:
#
#   bash requirements/check-locks.sh                      # quant-cuda.lock and serve-cuda.lock
#   bash requirements/check-locks.sh requirements/X.lock  # any lock(s)
#
# Two checks per lock and Python version; both read package metadata only, no wheel is downloaded
# whole (a full run moves about 0.5 GB, mostly the build requirements of the sdists, e.g. cmake):
#   uv:  `uv pip compile LOCK` for that platform and Python, wheels only (except the sdist-only
#        packages): it must resolve, and give back exactly the lock's pins, so every pin has a wheel for
#        that platform/Python, the set is consistent, and it is complete (nothing missing).
#   pip: `pip install --dry-run --no-deps --only-binary=:all: --platform ... --report` with
#        --use-feature=fast-deps (metadata by HTTP range requests), pip being the installer
#        that `make setup` uses: each pin must select a wheel (an sdist for the sdist-only ones) of
#        exactly the pinned version (torch 2.13.0, never 2.13.0+cpu).
# Both run with pip's and uv's configuration files ignored (PIP_CONFIG_FILE=/dev/null, UV_NO_CONFIG)
# and without the PIP_*/UV_* variables that add package sources, so a wheel on local disk (find-links,
# file:// indexes) cannot satisfy them: only PyPI and the lock's own --extra-index-url lines count.
# CHECK_INDEX_URL=URL points both at a PyPI mirror instead. One retry per request (an unreachable
# extra index would otherwise cost ~7 s of back-off per package).
# Exit status: 0 if every lock x Python version passes.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)

PYTHONS=${PYTHONS:-"3.11 3.12"}
PLATFORM=${PLATFORM:-x86_64-manylinux_2_31}   # uv's name; pip gets manylinux_2_5 .. 2_31 (below)
SDIST_ONLY=${SDIST_ONLY:-"gptqmodel device-smi pypcre tokenicer logbar defuser sqlitedict word2number rouge-score"}
UV_VERSION=0.13.9
[ $# -gt 0 ] || set -- "$here/quant-cuda.lock" "$here/serve-cuda.lock"

unset PIP_INDEX_URL PIP_EXTRA_INDEX_URL PIP_FIND_LINKS PIP_NO_INDEX PIP_CONSTRAINT PIP_ONLY_BINARY \
      PIP_NO_BINARY PIP_PREFER_BINARY UV_INDEX UV_INDEX_URL UV_DEFAULT_INDEX UV_EXTRA_INDEX_URL \
      UV_FIND_LINKS UV_NO_INDEX UV_CONSTRAINT UV_OVERRIDE UV_TORCH_BACKEND
export PIP_CONFIG_FILE=/dev/null UV_NO_CONFIG=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_RETRIES=1 UV_HTTP_RETRIES=1
[ -n "${CHECK_INDEX_URL:-}" ] && export PIP_INDEX_URL=$CHECK_INDEX_URL UV_INDEX_URL=$CHECK_INDEX_URL

# a scratch venv outside the project with uv and a current pip (same one as make-cuda-locks.sh)
tools=${TMPDIR:-/tmp}/lock-tools-uv-$UV_VERSION
if [ ! -x "$tools/bin/uv" ]; then
  python3 -m venv "$tools" && "$tools/bin/pip" install -q -U pip "uv==$UV_VERSION" || exit 2
fi
uv=$tools/bin/uv pip=$tools/bin/pip
work=$(mktemp -d); trap 'rm -rf "$work"' EXIT

n=${PLATFORM##*_}; arch=${PLATFORM%%-*}
pipplat=(); for i in $(seq "$n" -1 5); do pipplat+=(--platform "manylinux_2_${i}_$arch"); done
pipplat+=(--platform "manylinux2014_$arch" --platform "manylinux2010_$arch" --platform "manylinux1_$arch")
nobin=(); sdre=""; for p in $SDIST_ONLY; do nobin+=(--no-binary "$p"); sdre="$sdre|$p"; done
sdre="^(${sdre#|})=="

fails=0
for lock in "$@"; do
  name=$(basename "$lock")
  for py in $PYTHONS; do
    tag="$name py$py"; msg=""; ok=1; pipfail=0; rm -f "$work"/*.json
    # --- uv: resolve the lock itself
    if ! "$uv" pip compile -q "$lock" --python-platform "$PLATFORM" --python-version "$py" \
         --only-binary :all: "${nobin[@]}" --no-header --no-annotate -o "$work/uv.txt" 2>"$work/uv.err"; then
      ok=0; msg="uv: does not resolve: $( { grep -m1 -E 'Because' "$work/uv.err" || head -1 "$work/uv.err"; } | sed 's/^ *cause: *//' | cut -c1-300);"
    else
      r=$(python3 "$here/compare_pins.py" uv "$lock" "$work/uv.txt")
      [ "$r" = ok ] || { ok=0; msg="uv: lock incomplete or inconsistent, the resolver adds/changes: ${r#BAD }"; }
    fi
    # --- pip: the installer selects a file of exactly the pinned version for every pin
    { grep -E '^--' "$lock"; grep -v -i -E "$sdre" "$lock" | grep -v -E '^--'; } > "$work/wheels.txt"
    { grep -E '^--' "$lock"; grep -i -E "$sdre" "$lock"; } > "$work/sdists.txt"
    if ! "$pip" install -q --no-cache-dir --dry-run --ignore-installed --no-deps --only-binary=:all: --use-feature=fast-deps \
         "${pipplat[@]}" --python-version "$py" --implementation cp --target "$work/t" \
         --report "$work/w.json" -r "$work/wheels.txt" 2>"$work/pip.err" >/dev/null; then
      ok=0; pipfail=1; msg="$msg pip: $(grep -E '^ERROR: No matching' "$work/pip.err" | tail -1 | cut -c1-200)"
    fi
    if grep -q -E '^[A-Za-z0-9]' "$work/sdists.txt"; then
      if ! "$pip" install -q --no-cache-dir --dry-run --ignore-installed --no-deps "${nobin[@]}" \
           --python-version "$py" --target "$work/t" --report "$work/s.json" -r "$work/sdists.txt" \
           2>"$work/pip.err" >/dev/null; then
        ok=0; pipfail=1; msg="$msg pip (sdists): $(grep -E '^ERROR' "$work/pip.err" | tail -1 | cut -c1-200)"
      fi
    else echo '{"install": []}' > "$work/s.json"; fi
    if [ $pipfail = 0 ]; then
      pipmsg=$(python3 "$here/compare_pins.py" pip "$lock" "$work/w.json" "$work/s.json")
      case $pipmsg in BAD*) ok=0; msg="$msg pip selects other versions: ${pipmsg#BAD }";; esac
    fi
    if [ $ok = 1 ]; then
      echo "PASS  $tag: $(grep -c -E '^[A-Za-z0-9]' "$lock") pins; uv resolves exactly the lock; pip selects $pipmsg"
    else
      echo "FAIL  $tag: $msg"; fails=$((fails + 1))
    fi
  done
done
exit $((fails > 0))
