#!/bin/sh
# Runs tests/clients/test_clients.py (openai, LangChain, instructor and LiteLLM asking g4 serve for
# structured output) in a venv with the pinned clients: build/clients-venv (CLIENTS_VENV), made on
# first use with python3 -m venv and pip, and made again when requirements.txt changes (its copy is
# kept in the venv). G4_BIN names the g4 command under test; arguments pick clients by name.
set -e
cd "$(dirname "$0")/../.."
venv=${CLIENTS_VENV:-build/clients-venv}
if ! cmp -s tests/clients/requirements.txt "$venv/requirements.txt" 2>/dev/null; then
    echo "clients-test: making $venv with tests/clients/requirements.txt" >&2
    python3 -m venv "$venv"
    "$venv/bin/pip" install -q --disable-pip-version-check -r tests/clients/requirements.txt
    cp tests/clients/requirements.txt "$venv/requirements.txt"
fi
# LiteLLM would fetch its model price list from GitHub at import; its bundled copy does
LITELLM_LOCAL_MODEL_COST_MAP=True exec "$venv/bin/python" tests/clients/test_clients.py "$@"
