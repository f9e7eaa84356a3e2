# Sourced by the scripts: sets $root and $venv, and makes sure the venv is set up.
# TRIMFLOW_VENV picks another venv folder (relative to the checkout), e.g. .venv-py311.
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="${TRIMFLOW_VENV:-$root/.venv}"
case "$venv" in /*) ;; *) venv="$root/$venv" ;; esac
# scripts/test also gets the agent CLIs its end-to-end tests run (scripts/setup --agent-clis).
if [ "$(basename "$0")" = test ]; then "$root/scripts/setup" --agent-clis; else "$root/scripts/setup"; fi
