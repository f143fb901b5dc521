#!/bin/sh
# `make python-test`: the Python package as a user gets it. A fresh venv (python3 -m venv, or
# $PYTHON), `pip install ./python pytest` into it (which builds libg4 from this tree with make), then
# the tests in python/tests against the installed package, the command line build/release/g4 (or
# $G4_BIN) beside them for the answers to compare with. Arguments go to pytest.
set -eu
root=$(cd "$(dirname "$0")/.." && pwd)
py=${PYTHON:-python3}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# a make above us (make python-test) must not hand its jobserver to the makes pip and the tests run
unset MAKEFLAGS MFLAGS MAKELEVEL
"$py" -m venv "$tmp/venv" || { echo "python-test: '$py -m venv' failed (Debian: apt-get install python3-venv)" >&2; exit 1; }
"$tmp/venv/bin/python" -m pip install -q --disable-pip-version-check "$root/python" pytest
cd "$root"
export G4_EXPECT_PACKAGE="$tmp/venv" G4_SOURCE="$root" G4_BIN="${G4_BIN:-$root/build/release/g4}" PYTHONDONTWRITEBYTECODE=1
"$tmp/venv/bin/python" -m pytest -p no:cacheprovider -q python/tests "$@"
