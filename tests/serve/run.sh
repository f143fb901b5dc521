#!/bin/sh
# Runs tests/serve/test_serve.py (g4 serve against the official openai client) in a venv with the
# pinned client: build/serve-venv (SERVE_VENV), made on first use with python3 -m venv and pip,
# kept while it holds the version requirements.txt pins. G4_BIN names the g4 command under test.
set -e
cd "$(dirname "$0")/../.."
venv=${SERVE_VENV:-build/serve-venv}
want=$(sed -n 's/^openai==//p' tests/serve/requirements.txt)
if ! "$venv/bin/python" -c "import openai, jsonschema, sys; sys.exit(openai.__version__ != '$want')" 2>/dev/null; then
    echo "serve-test: making $venv with openai $want" >&2
    python3 -m venv "$venv"
    "$venv/bin/pip" install -q --disable-pip-version-check -r tests/serve/requirements.txt
fi
exec "$venv/bin/python" tests/serve/test_serve.py
