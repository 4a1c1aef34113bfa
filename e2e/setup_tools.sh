#!/usr/bin/env bash
# Installs the real agent tools that e2e/test_tools*.py drives against a locals daemon.
# Idempotent: a tool already at the wanted version is left alone. Everything goes under
# $LOCALS_TOOLS_HOME (default ~/.cache/locals-e2e-tools); the tests put its bin/ on PATH.
set -uo pipefail

TOOLS_HOME="${LOCALS_TOOLS_HOME:-$HOME/.cache/locals-e2e-tools}"
BIN="$TOOLS_HOME/bin"
NPM_PREFIX="$TOOLS_HOME/npm"
mkdir -p "$BIN" "$NPM_PREFIX"

# npm packages: name@version. Kilo's 7.8.1 lacks its Linux binary package, 7.7.7 has it.
NPM_TOOLS=(
  "opencode-ai@latest"
  "@anthropic-ai/claude-code@latest"
  "cline@latest"
  "@openai/codex@latest"
  "@kilocode/cli@7.7.7"
)
# Python tools, each in its own venv so their pins never fight: name|python|package|entry points
PY_TOOLS=(
  "aider|python3.12|aider-chat|aider"
  "hermes|python3.11|hermes-agent|hermes"
  "openhands|python3.12|openhands|openhands"
)

failed=()

install_npm() {
  local spec="$1" name="${1%@*}" want="${1##*@}" have
  have="$(npm ls -g --prefix "$NPM_PREFIX" --depth=0 --json "$name" 2>/dev/null \
    | sed -n 's/.*"version": *"\([^"]*\)".*/\1/p' | head -1)"
  if [[ -n "$have" && ( "$want" == "$have" || ( "$want" == latest && -z "${LOCALS_TOOLS_UPGRADE:-}" ) ) ]]; then
    echo "ok   $name $have"; return 0
  fi
  echo "npm  $spec"
  npm install -g --prefix "$NPM_PREFIX" --no-fund --no-audit --loglevel=error --allow-scripts="$name" "$spec" \
    || failed+=("$spec")
}

# A pyenv shim answers `command -v python3.12` even when 3.12 is not the active version.
find_python() {
  local want="$1" root
  if "$want" --version >/dev/null 2>&1; then echo "$want"; return 0; fi
  root="$(pyenv root 2>/dev/null)" || return 1
  for candidate in "$root"/versions/"${want#python}"*/bin/"$want"; do
    [[ -x "$candidate" ]] && { echo "$candidate"; return 0; }
  done
  return 1
}

install_py() {
  local name python pkg entries
  IFS='|' read -r name python pkg entries <<<"$1"
  local venv="$TOOLS_HOME/venvs/$name"
  local want="$python"
  if ! python="$(find_python "$want")"; then
    echo "skip $pkg: $want is not installed"; failed+=("$pkg"); return 0
  fi
  if [[ -x "$venv/bin/$entries" ]]; then
    echo "ok   $pkg (already installed)"
  else
    echo "pip  $pkg ($python)"
    "$python" -m venv "$venv" && "$venv/bin/pip" install -q --upgrade pip \
      && "$venv/bin/pip" install -q "$pkg" || { failed+=("$pkg"); return 0; }
  fi
  for entry in $entries; do ln -sf "$venv/bin/$entry" "$BIN/$entry"; done
}

for spec in "${NPM_TOOLS[@]}"; do install_npm "$spec"; done
for entry in "$NPM_PREFIX"/bin/*; do [[ -e "$entry" ]] && ln -sf "$entry" "$BIN/$(basename "$entry")"; done
for spec in "${PY_TOOLS[@]}"; do install_py "$spec"; done

echo "tools in $BIN:"; ls "$BIN"
if ((${#failed[@]})); then
  echo "not installed: ${failed[*]}" >&2
  exit 1
fi
