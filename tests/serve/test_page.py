"""g4 serve's chat page (GET /) in headless Chromium: the page is loaded, a message typed and sent,
and the answer streamed into the page must equal the API's greedy answer; the thought is shown
apart (equal to the API's reasoning_content); Stop ends a reply the server then cancels. Chromium
is driven through chromedriver's W3C WebDriver API (plain HTTP and JSON, so no client library).
Chromium and chromedriver come from Debian (scripts/install-deps.sh); without them the test fails.
run() is called from test_serve.py's main()."""
import http.client
import json
import os
import shutil
import socket
import subprocess
import tempfile
import time

from serve_util import MODEL_ID, QUESTIONS, TIMEOUT, Server, check

ELEMENT = "element-6066-11e4-a52e-4f735466cecf"  # the W3C spec's web element key


class Browser:
    """One headless Chromium session through a chromedriver of its own on loopback."""

    def __init__(self):
        driver, chromium = shutil.which("chromedriver"), shutil.which("chromium")
        if not driver or not chromium:
            raise RuntimeError("chromium and chromedriver are needed (scripts/install-deps.sh installs them)")
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.profile = tempfile.mkdtemp(prefix="g4-chromium-")
        self.proc = subprocess.Popen([driver, "--port=%d" % self.port], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            self._start(chromium)
        except BaseException:
            self.proc.terminate()
            self.proc.wait(timeout=TIMEOUT)
            shutil.rmtree(self.profile, ignore_errors=True)
            raise

    def _start(self, chromium):
        deadline = time.time() + TIMEOUT
        while True:
            try:
                self.call("GET", "/status")
                break
            except OSError:
                if time.time() > deadline:
                    raise
                time.sleep(0.1)
        caps = {"capabilities": {"alwaysMatch": {"browserName": "chrome", "goog:chromeOptions": {
            "binary": chromium, "args": ["--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                                         "--user-data-dir=" + self.profile, "--no-first-run", "--disable-extensions"]}}}}
        self.session = self.call("POST", "/session", caps)["sessionId"]

    def call(self, method, path, body=None):
        c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=TIMEOUT)
        c.request(method, path, body=json.dumps(body) if body is not None else None, headers={"Content-Type": "application/json"})
        r = c.getresponse()
        data = json.loads(r.read() or b"{}")
        c.close()
        if r.status != 200:
            raise RuntimeError("webdriver %s %s: %s" % (method, path, data))
        return data.get("value")

    def s(self, method, path, body=None):
        return self.call(method, "/session/%s%s" % (self.session, path), body)

    def open(self, url):
        self.s("POST", "/url", {"url": url})

    def find(self, css):
        return self.s("POST", "/element", {"using": "css selector", "value": css})[ELEMENT]

    def type(self, css, text):
        self.s("POST", "/element/%s/value" % self.find(css), {"text": text})

    def click(self, css):
        self.s("POST", "/element/%s/click" % self.find(css), {})

    def js(self, script, *args):
        return self.s("POST", "/execute/sync", {"script": script, "args": list(args)})

    def wait(self, script, timeout=TIMEOUT):
        """Polls the script until it returns something true; that value."""
        deadline = time.time() + timeout
        while time.time() < deadline:
            v = self.js(script)
            if v:
                return v
            time.sleep(0.05)
        return None

    def close(self):
        try:
            self.call("DELETE", "/session/" + self.session)
        finally:
            self.proc.terminate()
            self.proc.wait(timeout=TIMEOUT)
            shutil.rmtree(self.profile, ignore_errors=True)


LAST = "const m = [...document.querySelectorAll('.msg.assistant')].pop(); "


def last_reply(b):
    """(state, answer text, thought text, whether the thought is shown) of the last assistant message."""
    return b.js(LAST + "return m ? [m.dataset.state, m.querySelector('.answer').textContent, m.querySelector('.thought-text').textContent, "
                "!m.querySelector('.thought').hidden] : null")


def send(b, text):
    b.type("#prompt", text)
    b.type("#prompt", "\ue007")  # Enter sends
    return b.wait(LAST + "return m && m.dataset.state !== 'streaming' && m.dataset.state")


def run():
    try:
        b = Browser()
    except Exception as e:  # noqa: BLE001 (any failure to start the browser is this check's failure)
        check(False, "headless Chromium starts (chromium, chromedriver)", e)
        return
    try:
        test_chat(b)
        test_thought(b)
    finally:
        b.close()
    test_stop()


def test_chat(b):
    """Greedy answers typed into the page, a second turn, an error."""
    sv = Server("--parallel", "2")
    try:
        status, text = sv.http("GET", "/")
        check(status == 200 and "<script>" in text and "http://" not in text.replace("http://www.w3.org", "") and "https://" not in text and
              "src=" not in text, "GET / is one page with no external assets", status)
        c = http.client.HTTPConnection("127.0.0.1", sv.port, timeout=TIMEOUT)
        c.request("GET", "/")
        csp = c.getresponse().getheader("Content-Security-Policy") or ""
        c.close()
        check("default-src 'none'" in csp and "script-src 'sha256-" in csp and "unsafe" not in csp and "connect-src 'self'" in csp,
              "the page's policy runs its own script and style only (by hash)", csp)
        b.open(sv.url + "/")
        # the script ran and the style applied under that policy: their hashes are right
        check(b.wait("return document.getElementById('model').textContent") == MODEL_ID, "the page shows the model's name (from /v1/models)")
        check(b.js("return getComputedStyle(document.body).display") == "flex", "the page's style applies under its policy")
        client = sv.client()
        # greedy, thinking off: the streamed answer in the page equals the API's
        b.type("#temperature", "0")
        question = QUESTIONS[0]
        state = send(b, question)
        want = client.chat.completions.create(model=MODEL_ID, messages=[{"role": "user", "content": question}], temperature=0, reasoning_effort="none")
        got = last_reply(b)
        check(state == "done" and got[1] and got[1] == want.choices[0].message.content and not got[3],
              "the page's streamed answer equals the API's greedy answer (no thought shown)", (state, got, want.choices[0].message.content))
        # a second turn: the page sends the conversation so far
        question2 = QUESTIONS[1]
        state = send(b, question2)
        want2 = client.chat.completions.create(model=MODEL_ID, temperature=0, reasoning_effort="none", messages=[
            {"role": "user", "content": question}, {"role": "assistant", "content": want.choices[0].message.content},
            {"role": "user", "content": question2}])
        got = last_reply(b)
        check(state == "done" and got[1] == want2.choices[0].message.content, "a second turn carries the conversation (equals the API's)",
              (state, got[1], want2.choices[0].message.content))
        # an error is shown, not swallowed
        b.type("#max-tokens", "100000")
        state = send(b, question)
        got = last_reply(b)
        err = b.js(LAST + "return m.querySelector('.status').textContent")
        check(state == "error" and "context" in err, "a refused request shows the server's error in the page", (state, err))
    finally:
        check(sv.stop() == 0, "the page's server stops cleanly")


def test_thought(b):
    """A reply with a thought (scripted: the built-in model does not think) shows it apart from the
    answer, each equal to the API's reasoning_content and content."""
    d = tempfile.mkdtemp(prefix="g4-page-")
    path = os.path.join(d, "replies.json")
    with open(path, "w") as f:
        json.dump(["<|channel>thought\nThe user wants 2+2; that is 4.<channel|>It is 4."], f)
    sv = Server("--parallel", "1", "--test-replies", path)
    try:
        b.open(sv.url + "/")
        b.wait("return document.getElementById('model').textContent")
        b.click("#thinking")
        state = send(b, "What is 2+2?")
        got = last_reply(b)
        status, want = sv.http("POST", "/v1/chat/completions", {"model": MODEL_ID, "messages": [{"role": "user", "content": "What is 2+2?"}],
                                                                 "reasoning_effort": "high"})
        msg = want["choices"][0]["message"] if status == 200 else {}
        check(state == "done" and msg.get("reasoning_content") == "The user wants 2+2; that is 4." and got[2] == msg["reasoning_content"] and
              got[3] and got[1] == msg.get("content") == "It is 4.", "the thought is shown apart from the answer, each the API's", (state, got, msg))
    finally:
        sv.stop()
        shutil.rmtree(d)


def test_stop():
    """Stop aborts the stream; the server sees the client leave and cancels the request."""
    b = Browser()
    sv = Server("--parallel", "1", "--test-step-ms", "50", "--test-ignore-eos")
    try:
        b.open(sv.url + "/")
        b.wait("return document.getElementById('model').textContent")
        b.type("#max-tokens", "2000")
        b.type("#prompt", QUESTIONS[2])
        b.type("#prompt", "\ue007")
        started = b.wait(LAST + "return m && m.querySelector('.answer').textContent.length > 0")
        b.click("#stop")
        state = b.wait(LAST + "return m.dataset.state !== 'streaming' && m.dataset.state")
        check(started and state == "stopped", "Stop ends the reply in the page", state)
        deadline = time.time() + TIMEOUT
        while time.time() < deadline and sv.metrics().get("g4_requests_cancelled_total", 0) < 1:
            time.sleep(0.1)
        m = sv.metrics()
        check(m.get("g4_requests_cancelled_total") == 1 and m.get("g4_slots_active") == 0 and m.get("g4_generated_tokens_total", 0) < 2000,
              "the server cancels the stopped request and frees its slot", m)
    finally:
        b.close()
        sv.stop()
