#!/bin/sh
# Runs tests/serve/test_serve.py (g4 serve against the official openai client) in a venv with the
# pinned client: build/serve-venv (SERVE_VENV), made on first use with python3 -m venv and pip,
# kept while it holds the version requirements.txt pins. G4_BIN names the g4 command under test.
set -e  # (the test groups below are judged by their results, not by set -e)
cd "$(dirname "$0")/../.."
venv=${SERVE_VENV:-build/serve-venv}
want=$(sed -n 's/^openai==//p' tests/serve/requirements.txt)
if ! "$venv/bin/python" -c "import openai, jsonschema, sys; sys.exit(openai.__version__ != '$want')" 2>/dev/null; then
    echo "serve-test: making $venv with openai $want" >&2
    python3 -m venv "$venv"
    "$venv/bin/pip" install -q --disable-pip-version-check -r tests/serve/requirements.txt
fi
# The two groups of test_serve.py side by side when the machine has two CPUs or more (none depends
# on timing; each server takes a port of its own), one after the other otherwise (SERVE_JOBS=1).
# Each group's log is printed whole, then the groups' counts added up as the closing line.
jobs=${SERVE_JOBS:-$(nproc 2>/dev/null || echo 1)}
logs=$(mktemp -d)
trap 'rm -rf "$logs"' EXIT
rc=0
if [ "$jobs" -ge 2 ]; then
    "$venv/bin/python" -u tests/serve/test_serve.py core > "$logs/core" 2>&1 & core=$!
    "$venv/bin/python" -u tests/serve/test_serve.py modules > "$logs/modules" 2>&1 || rc=1
    wait $core || rc=1
else
    "$venv/bin/python" -u tests/serve/test_serve.py core > "$logs/core" 2>&1 || rc=1
    "$venv/bin/python" -u tests/serve/test_serve.py modules > "$logs/modules" 2>&1 || rc=1
fi
cat "$logs/core" "$logs/modules"
# "serve-core: P passed, F failed, S skipped" and "serve-modules: ..." -> "serve: sums"; a group
# without its closing line (a crash) counts as a failure
awk -v rc=$rc '/^serve-(core|modules): [0-9]+ passed, [0-9]+ failed, [0-9]+ skipped$/ {
        seen++; p += $2; f += $4; s += $6 }
    END { if (seen != 2) f++; print "serve: " p " passed, " f " failed, " s " skipped"; exit (rc || f) ? 1 : 0 }' \
    "$logs/core" "$logs/modules"
