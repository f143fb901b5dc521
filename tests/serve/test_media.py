"""g4 serve with images in the messages (issue 35), over the tiny-mobile fixture (its vision tower)
with the built-in model's tokenizer cut to its 512 ids and the media markers added (tests/media_model.py). The reference is the command line: a greedy image request's reply
(the openai client, raw HTTP, streaming) equals `g4 run --image FILE -p TEXT --temp 0`'s; the
prompt cache never reuses positions past a different image; every malformed part is a 400 naming
its field. Run by test_serve.py's main (run())."""
import base64
import os
import shutil
import subprocess
import sys
import tempfile

import serve_util
from serve_util import G4, ROOT, TIMEOUT, Server, check, is_error_shape

sys.path.insert(0, os.path.join(ROOT, "tests"))
from media_model import AUDIO, AUDIO_TOWER, IMAGE_SOFT, VISION, media_model  # noqa: E402

TEXT = "What is in the image?"
N = 8


def data_url(name, mime="image/png"):
    with open(os.path.join(VISION, name), "rb") as f:
        return "data:%s;base64,%s" % (mime, base64.b64encode(f.read()).decode())


def image_message(url, text=TEXT, **extra):
    part = {"type": "image_url", "image_url": {"url": url}}
    part["image_url"].update(extra)
    return [{"role": "user", "content": [part, {"type": "text", "text": text}]}]


def cli_answer(model, image, extra=()):
    """`g4 run --image`'s greedy answer and its prompt ids."""
    out = subprocess.run([G4, "run", "-m", model, "--image", os.path.join(VISION, image), "-p", TEXT, "-n", str(N), "--temp", "0", "--verbose"] +
                         list(extra), capture_output=True, text=True, timeout=TIMEOUT)
    if out.returncode != 0:
        raise RuntimeError("g4 run --image failed: " + out.stderr)
    line = [x for x in out.stderr.splitlines() if x.startswith("g4: prompt ids:")][0]
    ids = [int(x) for x in line.split(":", 2)[2].split()]
    text = out.stdout[:-1] if out.stdout.endswith("\n") else out.stdout
    return text, ids


def test_greedy(sv, model):
    c = sv.client()
    for image, mime in (("rgb.png", "image/png"), ("photo.jpg", "image/jpeg")):
        want, ids = cli_answer(model, image)
        r = c.chat.completions.create(model=sv_model_id(sv), messages=image_message(data_url(image, mime)), temperature=0, max_tokens=N)
        got = r.choices[0].message.content
        check(got == want, "an image request (%s, openai client) answers as g4 run --image" % image, "%r != %r" % (got, want))
        check(r.usage.prompt_tokens == len(ids), "its prompt_tokens count the soft tokens (%d)" % len(ids), r.usage)
        chunks = c.chat.completions.create(model=sv_model_id(sv), messages=image_message(data_url(image, mime)), temperature=0, max_tokens=N,
                                           stream=True)
        streamed = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
        check(streamed == want, "the same request streamed (%s)" % image, "%r != %r" % (streamed, want))
    # raw HTTP, detail "low": the 70-token budget, as g4 run --image-tokens 70
    want, ids = cli_answer(model, "photo.jpg", ["--image-tokens", "70"])
    status, body = sv.http("POST", "/v1/chat/completions", {"messages": image_message(data_url("photo.jpg", "image/jpeg"), detail="low"),
                                                            "temperature": 0, "max_tokens": N})
    got = body["choices"][0]["message"]["content"] if status == 200 else body
    check(status == 200 and got == want and body["usage"]["prompt_tokens"] == len(ids),
          "raw HTTP, detail \"low\": g4 run --image-tokens 70's answer (%d soft tokens)" % ids.count(IMAGE_SOFT), got)


def sv_model_id(sv):
    return "tiny-mobile"


def cached(sv, url):
    status, body = sv.http("POST", "/v1/chat/completions", {"messages": image_message(url), "temperature": 0, "max_tokens": 2})
    if status != 200:
        return -1
    return (body["usage"].get("prompt_tokens_details") or {}).get("cached_tokens", 0)


def test_cache(sv, model):
    _, ids = cli_answer(model, "rgb.png")
    before = ids.index(IMAGE_SOFT)  # the positions before the image's first soft token
    x, y = data_url("rgb.png"), data_url("palette.png")
    cached(sv, x)
    same = cached(sv, x)
    other = cached(sv, y)
    check(same > before, "the same image again reuses the cache past its soft tokens (%d > %d)" % (same, before), same)
    check(0 <= other <= before, "a different image reuses nothing past the text before it (%d <= %d)" % (other, before), other)


def expect_400(sv, messages, param, what, contains=None):
    status, body = sv.http("POST", "/v1/chat/completions", {"messages": messages, "max_tokens": 2})
    ok = status == 400 and is_error_shape(body, 400, param=param)
    if ok and contains:
        ok = contains in body["error"]["message"]
    check(ok, "400 naming %s: %s" % (param, what), (status, body))


def test_refusals(sv, tmp):
    p = "messages[0].content[0]"
    good = data_url("rgb.png")
    expect_400(sv, image_message("data:image/png;base64,@@@@"), p + ".image_url.url", "bad base64", "not valid base64")
    expect_400(sv, image_message("https://example.com/cat.png"), p + ".image_url.url", "a remote URL", "only data: URLs")
    expect_400(sv, image_message("data:text/plain;base64,aGVsbG8="), p + ".image_url.url", "not an image data URL")
    with open(os.path.join(VISION, "rgb.png"), "rb") as f:
        png = f.read()
    cut = "data:image/png;base64," + base64.b64encode(png[:len(png) // 2]).decode()
    expect_400(sv, image_message(cut), p + ".image_url.url", "a cut PNG")
    expect_400(sv, image_message("data:image/png;base64," + base64.b64encode(b"not an image").decode()), p + ".image_url.url", "bytes of no image")
    expect_400(sv, image_message(good, detail="ultra"), p + ".image_url.detail", "an unknown detail")
    expect_400(sv, [{"role": "user", "content": [{"type": "video_url", "video_url": {"url": good}}]}], p, "an unknown part type")
    expect_400(sv, [{"role": "user", "content": [{"type": "image_url", "image_url": "x"}]}], p + ".image_url", "image_url not an object")
    wav = base64.b64encode(b"RIFF....WAVE").decode()
    expect_400(sv, [{"role": "user", "content": [{"type": "input_audio", "input_audio": {"data": wav, "format": "mp3"}}]}],
               p + ".input_audio.format", "an audio format other than wav")
    expect_400(sv, [{"role": "user", "content": [{"type": "input_audio", "input_audio": {"data": wav, "format": "wav"}}]}],
               p + ".input_audio.data", "a cut WAV")
    with open(os.path.join(AUDIO, "s16_16k_mono.wav"), "rb") as f:
        good_wav = base64.b64encode(f.read()).decode()
    expect_400(sv, [{"role": "user", "content": [{"type": "input_audio", "input_audio": {"data": good_wav, "format": "wav"}}]}],
               p + ".input_audio.data", "a model whose audio tower g4 does not take (tiny-mobile's)", "subsampling_conv_channels")
    expect_400(sv, [{"role": "user", "content": "hi"}, {"role": "assistant", "content": [{"type": "image_url", "image_url": {"url": good}}]}],
               "messages[1].content[0]", "an image in an assistant message")
    three = [{"type": "image_url", "image_url": {"url": good}}] * 3
    expect_400(sv, [{"role": "user", "content": three}], "messages[0].content[2]", "more parts than --max-media 2", "at most 2")


def test_audio(tmp):
    """input_audio parts (with an image between two recordings) answer as g4 run --audio --image --audio."""
    model = media_model(tmp, AUDIO_TOWER, "audio")
    files = ["s16_16k_mono.wav", "rgb.png", "u8_8k_mono.wav"]
    out = subprocess.run([G4, "run", "-m", model, "--audio", os.path.join(AUDIO, files[0]), "--image", os.path.join(VISION, files[1]), "--audio",
                          os.path.join(AUDIO, files[2]), "-p", TEXT, "-n", str(N), "--temp", "0"], capture_output=True, text=True, timeout=TIMEOUT)
    want = out.stdout[:-1] if out.stdout.endswith("\n") else out.stdout

    def audio(name):
        with open(os.path.join(AUDIO, name), "rb") as f:
            return {"type": "input_audio", "input_audio": {"data": base64.b64encode(f.read()).decode(), "format": "wav"}}

    parts = [audio(files[0]), {"type": "image_url", "image_url": {"url": data_url(files[1])}}, audio(files[2]), {"type": "text", "text": TEXT}]
    sv = Server("-m", model, "--ctx", "2048", "--parallel", "1")
    try:
        r = sv.client().chat.completions.create(model="audio", messages=[{"role": "user", "content": parts}], temperature=0, max_tokens=N)
        got = r.choices[0].message.content
        check(out.returncode == 0 and got == want, "audio, image, audio parts answer as g4 run --audio --image --audio", "%r != %r" % (got, want))
    finally:
        check(sv.stop() == 0, "the audio server stops cleanly")


def test_text_model(tmp):
    """A model without a vision tower: the image part is a 400 naming it."""
    sv = Server("--ctx", "512", "--parallel", "1")
    try:
        expect_400(sv, image_message(data_url("rgb.png")), "messages[0].content[0].image_url.url", "a model without a vision tower",
                   "no vision_config")
    finally:
        check(sv.stop() == 0, "the text-only server stops cleanly")


def run():
    tmp = tempfile.mkdtemp(prefix="g4-serve-media-")
    try:
        model = media_model(tmp)
        sv = Server("-m", model, "--alias", "tiny-mobile", "--ctx", "2048", "--parallel", "2", "--max-media", "2")
        try:
            test_greedy(sv, model)
            test_cache(sv, model)
            test_refusals(sv, tmp)
        finally:
            check(sv.stop() == 0, "the media server stops cleanly", "".join(sv.log[-5:]))
        test_audio(tmp)
        test_text_model(tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    run()
    print("serve: %d passed, %d failed, %d skipped" % (serve_util.passed, serve_util.failed, serve_util.skipped))
