#!/usr/bin/env bash
# Create (once) the Python virtual environment for this checkout's requirements and print its path.
#
# The environment lives outside the clone, keyed by the hash of requirements.txt, so clean clones
# and CI runs reuse it and a change of requirements builds a new one:
#   ${OPFORGE_VENV_ROOT:-$HOME/.cache/opforge}/venv-<sha256[:16]>
# Set OPFORGE_PYTHON to use an existing interpreter instead (the GPU machine's python3, which
# already has torch); then nothing is installed.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
if [[ -n "${OPFORGE_PYTHON:-}" ]]; then
  echo "$OPFORGE_PYTHON"
  exit 0
fi
key="$(sha256sum "$root/requirements.txt" | cut -c1-16)"
venv="${OPFORGE_VENV_ROOT:-$HOME/.cache/opforge}/venv-$key"
if [[ ! -f "$venv/.complete" ]]; then
  # One creator at a time: a second make (or CI beside a developer's build) waits for the
  # first, then finds the environment complete.
  mkdir -p "$(dirname "$venv")"
  exec 9>"$venv.lock"
  flock 9
fi
if [[ ! -f "$venv/.complete" ]]; then
  echo "opforge: creating the Python environment $venv (first run only)" >&2
  rm -rf "$venv"
  python3 -m venv "$venv" >&2
  "$venv/bin/python" -m pip install --quiet --upgrade pip >&2
  "$venv/bin/python" -m pip install --quiet -r "$root/requirements.txt" >&2
  touch "$venv/.complete"
fi
echo "$venv/bin/python"
