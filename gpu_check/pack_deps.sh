#!/usr/bin/env bash
# Pack what a GPU machine without network lacks (Ray, pydantic, trueskill, pyseccomp, ...) into one file,
# for a machine that already has torch, transformers and peft (the device machines: Python 3.12, x86-64).
#
#   bash gpu_check/pack_deps.sh [options]          # here, with network; writes gpu_deps/ (ignored by git)
#   bash gpu_deps/install.sh /tmp/deps             # there: unpacks into /tmp/deps and checks the imports
#   export PYTHONPATH=/tmp/deps${PYTHONPATH:+:$PYTHONPATH} PATH=/tmp/deps/bin:$PATH
#
# Options:
#   --python X.Y        the target's Python (default 3.12); wheels are cpXY ones
#   --platform TAG      a wheel platform tag the target accepts; repeat for several (default: every
#                       manylinux tag up to --glibc, e.g. manylinux_2_28_x86_64 ... manylinux2014_x86_64)
#   --glibc X.Y         the target's glibc, for the default tags (default 2.28: conservative, current distributions have more)
#   --arch ARCH         for the default tags (default x86_64)
#   --out DIR           where the bundle goes (default gpu_deps/ at the repository root; git ignores it)
#   --have "a b"        more packages the target already has (not packed); --skip is the same
#   --have-from FILE    the same, read from FILE (a `pip list --format=freeze` or one name a line)
#   --need "a b"        pack these even though a list below says the target has them
#   --full              pack also what the device image is recorded to hold (DEVICE_IMAGE below): for a
#                       machine with torch, transformers and peft and nothing else (over 64 MiB: ~70)
#   --no-pin            resolve the newest allowed versions instead of this environment's (`pip list`)
#   --strip-symbols     also strip the symbol tables of Ray's ELF files: 35.4 instead of 45.0 MiB for 3.12;
#                       Ray's C++ stack traces lose function names (Ray started and ran actors so, for 3.11)
#   --xz LEVEL          xz preset (default 9)
#   --work DIR          keep the downloads and the staged tree in DIR (default: a temporary folder,
#                       removed at the end)
# Environment: PYTHON, the Python whose pip resolves and whose `pip list` gives the pins (default the
# repository's .venv, else python3); its pip's configuration (index, certificates) is used.
#
# What it does: resolves the project's requirements (pyproject.toml: dependencies and the dev extra, not
# vllm) for the target with `pip install --dry-run --report`, pinned to this environment's versions; drops
# what the target has (HAVE below, plus --have); downloads the rest as binary wheels for the target (pure
# sdists in SDIST_ONLY are built into wheels here); installs them into one staged tree with
# `pip install --target --no-deps` (nothing is compiled); removes from Ray what it never runs (ray/jars:
# Java; the dashboard's *.js.map source maps); and packs the tree into gpu_deps/gpu_deps.tar.xz beside a
# generated gpu_deps/install.sh and MANIFEST.txt. It prints the sizes and the commands to run there.
# The device tool carries the working tree plus the ignored paths named in `carry`, 64 MiB in all:
# carry `gpu_deps` (docs/memory.md, "The one-command GPU check").
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
PYVER=3.12
GLIBC=2.28
ARCH=x86_64
PLATFORMS=()
OUT=$ROOT/gpu_deps
EXTRA_HAVE=""
NEED=""
PIN=1
STRIP_SYMBOLS=0
XZ_LEVEL=9
WORK=""
FULL=0

# What the target already has and the bundle leaves out: torch, transformers and peft, and what each of them
# requires (so any machine that has the three has these too). Shipping them would shadow the target's own
# builds (torch's CUDA wheels, numpy) through PYTHONPATH. Names as PEP 503 normalises them.
# Three small pure-Python ones they need are packed all the same, at this environment's versions, because
# packed distributions need recent releases of them (pydantic 2.14: typing-extensions>=4.16; virtualenv 21:
# packaging>=26.3 and filelock>=3.24.2), and their newer releases keep the older APIs: typing-extensions,
# packaging, filelock.
HAVE=(
  # torch (the CUDA build and its wheels) and its requirements
  torch triton 'nvidia-*' 'cuda-*' sympy mpmath networkx jinja2 markupsafe fsspec setuptools
  # transformers and its requirements (tokenizers, safetensors, huggingface-hub and hf-xet among them)
  transformers tokenizers safetensors huggingface-hub hf-xet numpy pyyaml regex tqdm
  # peft and its requirements (accelerate, psutil)
  peft accelerate psutil
)
# What the device machines' image ('cuda') is recorded to hold besides (the device tool's KINDS.md, "Python
# packages already there", read 2026-11-17), among the large packages the project needs in loose ranges only.
# Left out unless --full: with them the bundle does not fit the 64 MiB that travel (70 MiB measured for 3.11).
# The small ones the image also holds (click, msgpack, protobuf, aiohttp, requests, attrs, ...) are packed
# anyway, at this environment's versions, so that Ray runs on the versions it runs on here.
DEVICE_IMAGE=(
  # matplotlib and its requirements (~23 MiB of wheels)
  matplotlib pillow fonttools kiwisolver contourpy cycler pyparsing python-dateutil
  # tensorboard and its requirements; grpcio (7 MiB) is also Ray's (>=1.42; its generated code checks no version)
  tensorboard tensorboard-data-server werkzeug markdown absl-py grpcio
  # the test tools (gpu_check.py needs pytest)
  pytest pluggy iniconfig hypothesis sortedcontainers pygments
)
# Requirements that PyPI has only as a source archive of pure Python: built into a py3-none-any wheel here.
SDIST_ONLY=(trueskill)

usage() { sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'; }
die() { echo "pack_gpu_deps: $*" >&2; exit 2; }

while [ $# -gt 0 ]; do
  case "$1" in
    --python) PYVER=${2:?}; shift 2 ;;
    --platform) PLATFORMS+=("${2:?}"); shift 2 ;;
    --glibc) GLIBC=${2:?}; shift 2 ;;
    --arch) ARCH=${2:?}; shift 2 ;;
    --out) OUT=${2:?}; shift 2 ;;
    --have|--skip) EXTRA_HAVE="$EXTRA_HAVE ${2:?}"; shift 2 ;;
    --have-from) [ -r "${2:?}" ] || die "cannot read $2"
                 EXTRA_HAVE="$EXTRA_HAVE $(sed -e 's/#.*//' -e 's/[=<>!~ ;@[].*//' "$2" | tr '\n' ' ')"; shift 2 ;;
    --need) NEED="$NEED ${2:?}"; shift 2 ;;
    --no-pin) PIN=0; shift ;;
    --full) FULL=1; shift ;;
    --strip-symbols) STRIP_SYMBOLS=1; shift ;;
    --xz) XZ_LEVEL=${2:?}; shift 2 ;;
    --work) WORK=${2:?}; shift 2 ;;
    -h|--help) usage; exit 0 ;;
    *) usage >&2; die "unknown option $1" ;;
  esac
done
[[ $PYVER =~ ^3\.[0-9]+$ ]] || die "--python takes X.Y, e.g. 3.12"
ABI=cp${PYVER/./}
if [ ${#PLATFORMS[@]} -eq 0 ]; then
  [[ $GLIBC =~ ^2\.[0-9]+$ ]] || die "--glibc takes 2.N"
  for ((n=${GLIBC#2.}; n>=5; n--)); do PLATFORMS+=("manylinux_2_${n}_${ARCH}"); done
  PLATFORMS+=("manylinux2014_${ARCH}" "manylinux2010_${ARCH}" "manylinux1_${ARCH}")
fi
PY=${PYTHON:-}
if [ -z "$PY" ]; then
  if [ -x "$ROOT/.venv/bin/python" ]; then PY=$ROOT/.venv/bin/python; else PY=python3; fi
fi
command -v xz >/dev/null || die "xz is needed here"

if [ -n "$WORK" ]; then mkdir -p "$WORK"; WORK=$(cd "$WORK" && pwd)
else WORK=$(mktemp -d "${TMPDIR:-/tmp}/pack_gpu_deps.XXXXXX"); trap 'rm -rf "$WORK"' EXIT; fi
mkdir -p "$OUT"; OUT=$(cd "$OUT" && pwd)
TARGET_OPTS=(--only-binary=:all: --python-version "$PYVER" --implementation cp --abi "$ABI")
for p in "${PLATFORMS[@]}"; do TARGET_OPTS+=(--platform "$p"); done
pip_() { "$PY" -m pip --disable-pip-version-check "$@"; }
mib() { awk -v b="$1" 'BEGIN { printf "%.1f MiB", b / 1048576 }'; }
bytes() { du -sb "$@" | awk '{ s += $1 } END { print s + 0 }'; }
log() { echo "[pack_gpu_deps] $*"; }

# --- 1. the project's requirements, pinned to this environment's versions -----------------------------------
log "target: CPython $PYVER ($ABI), ${#PLATFORMS[@]} platform tags from ${PLATFORMS[0]}; resolver: $PY"
"$PY" - "$ROOT/pyproject.toml" > "$WORK/requirements.txt" <<'PY'
import sys
try:
    import tomllib
except ImportError:  # Python 3.10
    import tomli as tomllib
project = tomllib.load(open(sys.argv[1], "rb"))["project"]
# The system's and the tests' requirements: the dependencies and the dev extra (not the vllm extra: the
# GPU check runs without vLLM, and vLLM's wheels alone exceed what travels to the machine).
for req in project["dependencies"] + project["optional-dependencies"].get("dev", []):
    print(req)
PY
[ "$FULL" = 1 ] || HAVE+=("${DEVICE_IMAGE[@]}")
HAVE_ALL=$(printf '%s\n' "${HAVE[@]}" $EXTRA_HAVE | tr 'A-Z_.' 'a-z--' | sort -u)
NEED_ALL=$(printf '%s\n' $NEED | tr 'A-Z_.' 'a-z--' | sort -u)
is_had() {  # is_had NAME: true where NAME is in HAVE_ALL (glob patterns allowed) and not in NEED_ALL
  local n; n=$(echo "$1" | tr 'A-Z_.' 'a-z--')
  grep -qxF "$n" <<<"$NEED_ALL" && return 1
  local pat; while read -r pat; do [ -n "$pat" ] && [[ $n == $pat ]] && return 0; done <<<"$HAVE_ALL"
  return 1
}
: > "$WORK/constraints.txt"
if [ "$PIN" = 1 ]; then
  # This environment's versions (local labels such as +cpu dropped), except for what the target has.
  pip_ list --format=freeze --exclude-editable 2>/dev/null | sed 's/+[^ ]*$//' | while IFS= read -r line; do
    is_had "${line%%==*}" || echo "$line"
  done > "$WORK/constraints.txt"
fi
# The requirements on the packages the target has are left out of the request: pip resolves only what
# the others need of them (they are never downloaded).
grep -v '^$' "$WORK/requirements.txt" | while IFS= read -r req; do
  name=$(echo "$req" | sed 's/[=<>!~ ;@[].*//')
  is_had "$name" || echo "$req"
done > "$WORK/request.txt"
log "requested: $(tr '\n' ' ' < "$WORK/request.txt")"

# --- 2. resolve for the target, then download what it lacks ------------------------------------------------
rm -rf "$WORK/wheels"; mkdir -p "$WORK/built" "$WORK/wheels"
for name in "${SDIST_ONLY[@]}"; do
  grep -qi "^$name\b" "$WORK/request.txt" || continue
  pin=$(grep -i "^$name==" "$WORK/constraints.txt" || echo "$name")
  ls "$WORK/built/"*.whl 2>/dev/null | grep -qi "/${name}-" || pip_ wheel -q --no-deps -w "$WORK/built" "$pin" \
    2> >(grep -v 'is ignored: it is neither a file nor a directory' >&2)
done
for w in "$WORK/built/"*.whl; do
  [ -e "$w" ] || continue
  [[ $w == *-py3-none-any.whl || $w == *-py2.py3-none-any.whl ]] || die "$(basename "$w") is not pure Python: it cannot be built here for the target"
done
pip_ install --dry-run --quiet --ignore-installed --report "$WORK/report.json" --target "$WORK/resolve" \
  "${TARGET_OPTS[@]}" --find-links "$WORK/built" -c "$WORK/constraints.txt" -r "$WORK/request.txt" \
  2> >(grep -v 'is ignored: it is neither a file nor a directory' >&2) \
  || die "pip could not resolve the requirements for CPython $PYVER on ${PLATFORMS[0]}; try --no-pin, or more --platform tags"
"$PY" - "$WORK/report.json" > "$WORK/resolved.txt" <<'PY'
import json, sys
for item in json.load(open(sys.argv[1]))["install"]:
    print(item["metadata"]["name"], item["metadata"]["version"])
PY
: > "$WORK/pack.txt"; : > "$WORK/left_out.txt"
while read -r name version; do
  if is_had "$name"; then echo "$name==$version" >> "$WORK/left_out.txt"; else echo "$name==$version" >> "$WORK/pack.txt"; fi
done < "$WORK/resolved.txt"
log "packing $(wc -l < "$WORK/pack.txt") distributions; left out (the target has them): $(tr '\n' ' ' < "$WORK/left_out.txt")"
pip_ download --quiet --no-deps "${TARGET_OPTS[@]}" --find-links "$WORK/built" -d "$WORK/wheels" -r "$WORK/pack.txt" \
  2> >(grep -v 'is ignored: it is neither a file nor a directory' >&2)
RAY_WHEEL=$(ls "$WORK/wheels"/ray-*.whl 2>/dev/null | head -1 || true)

# --- 3. one staged tree, Ray stripped ---------------------------------------------------------------------
rm -rf "$WORK/site"
pip_ install --quiet --no-deps --no-index --no-compile --target "$WORK/site" "${TARGET_OPTS[@]}" "$WORK/wheels"/*.whl \
  2> >(grep -v 'is ignored: it is neither a file nor a directory' >&2)
site=$WORK/site
before=$(bytes "$site")
if [ -d "$site/ray" ]; then
  ray_before=$(bytes "$site/ray")
  # ray/jars: the Java worker's jars (ray_dist.jar, ~33 MiB); this project has no Java actors.
  rm -rf "$site/ray/jars"
  # The dashboard's JavaScript source maps (~6 MiB): only a browser's developer tools read them.
  find "$site/ray" -name '*.js.map' -delete
  if [ "$STRIP_SYMBOLS" = 1 ]; then
    command -v strip >/dev/null || die "--strip-symbols needs binutils' strip"
    # The symbol tables (.symtab) of raylet, gcs_server and _raylet.so; the dynamic symbols stay.
    find "$site/ray" -type f \( -name '*.so' -o -perm -u+x \) -print0 | while IFS= read -r -d '' f; do
      head -c4 "$f" | grep -q 'ELF' && strip --strip-unneeded "$f"
    done
  fi
  ray_after=$(bytes "$site/ray")
fi
find "$site" -name __pycache__ -type d -prune -exec rm -rf {} +
# A .pth file does nothing on PYTHONPATH: say so where a packed distribution relies on one.
pths=$(cd "$site" && ls *.pth 2>/dev/null || true)
[ -z "$pths" ] || log "note: $pths in the bundle; Python reads .pth files only in site directories, not on PYTHONPATH"

# --- 4. one file, an installer, a manifest ---------------------------------------------------------------
{
  echo "# gpu_deps: packed by gpu_check/pack_deps.sh on $(date -u +%Y-%m-%dT%H:%MZ) from $(cd "$ROOT" && git rev-parse --short HEAD 2>/dev/null || echo '?')"
  echo "# target: CPython $PYVER ($ABI), platforms: ${PLATFORMS[*]}"
  echo "# strip: ray/jars, *.js.map$([ "$STRIP_SYMBOLS" = 1 ] && echo ', ELF symbol tables')"
  echo "# left out (the target has them): $(tr '\n' ' ' < "$WORK/left_out.txt")"
  sed 's/^/# project: /' "$WORK/requirements.txt"
  echo "# packed:"
  cat "$WORK/pack.txt"
} > "$OUT/MANIFEST.txt"
rm -f "$OUT/gpu_deps.tar.xz"
log "packing $(mib "$(bytes "$site")") with xz -$XZ_LEVEL (a few minutes)"
tar -C "$site" --owner=0 --group=0 --numeric-owner -cf - . | xz -T0 "-$XZ_LEVEL" > "$OUT/gpu_deps.tar.xz.part"
mv "$OUT/gpu_deps.tar.xz.part" "$OUT/gpu_deps.tar.xz"

cat > "$OUT/install.sh" <<EOF
#!/usr/bin/env bash
# Generated by gpu_check/pack_deps.sh for CPython $PYVER ($ABI, ${PLATFORMS[0]}); see MANIFEST.txt.
# Unpacks gpu_deps.tar.xz into DIR, points DIR/bin's scripts (ray, pytest, ...) at this machine's Python,
# checks that every packed distribution's requirements are met with DIR on PYTHONPATH and that the
# project's imports work, and prints the line to export.
#   bash gpu_deps/install.sh DIR          # PYTHON=... picks the Python (default python3)
set -euo pipefail
WANT=$PYVER
EOF
cat >> "$OUT/install.sh" <<'EOF'
here=$(cd "$(dirname "$0")" && pwd)
dest=${1:?usage: bash install.sh DIR}
PY=$(command -v "${PYTHON:-python3}") || { echo "install.sh: no ${PYTHON:-python3} here" >&2; exit 2; }
have=$("$PY" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
[ "$have" = "$WANT" ] || { echo "install.sh: packed for Python $WANT, $PY is $have" >&2; exit 2; }
mkdir -p "$dest"; dest=$(cd "$dest" && pwd)
if command -v xz >/dev/null; then tar -xJf "$here/gpu_deps.tar.xz" -C "$dest"
else "$PY" -c 'import sys, tarfile; tarfile.open(sys.argv[1]).extractall(sys.argv[2])' "$here/gpu_deps.tar.xz" "$dest"; fi
if [ -d "$dest/bin" ]; then
  for f in "$dest"/bin/*; do
    [ -f "$f" ] && head -c2 "$f" | grep -q '#!' && sed -i "1s|^#!.*python.*|#!$PY|" "$f" && chmod +x "$f"
  done
fi
export PYTHONPATH=$dest${PYTHONPATH:+:$PYTHONPATH}
"$PY" - "$here/MANIFEST.txt" <<'PY'
import importlib, importlib.metadata as md, sys
try:
    from packaging.requirements import Requirement
except ImportError:
    from pip._vendor.packaging.requirements import Requirement
lines = open(sys.argv[1]).read().splitlines()
packed = [l.strip() for l in lines if l.strip() and not l.startswith("#")]
project = [l[len("# project: "):] for l in lines if l.startswith("# project: ")]
problems = []
def check(who, req):
    try:
        found = md.version(req.name)
    except md.PackageNotFoundError:
        problems.append(f"{who} needs {req}: missing"); return
    if req.specifier and not req.specifier.contains(found, prereleases=True):
        problems.append(f"{who} needs {req}: {found} here")
for text in project:  # the project's own requirements (pyproject.toml), packed or this machine's
    check("the project", Requirement(text))
for line in packed:
    name = line.split("==")[0]
    try:
        dist = md.distribution(name)
    except md.PackageNotFoundError:
        problems.append(f"{name}: not found on PYTHONPATH"); continue
    if dist.version != line.split("==")[1]:
        problems.append(f"{name}: {dist.version} found first on sys.path, {line} packed")
    for text in dist.requires or []:
        req = Requirement(text)
        if not req.marker or req.marker.evaluate({"extra": ""}):
            check(name, req)
for line in sorted(set(problems)):
    print("[install] unmet:", line)
failed = []
for module in ("ray", "ray.util.state", "pydantic", "trueskill", "yaml", "safetensors", "pytest", "tensorboard",
               "tqdm", "pyseccomp", "math_verify", "jsonschema", "hypothesis", "matplotlib", "psutil"):
    try:
        importlib.import_module(module)
    except Exception as err:  # pyseccomp raises RuntimeError without libseccomp.so.2
        failed.append(f"{module} ({type(err).__name__}: {err})")
if "ray" in sys.modules and sys.modules["ray"] is not None and hasattr(sys.modules["ray"], "__version__"):
    print(f"[install] ray {sys.modules['ray'].__version__} from {sys.modules['ray'].__file__}")
if failed:
    print("[install] these do not import:", "; ".join(failed))
sys.exit(1 if failed else 0)
PY
echo "[install] done; now: export PYTHONPATH=$dest\${PYTHONPATH:+:\$PYTHONPATH} PATH=$dest/bin:\$PATH"
EOF
chmod +x "$OUT/install.sh"

# --- 5. sizes and the commands ---------------------------------------------------------------------------
bundle=$(bytes "$OUT")
tree=$(cd "$ROOT" && git ls-files -z --cached --others --exclude-standard 2>/dev/null | "$PY" -c '
import os, sys
print(sum(os.path.getsize(p) for p in sys.stdin.read().split("\0") if p and os.path.isfile(p)))')
log "sizes:"
[ -n "$RAY_WHEEL" ] && log "  ray wheel $(basename "$RAY_WHEEL"): $(mib "$(bytes "$RAY_WHEEL")"); unpacked $(mib "$ray_before"), stripped $(mib "$ray_after")"
log "  wheels downloaded: $(mib "$(bytes "$WORK/wheels")"); staged tree $(mib "$before") -> $(mib "$(bytes "$site")") after stripping"
log "  $OUT/gpu_deps.tar.xz: $(mib "$(bytes "$OUT/gpu_deps.tar.xz")"); the folder: $(mib "$bundle")"
log "  with the working tree ($(mib "$tree")): $(mib $((bundle + tree))) of the device tool's 64 MiB"
[ $((bundle + tree)) -le $((64 * 1048576)) ] || log "  OVER the 64 MiB limit: pass --have with what the target has (--have-from FILE), or --strip-symbols"
rel=${OUT#"$ROOT"/}
log "on the GPU machine (device tool: carry [\"$rel\"]), from the repository root:"
log "  bash $rel/install.sh /tmp/deps && export PYTHONPATH=/tmp/deps\${PYTHONPATH:+:\$PYTHONPATH} PATH=/tmp/deps/bin:\$PATH"
log "  python3 -m gpu_check"
