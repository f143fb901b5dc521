"""Images in Model.chat() and Conversation (issue 35), through the public C API
(g4_image_soft_tokens, g4_conversation_add_media), over a checkpoint with a vision tower
(tests/media_model.py: tiny-mobile with the cut tokenizer). The reference is the command line: the
greedy reply's tokens for an image given as a path, as the file's bytes and as a uint8 array of its decoded
pixels (transformers' PIL decode, tests/fixtures/vision/goldens.safetensors) equals
`g4 run --image FILE -p TEXT --temp 0`'s; bad parts raise with the part and file named."""

from __future__ import annotations

import json
import struct
import sys

import pytest

import g4

from conftest import ROOT, run_cli

sys.path.insert(0, str(ROOT / "tests"))
from media_model import AUDIO, AUDIO_TOWER, VISION, media_model  # noqa: E402

TEXT = "What is in the image?"
N = 8


@pytest.fixture(scope="module")
def mm(tmp_path_factory):
    d = media_model(str(tmp_path_factory.mktemp("media")))
    m = g4.Model(d)
    yield d, m
    m.close()


def cli(model_dir: str, image: str, *extra: str, flag: str = "--image", folder: str = VISION) -> list:
    """`g4 run --image`'s (or --audio's) greedy generated ids (--verbose)."""
    err = run_cli("run", "-m", model_dir, flag, f"{folder}/{image}", "-p", TEXT, "-n", str(N), "--temp", "0", "--verbose", *extra).stderr
    line = [x for x in err.splitlines() if x.startswith("g4: generated ids:")][0]
    return [int(t) for t in line.split(":", 2)[2].split()]


def user(*parts):
    return [{"role": "user", "content": list(parts)}]


def test_image_path_and_bytes(mm):
    d, m = mm
    want = cli(d, "rgb.png")
    got = m.chat(user({"type": "image", "image": f"{VISION}/rgb.png"}, TEXT), temperature=0, max_tokens=N)
    assert got.tokens == want
    with open(f"{VISION}/photo.jpg", "rb") as f:
        data = f.read()
    got = m.chat(user({"type": "image", "image": data, "max_soft_tokens": 70}, {"type": "text", "text": TEXT}), temperature=0, max_tokens=N)
    assert got.tokens == cli(d, "photo.jpg", "--image-tokens", "70")


def test_image_array(mm):
    np = pytest.importorskip("numpy")
    d, m = mm
    with open(f"{VISION}/goldens.safetensors", "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        t = header["img0.rgb"]  # rgb.png decoded by PIL
        f.seek(8 + n + t["data_offsets"][0])
        pixels = np.frombuffer(f.read(t["data_offsets"][1] - t["data_offsets"][0]), dtype=np.uint8).reshape(t["shape"])
    got = m.chat(user({"type": "image", "image": pixels}, TEXT), temperature=0, max_tokens=N)
    assert got.tokens == cli(d, "rgb.png")
    with pytest.raises(g4.InputError, match=r"message 0: part 0: an image array must be uint8"):
        m.chat(user({"type": "image", "image": pixels.astype(np.float32)}, TEXT))


def test_conversation_image(mm):
    d, m = mm
    with m.conversation(temperature=0, max_tokens=N) as c:
        r = c.send([{"type": "image", "image": f"{VISION}/rgb.png"}, TEXT])
    assert r.tokens == cli(d, "rgb.png")


def test_refusals(mm, tmp_path):
    d, m = mm
    with pytest.raises(g4.InputError, match=r"message 0: part 0: .*none\.png: No such file"):
        m.chat(user({"type": "image", "image": str(tmp_path / "none.png")}, TEXT))
    with pytest.raises(g4.InputError, match=r"message 0: part 0: "):
        m.chat(user({"type": "image", "image": b"not an image"}, TEXT))
    with pytest.raises(g4.OptionError, match="max_soft_tokens must be one of"):
        m.chat(user({"type": "image", "image": f"{VISION}/rgb.png", "max_soft_tokens": 100}, TEXT))
    with pytest.raises(g4.InputError, match="unknown part type 'video'"):
        m.chat(user({"type": "video"}, TEXT))
    with pytest.raises(g4.InputError, match="user messages only"):
        m.chat([{"role": "user", "content": "hi"}, {"role": "assistant", "content": [{"type": "image", "image": b"x"}]}])
    text_model = g4.Model(ROOT / "models" / "gemma4-tiny-math")
    try:
        with pytest.raises(g4.InputError, match=r"rgb\.png\): .*no vision_config"):
            text_model.chat(user({"type": "image", "image": f"{VISION}/rgb.png"}, TEXT))
    finally:
        text_model.close()


@pytest.fixture(scope="module")
def am(tmp_path_factory):
    d = media_model(str(tmp_path_factory.mktemp("audio")), AUDIO_TOWER, "audio")
    m = g4.Model(d)
    yield d, m
    m.close()


def wav_samples(path: str):
    """A float WAV's samples (n, channels) and rate, read by hand (RIFF chunks)."""
    np = pytest.importorskip("numpy")
    with open(path, "rb") as f:
        b = f.read()
    at, fmt, data = 12, None, None
    while at + 8 <= len(b):
        tag, size = b[at:at + 4], struct.unpack("<I", b[at + 4:at + 8])[0]
        if tag == b"fmt ":
            fmt = struct.unpack("<HHIIHH", b[at + 8:at + 24])
        elif tag == b"data":
            data = b[at + 8:at + 8 + size]
        at += 8 + size + (size & 1)
    assert fmt and fmt[5] == 32 and data is not None
    return np.frombuffer(data, dtype="<f4").reshape(-1, fmt[1]).astype(np.float32), fmt[2]


def test_audio(am, tmp_path):
    d, m = am
    want = cli(d, "s16_16k_mono.wav", flag="--audio", folder=AUDIO)
    got = m.chat(user({"type": "audio", "audio": f"{AUDIO}/s16_16k_mono.wav"}, TEXT), temperature=0, max_tokens=N)
    assert got.tokens == want
    with open(f"{AUDIO}/s16_16k_mono.wav", "rb") as f:
        got = m.chat(user({"type": "audio", "audio": f.read()}, TEXT), temperature=0, max_tokens=N)
    assert got.tokens == want
    samples, rate = wav_samples(f"{AUDIO}/f32_22k_3ch.wav")
    got = m.chat(user({"type": "audio", "audio": samples, "sample_rate": rate}, TEXT), temperature=0, max_tokens=N)
    assert got.tokens == cli(d, "f32_22k_3ch.wav", flag="--audio", folder=AUDIO)
    with pytest.raises(g4.InputError, match="needs 'sample_rate'"):
        m.chat(user({"type": "audio", "audio": samples}, TEXT))
    with pytest.raises(g4.InputError, match=r"message 0: part 0 \(.*rgb\.png\): "):
        m.chat(user({"type": "audio", "audio": f"{VISION}/rgb.png"}, TEXT))
