#!/usr/bin/env bash
# A fresh machine follows the README: its two set-up commands, read from README.md's "Set up"
# section, run in a clean clone of this checkout inside a fresh HOME (so install.sh builds a new
# environment under it) with an empty environment, after bubblewrap and OpenBLAS were removed.
#   1. The install command must pass and put both packages back; `locals run` must then answer
#      a question about a tiny project on the installed daemon.
#   2. With bubblewrap removed again, the test command must pass: the tests that need a sandbox
#      skip with the install advice as their reason.
# The removed packages are installed again at the end, also on failure. Needs root and apt-get
# (CI runs it from .ci/run); it downloads the Python packages from PyPI.
set -euo pipefail
export DEBIAN_FRONTEND=noninteractive

repo=$(cd "$(dirname "$0")/.." && pwd)
packages=(bubblewrap libopenblas0-pthread)
say() { printf '\nfresh-machine: %s\n' "$*"; }

if [ "$(id -u)" != "0" ] || ! command -v apt-get >/dev/null; then
  echo "fresh-machine: needs root and apt-get (it removes and reinstalls ${packages[*]}); run it as root on Debian"
  exit 1
fi

# The README's set-up commands: the one line of each sh block under "## Set up", in order.
mapfile -t commands < <(awk '/^## /{section=$0} section=="## Set up" && /^```/{if (block) {block=0} else if ($0=="```sh") {block=1}; next} block' "$repo/README.md")
if [ "${#commands[@]}" != 2 ] || [[ "${commands[0]}" != ./install.sh* ]] || [[ "${commands[1]}" != *pytest* ]]; then
  echo "fresh-machine: README.md's Set up must hold two one-line sh blocks, ./install.sh then the tests; found:"
  printf '  %s\n' "${commands[@]}"
  exit 1
fi

# Outside /tmp, as a user's home is: the sandbox treats /tmp apart (docs/run.md).
work=$(mktemp -d /var/tmp/locals-fresh.XXXXXX)
home="$work/home"
port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
mkdir "$home"
# A login-like environment: the fresh HOME and the PATH less any active virtual environment.
clean_path=$(tr ':' '\n' <<<"$PATH" | grep -vxF "${VIRTUAL_ENV:-/nonexistent}/bin" | paste -sd:)
fresh() { env -i HOME="$home" PATH="$clean_path" LANG=C.UTF-8 TERM="${TERM:-dumb}" "$@"; }

restore() {
  local status=$?
  fresh "$home/.local/bin/locals" stop --port "$port" >/dev/null 2>&1 || true
  say "reinstalling ${packages[*]}"
  apt-get install -y -qq "${packages[@]}" >/dev/null \
    || { apt-get update -qq >/dev/null && apt-get install -y -qq "${packages[@]}" >/dev/null; }
  rm -rf "$work"
  if [ "$status" = 0 ]; then say "passed"; else say "FAILED (exit $status)"; fi
  exit "$status"
}
trap restore EXIT

say "removing ${packages[*]}"
apt-get remove -y -qq "${packages[@]}" >/dev/null
git clone -q "$repo" "$home/locals"
cd "$home/locals"

say "README install command: ${commands[0]}"
fresh bash -c "${commands[0]}"
command -v bwrap >/dev/null || { echo "fresh-machine: install.sh did not install bubblewrap"; exit 1; }
dpkg -s libopenblas0-pthread >/dev/null 2>&1 || { echo "fresh-machine: install.sh did not install OpenBLAS"; exit 1; }

say "locals run, question mode, right after install.sh (daemon on port $port)"
project="$home/project"
mkdir "$project"
git -C "$project" init -q
printf 'def add(a, b):\n    return a + b\n' >"$project/calc.py"
git -C "$project" add calc.py
git -C "$project" -c user.name=t -c user.email=t@t commit -qm start
answer=$(fresh "$home/.local/bin/locals" run "Which function in calc.py adds two numbers?" --dir "$project" \
  --port "$port" --agents 1 --max-steps 3 --max-tokens 192 --timeout 480)
[ -n "$answer" ] || { echo "fresh-machine: locals run printed no answer"; exit 1; }
printf 'answer: %s\n' "$answer"
fresh "$home/.local/bin/locals" stop --port "$port"

say "removing bubblewrap again: a contributor may run the tests without install.sh"
apt-get remove -y -qq bubblewrap >/dev/null
say "README test command: ${commands[1]}"
fresh bash -c "${commands[1]}"
skipped=$(fresh .venv/bin/python -m pytest -q -rs -m needs_sandbox)
grep -q "bubblewrap is needed" <<<"$skipped" || { echo "fresh-machine: sandbox tests did not skip:"; echo "$skipped"; exit 1; }
tail -n 2 <<<"$skipped"
