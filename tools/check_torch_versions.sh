#!/usr/bin/env bash
# One op-library binary across torch versions: build the example op libraries once (make build,
# the checkout's torch), then for each torch version, in a virtual environment of its own,
# `pip install` opforge (whose adapter is built for that torch on first use) and run
# `opforge verify --device cpu` on the very same .so files (copied once; their hashes are
# checked unchanged after each version).
#
#   tools/check_torch_versions.sh [VERSION...]   default: 2.10.0 and the newest torch on the index
#
# Environments live in ${OPFORGE_VENV_ROOT:-$HOME/.cache/opforge}/torch-check-<version>.
# Exit code: 0 when every version passed, 1 otherwise; a summary line per version at the end.
set -uo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venvs="${OPFORGE_VENV_ROOT:-$HOME/.cache/opforge}"
make -C "$root" build >/dev/null || { echo "check_torch_versions: make build failed" >&2; exit 1; }
py="$("$root/tools/bootstrap.sh")"
# The binaries under test are copied once (with their run-time kernel folders), so a rebuild
# of the checkout meanwhile cannot change them.
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
libs=()
for so in "$root"/build/lib/lib*.so; do
  case "$(basename "$so")" in libopforge_*) continue ;; esac
  cp -p "$so" "$tmp/"
  [[ -d "${so%.so}.kernels" ]] && cp -rpL "${so%.so}.kernels" "$tmp/"
  libs+=("$tmp/$(basename "$so")")
done
before="$(sha256sum "${libs[@]}")"
versions=("$@")
if [[ ${#versions[@]} -eq 0 ]]; then
  newest="$("$py" -m pip index versions torch 2>/dev/null | sed -n 's/^torch (\(.*\))$/\1/p')"
  versions=(2.10.0 "${newest:?could not read the newest torch from the package index}")
fi
summary=()
status=0
for v in "${versions[@]}"; do
  env="$venvs/torch-check-$v"
  echo "== torch $v ($env)"
  if [[ ! -f "$env/.complete" ]]; then
    rm -rf "$env" && python3 -m venv "$env" && "$env/bin/pip" install --quiet --upgrade pip \
      && "$env/bin/pip" install --quiet "torch==$v" numpy rich cmake ninja && touch "$env/.complete"
  fi
  # A fresh install of this clone each time; the adapter is rebuilt only when torch changes.
  if ! "$env/bin/pip" install --quiet --no-deps --force-reinstall "$root"; then
    summary+=("torch $v: FAILED (pip install of opforge)"); status=1; continue
  fi
  actual="$("$env/bin/python" -c 'import torch; print(torch.__version__)')"
  (cd "$env" && OPFORGE_QUIET=1 "$env/bin/opforge" verify "${libs[@]}" --device cpu --seed 0)
  rc=$?
  if [[ "$(sha256sum "${libs[@]}")" != "$before" ]]; then
    summary+=("torch $actual: FAILED (an op library changed)"); status=1
  elif [[ $rc -ne 0 ]]; then
    summary+=("torch $actual: FAILED (opforge verify exit $rc)"); status=1
  else
    summary+=("torch $actual: passed, ${#libs[@]} op libraries unchanged")
  fi
done
printf '%s\n' "${summary[@]}"
exit $status
