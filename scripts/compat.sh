#!/usr/bin/env bash
# The test suite in a fresh virtual environment of the versions you name: what a user who installs
# focusfl today gets, or the oldest releases the README promises. Not run by CI (.ci/run runs the
# suite in its own fresh environment with torch 2.13.0); README.md lists the stacks this was run on.
#
#   scripts/compat.sh [-p PYTHON] [-e EXTRAS] [-k] [REQUIREMENT ...] [-- PYTEST_ARGS ...]
#
#   REQUIREMENT  what pip must install, e.g. torch==2.2.2 "numpy<2" transformers==4.40.0; installed
#                before the project and held as constraints while it installs. Name torch's version
#                (torch==2.13.0): a bare torch pulls a CUDA build of several GB on Linux. Without a
#                requirement for a package pip resolves its newest release.
#   -e EXTRAS    the project's extras (default "test": every optional package the tests use);
#                -e "" installs none of them (with pytest and pytest-xdist): their tests must skip.
#   -p PYTHON    the interpreter that makes the environment (default python3)
#   -k           keep the environment (its path is printed); else it is removed at the end
#   PYTEST_ARGS  default: the whole suite as the README runs it (python -m pytest)
#
# Prints the versions installed and pytest's closing line; exits with pytest's status.
# Example: scripts/compat.sh torch==2.13.0 -- -n0 tests/test_focus.py
set -euo pipefail
cd "$(dirname "$0")/.."
python=python3 extras=test keep=0
while getopts "p:e:k" opt; do
    case $opt in
        p) python=$OPTARG ;;
        e) extras=$OPTARG ;;
        k) keep=1 ;;
        *) sed -n '2,20p' "$0" >&2; exit 2 ;;
    esac
done
shift $((OPTIND - 1))
requirements=()
while (($#)) && [[ $1 != -- ]]; do requirements+=("$1"); shift; done
(($#)) && shift  # the --
pytest_args=("$@")

venv="$(mktemp -d "${TMPDIR:-/tmp}/focusfl-compat.XXXXXX")"
if ((keep)); then echo "environment: $venv"; else trap 'rm -rf "$venv"' EXIT; fi
"$python" -m venv "$venv"
pip=("$venv/bin/python" -m pip install --quiet --disable-pip-version-check)
constraints="$venv/requested.txt"
printf '%s\n' "${requirements[@]}" > "$constraints"
((${#requirements[@]})) && "${pip[@]}" "${requirements[@]}"
if [[ -n $extras ]]; then
    "${pip[@]}" -c "$constraints" ".[$extras]"
else
    "${pip[@]}" -c "$constraints" . pytest pytest-xdist
fi
"$venv/bin/python" scripts/versions.py
log="$venv/pytest.log"
status=0
"$venv/bin/python" -m pytest "${pytest_args[@]}" > "$log" 2>&1 || status=$?
grep -E "^(FAILED|ERROR) " "$log" || true
tail -n 1 "$log"
exit "$status"
