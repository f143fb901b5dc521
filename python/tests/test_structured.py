"""Structured output from Python: chat(response_format=..., json_schema=..., grammar=...) on the
built-in model, sampled over seeds; every reply that stops parses and keeps to its schema (checked
by hand here: the venv has no jsonschema), a grammar gives exactly its words, and what g4 cannot
enforce raises InputError naming the argument."""

from __future__ import annotations

import json

import pytest

import g4

SCHEMA = {
    "type": "object",
    "properties": {"kind": {"enum": ["cat", "dog"]}, "legs": {"type": "integer", "minimum": 0, "maximum": 8}},
    "required": ["kind", "legs"],
    "additionalProperties": False,
}


def keeps_schema(text: str) -> bool:
    v = json.loads(text)
    return (isinstance(v, dict) and set(v) == {"kind", "legs"} and v["kind"] in ("cat", "dog") and isinstance(v["legs"], int)
            and not isinstance(v["legs"], bool) and 0 <= v["legs"] <= 8)


@pytest.fixture(scope="module")
def model() -> g4.Model:
    from conftest import MODEL

    m = g4.Model(MODEL)
    yield m
    m.close()


MSGS = [{"role": "user", "content": "A pet as JSON?"}]


@pytest.mark.parametrize("how", ["response_format", "json_schema", "json_schema_str"])
def test_schema_forms(model: g4.Model, how: str) -> None:
    kw = {"response_format": {"type": "json_schema", "json_schema": {"name": "pet", "schema": SCHEMA}}, "json_schema": SCHEMA,
          "json_schema_str": None}[how]
    args = {"json_schema": json.dumps(SCHEMA)} if how == "json_schema_str" else {how: kw}
    stopped = 0
    for seed in range(1, 7):
        r = model.chat(MSGS, max_tokens=300, temperature=1, seed=seed, **args)
        if r.finish_reason == "eos":
            stopped += 1
            assert keeps_schema(r.content), r.content
    assert stopped >= 3, f"{stopped} of 6 replies stopped within 300 tokens"


def test_json_object_and_grammar(model: g4.Model) -> None:
    r = model.chat(MSGS, max_tokens=300, temperature=1, seed=2, response_format={"type": "json_object"})
    assert r.finish_reason != "eos" or isinstance(json.loads(r.content), dict)
    for seed in range(1, 4):
        r = model.chat(MSGS, temperature=1, seed=seed, grammar='root ::= "yes" | "no"')
        assert r.content in ("yes", "no") and r.finish_reason == "eos"
    chunks = list(model.chat(MSGS, seed=1, grammar='root ::= [a-c]{3}', stream=True))
    assert len("".join(c.content for c in chunks)) == 3


def test_refusals(model: g4.Model) -> None:
    with pytest.raises(g4.InputError, match="json_schema: .*unevaluatedProperties"):
        model.chat(MSGS, json_schema={"type": "object", "unevaluatedProperties": False})
    with pytest.raises(g4.InputError, match="grammar: "):
        model.chat(MSGS, grammar="root ::= nowhere")
    with pytest.raises(g4.InputError, match="give one constraint"):
        model.chat(MSGS, grammar='root ::= "a"', json_schema=SCHEMA)
    with pytest.raises(g4.InputError, match="response_format"):
        model.chat(MSGS, response_format={"type": "xml"})


def test_generate_and_complete(model: g4.Model) -> None:
    """generate() and complete() take the same constraint arguments as chat(), streamed or not."""
    stopped = 0
    for seed in range(1, 5):
        c = model.complete("A pet as JSON?", max_tokens=300, temperature=1, seed=seed, json_schema=SCHEMA)
        if c.finish_reason == "eos":
            stopped += 1
            assert keeps_schema(c.text), c.text
    assert stopped >= 2, f"{stopped} of 4 replies stopped within 300 tokens"
    for seed in range(1, 4):
        assert model.generate("Yes or no?", temperature=1, seed=seed, grammar='root ::= "yes" | "no"') in ("yes", "no")
    assert len("".join(model.generate("Letters?", seed=1, grammar="root ::= [a-c]{3}", stream=True))) == 3
    text = model.generate([2, 105, 300], max_tokens=300, temperature=1, seed=3, response_format={"type": "json_object"})
    assert text.startswith("{")
    with pytest.raises(g4.InputError, match="give one constraint"):
        model.generate("x", grammar='root ::= "a"', json_schema=SCHEMA)
