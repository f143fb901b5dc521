"""A checkpoint folder with a vision tower for the front-end tests (issue 35): the tiny-mobile
fixture's weights and config (linked) with the built-in model's tokenizer cut to tiny-mobile's
512 ids (the ids below 506 and the merges among them) and the six media markers at 506..511, as
tests/test_media_cli.c writes it. Standard library only: tests/serve and python/tests import it."""
import json
import os

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
MARKERS = ["<|image>", "<|image|>", "<image|>", "<|audio>", "<|audio|>", "<audio|>"]
VOCAB = 512
FIRST_MARKER = VOCAB - len(MARKERS)
IMAGE_SOFT = FIRST_MARKER + 1  # <|image|>, the soft-token placeholder
VISION = os.path.join(ROOT, "tests", "fixtures", "vision")
AUDIO = os.path.join(ROOT, "tests", "fixtures", "audio")
AUDIO_TOWER = os.path.join(AUDIO, "tower")
AUDIO_SOFT = FIRST_MARKER + 4  # <|audio|>


def shared_dir():
    return os.environ.get("G4_SHARED") or os.path.join(ROOT, "..", "shared")


def media_model(tmp, fixture=None, name="tiny-mobile"):
    """The folder, made under tmp, of fixture's weights (default tiny-mobile; its audio tower is one
    g4 does not take: tests/fixtures/audio/tower, gen_audio_tower.py's variant of it, has one)."""
    d = os.path.join(tmp, name)
    os.mkdir(d)
    fixture = os.path.realpath(fixture or os.path.join(shared_dir(), "fixtures", "tiny-mobile"))
    for f in ("config.json", "model.safetensors"):
        os.symlink(os.path.join(fixture, f), os.path.join(d, f))
    with open(os.path.join(ROOT, "models", "gemma4-tiny-math", "tokenizer.json"), encoding="utf-8") as f:
        t = json.load(f)
    vocab = {k: v for k, v in t["model"]["vocab"].items() if v < FIRST_MARKER}
    t["model"]["merges"] = [m for m in t["model"]["merges"] if m[0] in vocab and m[1] in vocab and m[0] + m[1] in vocab]
    for k, name in enumerate(MARKERS):
        vocab[name] = FIRST_MARKER + k
        t["added_tokens"].append({"id": FIRST_MARKER + k, "content": name, "single_word": False, "lstrip": False, "rstrip": False,
                                  "normalized": False, "special": True})
    t["model"]["vocab"] = vocab
    with open(os.path.join(d, "tokenizer.json"), "w", encoding="utf-8") as f:
        json.dump(t, f)
    return d
