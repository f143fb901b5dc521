"""What the g4 serve tests share: the check counter, the built-in model's questions, the g4
command's references, a server on loopback and raw HTTP helpers. Every tests/serve/*.py test
module imports it; test_serve.py's main() runs them all and prints the closing line."""
import http.client
import json
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

import openai

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
G4 = os.environ.get("G4_BIN") or os.path.join(ROOT, "build", "release", "g4")
MODEL = os.path.join(ROOT, "models", "gemma4-tiny-math")
MODEL_ID = "gemma4-tiny-math"
FIXTURES = os.path.join(ROOT, "tests", "fixtures", "chat")
ASAN = "asan" in G4
TIMEOUT = 120 if ASAN else 60

passed = failed = skipped = 0


def check(cond, what, detail=""):
    global passed, failed
    if cond:
        passed += 1
        print("ok " + what, flush=True)
    else:
        failed += 1
        print("FAIL " + what + (": " + str(detail) if detail else ""), file=sys.stderr, flush=True)
    return cond


# ---------------------------------------------------------------- the built-in model's questions

with open(os.path.join(MODEL, "example_prompt.txt"), encoding="utf-8") as f:
    EXAMPLE = f.read()
INSTRUCTIONS = EXAMPLE[:EXAMPLE.index("Problem:")]
with open(os.path.join(MODEL, "test.jsonl"), encoding="utf-8") as f:
    QUESTIONS = [json.loads(line)["question"] for line in f][:40]


def problem(i):
    return INSTRUCTIONS + "Problem: " + QUESTIONS[i % len(QUESTIONS)]


# ---------------------------------------------------------------- references from the g4 command

def g4_run(user, system=None, extra=(), raw=False):
    """What `g4 run` prints for the prompt (its answer, thoughts left out), without the closing newline."""
    cmd = [G4, "run", "-m", MODEL, "-p", user] + (["--system", system] if system else []) + (["--raw"] if raw else []) + list(extra)
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=TIMEOUT)
    if out.returncode != 0:
        raise RuntimeError("g4 run failed: " + out.stderr)
    return out.stdout[:-1] if out.stdout.endswith("\n") else out.stdout


def g4_chat(lines, extra=()):
    """`g4 chat`'s answers, one per input line (each printed on its own line)."""
    out = subprocess.run([G4, "chat", "-m", MODEL] + list(extra), input="\n".join(lines) + "\n", capture_output=True, text=True,
                         timeout=TIMEOUT)
    if out.returncode != 0:
        raise RuntimeError("g4 chat failed: " + out.stderr)
    return out.stdout


def g4_tokens(text):
    out = subprocess.run([G4, "tokenize", "-m", MODEL], input=json.dumps(text) + "\n", capture_output=True, text=True, timeout=TIMEOUT)
    return json.loads(out.stdout)


# ---------------------------------------------------------------- a server on loopback

class Server:
    def __init__(self, *args):
        self.args = list(args)
        self.proc = subprocess.Popen([G4, "serve", "-m", MODEL, "--port", "0"] + self.args, stderr=subprocess.PIPE, text=True)
        self.log = []
        self.port = None
        deadline = time.time() + TIMEOUT
        while self.port is None and time.time() < deadline:
            line = self.proc.stderr.readline()
            if not line:
                break
            self.log.append(line)
            m = re.search(r"on http://127\.0\.0\.1:(\d+) ", line)
            if m:
                self.port = int(m.group(1))
        if self.port is None:
            raise RuntimeError("g4 serve did not start: " + "".join(self.log))
        self.reader = threading.Thread(target=self._drain_log, daemon=True)
        self.reader.start()
        self.url = "http://127.0.0.1:%d" % self.port

    def _drain_log(self):
        for line in self.proc.stderr:
            self.log.append(line)

    def client(self, **kw):
        kw.setdefault("api_key", "none")
        kw.setdefault("max_retries", 0)
        kw.setdefault("timeout", TIMEOUT)
        return openai.OpenAI(base_url=self.url + "/v1", **kw)

    def http_full(self, method, path, body=None, headers=None):
        """(status, headers as a dict of lower-case names, parsed JSON or text) of one raw request."""
        c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=TIMEOUT)
        if isinstance(body, (dict, list)):
            body = json.dumps(body)
        c.request(method, path, body=body, headers=headers or {})
        r = c.getresponse()
        data = r.read()
        hdrs = {k.lower(): v for k, v in r.getheaders()}
        c.close()
        try:
            return r.status, hdrs, json.loads(data)
        except ValueError:
            return r.status, hdrs, data.decode("utf-8", "replace")

    def http(self, method, path, body=None, headers=None):
        """(status, parsed JSON or text) of one raw request."""
        status, _, out = self.http_full(method, path, body, headers)
        return status, out

    def metrics(self):
        _, text = self.http("GET", "/metrics")
        out = {}
        for line in text.splitlines():
            if line and not line.startswith("#"):
                name, value = line.rsplit(" ", 1)
                out[name] = float(value)
        return out

    def rss_kb(self):
        with open("/proc/%d/status" % self.proc.pid) as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
        return 0

    def stop(self):
        """SIGTERM; the exit status."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout=TIMEOUT)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return -1


def chat_body(user, **kw):
    body = {"model": MODEL_ID, "messages": [{"role": "user", "content": user}]}
    body.update(kw)
    return body


def sse_events(resp):
    """The data: payloads of an SSE stream as they come, up to data: [DONE] or the end."""
    for line in resp:
        line = line.decode("utf-8").rstrip("\r\n")
        if line.startswith("data: "):
            yield line[6:]
            if line == "data: [DONE]":
                return


def raw_stream(port, body):
    """A streaming request through http.client (which undoes the chunked encoding): (connection, response, status)."""
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=TIMEOUT)
    c.request("POST", "/v1/chat/completions", body=json.dumps(body), headers={"Content-Type": "application/json"})
    r = c.getresponse()
    return c, r, r.status


def is_error_shape(body, status, code=None, param=None):
    if not isinstance(body, dict) or set(body) != {"error"}:
        return False
    e = body["error"]
    ok = set(e) == {"message", "type", "param", "code"} and isinstance(e["message"], str) and e["message"] and isinstance(e["type"], str)
    if code is not None:
        ok = ok and e["code"] == code
    if param is not None:
        ok = ok and e["param"] == param
    return ok


# ---------------------------------------------------------------- the tests
