#!/usr/bin/env bash
# Create (once) the Python virtual environment for this checkout's requirements and print its path.
#
# The environment lives outside the clone, keyed by the hash of requirements.txt, so clean clones
# and CI runs reuse it and a change of requirements builds a new one:
#   ${OPFORGE_VENV_ROOT:-$HOME/.cache/opforge}/venv-<sha256[:16]>
# and removes those of earlier requirements but the most recently used one.
# Set OPFORGE_PYTHON to use an existing interpreter instead (the GPU machine's python3, which
# already has torch); then nothing is installed.
#
# Creating it downloads and installs a few GB (torch among them): it says so on stderr, step by
# step with each step's time; on a terminal pip shows its own progress bars, elsewhere a line
# every 30 s says the step is still running.
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
  if ! flock --nonblock 9; then
    echo "opforge: waiting for another process creating the Python environment $venv" >&2
    flock 9
  fi
fi
if [[ ! -f "$venv/.complete" ]]; then
  # pip's progress bars on a terminal; its summary alone elsewhere (a log gets no bars).
  quiet=(--quiet)
  [[ -t 2 ]] && quiet=()
  # Off a terminal (a log, CI), where pip prints nothing until it ends: a line every
  # OPFORGE_HEARTBEAT_S seconds (30) while a step runs, as opforge's own long steps do
  # (python/opforge/_progress.py), so that no minute passes silent.
  heartbeat() {
    local period="${OPFORGE_HEARTBEAT_S:-30}" waited=0
    while sleep "$period" </dev/null >/dev/null 2>&1; do
      waited=$((waited + period))
      echo "opforge:   still running after $waited s" >&2
    done
  }
  step() {  # step MESSAGE COMMAND...: says MESSAGE, runs COMMAND (its output on stderr), says how long it took
    local message="$1" start=$SECONDS status=0 beat=""
    shift
    echo "opforge: $message" >&2
    if [[ ! -t 2 ]]; then
      heartbeat &
      beat=$!
    fi
    "$@" >&2 || status=$?
    if [[ -n "$beat" ]]; then
      kill "$beat" 2>/dev/null || true
      wait "$beat" 2>/dev/null || true
    fi
    if [[ $status -ne 0 ]]; then
      echo "opforge:   failed (exit $status): the environment is incomplete; the next run creates it again." >&2
      echo "opforge: a Python that already has $(grep -m1 -E '^torch==' "$root/requirements.txt" || echo torch) (the" \
        "way on a machine without the package index) can be used instead: OPFORGE_PYTHON=python3 make test" >&2
      exit 1
    fi
    echo "opforge:   done in $((SECONDS - start)) s" >&2
  }
  echo "opforge: creating the Python environment $venv for requirements.txt (first run only;" \
    "a few minutes: torch and the other packages are a few GB)" >&2
  rm -rf "$venv"
  step "creating the virtual environment" python3 -m venv "$venv"
  step "upgrading pip" "$venv/bin/python" -m pip install "${quiet[@]}" --upgrade pip
  step "installing $(grep -cvE '^\s*(#|$)' "$root/requirements.txt") packages of requirements.txt with their dependencies" \
    "$venv/bin/python" -m pip install "${quiet[@]}" -r "$root/requirements.txt"
  touch "$venv/.complete"
  # The environments of earlier requirements.txt files (a few GB each): the most recently used one
  # stays (another checkout on another branch may be running with it), older ones go, except one
  # being created (its lock is held).
  keep=1
  while IFS= read -r stamp; do
    old="$(dirname "$stamp")"
    [[ "$old" == "$venv" ]] && continue
    if ((keep > 0)); then
      keep=$((keep - 1))
      continue
    fi
    (
      flock --nonblock 8 || exit 0
      echo "opforge: removing $old, the environment of an earlier requirements.txt" >&2
      rm -rf "$old" "$old.lock"
    ) 8>"$old.lock"
  done < <(ls -1dt "$(dirname "$venv")"/venv-????????????????/.complete 2>/dev/null)
fi
touch "$venv/.complete"  # when it was last used: the order in which environments are removed
echo "$venv/bin/python"
