"""Structured output through g4 serve (issue 36): the official openai client's
chat.completions.parse with a Pydantic model returns a parsed object; response_format json_object
and json_schema, llama.cpp's grammar / json_schema and vLLM's guided_* / structured_outputs give
text that Python's jsonschema validates (or the grammar's exact words), streamed or not, sampled
over several seeds; a schema the compiler refuses is a 400 naming the field; thinking on: the
answer after the thought follows the schema. test_serve.py's main() calls run()."""
import json
import os
from typing import List, Literal

import jsonschema
import openai
import pydantic

from serve_util import MODEL, MODEL_ID, Server, check, sse_events, raw_stream

PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 8},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "tags": {"type": "array", "items": {"enum": ["a", "b"]}, "maxItems": 2},
    },
    "required": ["name", "age", "tags"],
    "additionalProperties": False,
}


class Pet(pydantic.BaseModel):
    kind: Literal["cat", "dog", "fish"]
    legs: int = pydantic.Field(ge=0, le=8)
    names: List[Literal["Rex", "Tom"]] = pydantic.Field(max_length=2)


def valid(schema, text):
    try:
        jsonschema.Draft202012Validator(schema, format_checker=jsonschema.Draft202012Validator.FORMAT_CHECKER).validate(json.loads(text))
        return True
    except (ValueError, jsonschema.ValidationError):
        return False


def chat(sv, extra, stream=False, seed=1, max_tokens=400, thinking=False):
    body = {"model": MODEL_ID, "messages": [{"role": "user", "content": "Answer in JSON."}], "max_tokens": max_tokens,
            "temperature": 1, "seed": seed, **extra}
    if thinking:
        body["chat_template_kwargs"] = {"enable_thinking": True}
    if not stream:
        status, r = sv.http("POST", "/v1/chat/completions", body)
        if status != 200:
            return status, r, None
        return status, r["choices"][0]["message"]["content"], r["choices"][0]["finish_reason"]
    body["stream"] = True
    c, resp, status = raw_stream(sv.port, body)
    events = [json.loads(d) for d in sse_events(resp) if d != "[DONE]"]
    c.close()
    text = "".join((e["choices"][0]["delta"].get("content") or "") for e in events if e.get("choices"))
    finish = [e["choices"][0]["finish_reason"] for e in events if e.get("choices") and e["choices"][0]["finish_reason"]]
    return status, text, finish[-1] if finish else None


def test_schema_fields(sv):
    """Every field that carries a JSON schema, sampled over seeds, streamed and not: each reply
    that stops (not cut by max_tokens) validates."""
    forms = [
        {"response_format": {"type": "json_schema", "json_schema": {"name": "person", "strict": True, "schema": PERSON}}},
        {"json_schema": PERSON},
        {"guided_json": PERSON},
        {"structured_outputs": {"json": PERSON}},
    ]
    done = total = 0
    for k, form in enumerate(forms):
        for seed in range(1, 6):
            status, text, finish = chat(sv, form, stream=seed % 2 == 0, seed=seed)
            total += 1
            check(status == 200, "form %d seed %d: status %d" % (k, seed, status), text)
            if finish == "stop":
                done += 1
                check(valid(PERSON, text), "form %d seed %d: the reply validates" % (k, seed), text)
    check(done >= total // 2, "%d of %d constrained replies stopped within max_tokens" % (done, total))


def test_json_object_and_grammars(sv):
    status, text, finish = chat(sv, {"response_format": {"type": "json_object"}}, seed=3)
    check(status == 200 and (finish != "stop" or isinstance(json.loads(text), dict)), "json_object", text)
    status, text, _ = chat(sv, {"grammar": 'root ::= "yes" | "no"'})
    check(status == 200 and text in ("yes", "no"), "grammar yes|no", text)
    status, text, _ = chat(sv, {"guided_choice": ["red", "green"]}, stream=True)
    check(status == 200 and text in ("red", "green"), "guided_choice (streamed)", text)
    status, r = sv.http("POST", "/v1/completions", {"model": MODEL_ID, "prompt": "Code:", "max_tokens": 20, "guided_regex": "[A-Z]{3}-[0-9]{2}"})
    text = r["choices"][0]["text"] if status == 200 else r
    check(status == 200 and len(text) == 6 and text[:3].isupper() and text[3] == "-" and text[4:].isdigit(), "completions guided_regex", text)


def test_refusals(sv):
    cases = [
        ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "strin"}}}},
         "response_format.json_schema.schema"),
        ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "object", "unevaluatedProperties": False}}}},
         "response_format.json_schema.schema"),
        ({"grammar": "root ::= undefined_rule"}, "grammar"),
        ({"guided_regex": "a(b"}, "guided_regex"),
        ({"grammar": 'root ::= "a"', "guided_json": {}}, "guided_json"),
    ]
    for extra, param in cases:
        status, r, _ = chat(sv, extra)
        err = r.get("error", {}) if isinstance(r, dict) else {}
        check(status == 400 and err.get("param") == param and err.get("message"), "refusal naming %s" % param, r)


def test_openai_parse(sv):
    """The official client's parse() with a Pydantic model: a parsed Pet for every seed that stops."""
    client = sv.client()
    parse = getattr(client.chat.completions, "parse", None) or client.beta.chat.completions.parse
    parsed = 0
    for seed in range(1, 7):
        try:
            r = parse(model=MODEL_ID, messages=[{"role": "user", "content": "A pet?"}], response_format=Pet, max_tokens=300, temperature=1,
                      seed=seed)
        except openai.LengthFinishReasonError:
            continue
        pet = r.choices[0].message.parsed
        check(isinstance(pet, Pet) and valid(Pet.model_json_schema(), r.choices[0].message.content), "parse() seed %d" % seed,
              r.choices[0].message.content)
        parsed += 1
    check(parsed >= 3, "openai parse(): %d of 6 seeds gave a Pet within 300 tokens" % parsed)


def test_thinking(sv):
    """Thinking on: the reply (its thought left out of content) still validates."""
    for seed in (1, 2):
        status, text, finish = chat(sv, {"json_schema": PERSON}, seed=seed, thinking=True, max_tokens=600)
        check(status == 200 and (finish != "stop" or valid(PERSON, text)), "thinking seed %d" % seed, text)


WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "The weather in a city.", "parameters": {
    "type": "object", "properties": {"city": {"type": "string", "maxLength": 12}, "days": {"type": "integer", "minimum": 1, "maximum": 7},
                                     "unit": {"enum": ["c", "f"]}}, "required": ["city", "unit"]}}}
ADD = {"type": "function", "function": {"name": "add", "description": "Adds numbers.", "parameters": {
    "type": "object", "properties": {"a": {"type": "integer", "minimum": -99, "maximum": 99}, "b": {"type": "number"},
                                     "more": {"type": "array", "items": {"type": "boolean"}, "maxItems": 3},
                                     "note": {"anyOf": [{"type": "null"}, {"type": "string", "maxLength": 6}]}},
    "required": ["a", "b"], "additionalProperties": False}}}


def test_tool_calls(sv):
    """tool_choice required or a named function, sampled at temperature 1 (streamed and not): every reply is a call of a
    declared function (the named one) whose arguments parse and validate by jsonschema against its parameters."""
    tools = [WEATHER, ADD]
    schemas = {t["function"]["name"]: t["function"]["parameters"] for t in tools}
    choices = ["required", {"type": "function", "function": {"name": "add"}}, {"type": "function", "function": {"name": "get_weather"}}]
    calls = valid_calls = 0
    for k, choice in enumerate(choices):
        for seed in range(1, 11):
            body = {"model": MODEL_ID, "messages": [{"role": "user", "content": "Weather in Paris, or 2+3?"}], "tools": tools,
                    "tool_choice": choice, "temperature": 1, "seed": seed, "max_tokens": 300}
            stream = seed % 3 == 0
            if stream:
                body["stream"] = True
                c, resp, status = raw_stream(sv.port, body)
                events = [json.loads(d) for d in sse_events(resp) if d != "[DONE]"]
                c.close()
                deltas = [tc for e in events if e.get("choices") for tc in (e["choices"][0]["delta"].get("tool_calls") or [])]
                got = {}
                for d in deltas:
                    g = got.setdefault(d["index"], {"name": "", "arguments": ""})
                    g["name"] += (d.get("function") or {}).get("name") or ""
                    g["arguments"] += (d.get("function") or {}).get("arguments") or ""
                tcs = [got[i] for i in sorted(got)]
                finish = [e["choices"][0]["finish_reason"] for e in events if e.get("choices") and e["choices"][0]["finish_reason"]]
                finish = finish[-1] if finish else None
            else:
                status, r = sv.http("POST", "/v1/chat/completions", body)
                finish = r["choices"][0]["finish_reason"] if status == 200 else None
                tcs = [tc["function"] for tc in (r["choices"][0]["message"].get("tool_calls") or [])] if status == 200 else []
            calls += 1
            want = choice["function"]["name"] if isinstance(choice, dict) else None
            ok = status == 200 and finish == "tool_calls" and len(tcs) == 1 and tcs[0]["name"] in schemas and want in (None, tcs[0]["name"])
            if ok:
                try:
                    jsonschema.Draft202012Validator(schemas[tcs[0]["name"]]).validate(json.loads(tcs[0]["arguments"]))
                except (ValueError, jsonschema.ValidationError) as e:
                    ok = False
                    tcs.append(str(e))
            valid_calls += ok
            check(ok, "tool_choice %d seed %d%s: one call of a declared function, its arguments valid" % (k, seed, " (streamed)" if stream else ""),
                  (status, finish, tcs))
    print("info tool calls: %d of %d sampled calls valid" % (valid_calls, calls))
    # what the compiler cannot enforce is refused, naming the tool; a name tools lack, naming tool_choice
    bad = {"type": "function", "function": {"name": "odd", "parameters": {"type": "object", "properties": {"x": {"type": "integer", "multipleOf": 2}}}}}
    for extra, param in (({"tools": [WEATHER, bad], "tool_choice": "required"}, "tools[1].function.parameters"),
                         ({"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "add"}}}, "tool_choice")):
        status, r = sv.http("POST", "/v1/chat/completions", {"model": MODEL_ID, "messages": [{"role": "user", "content": "x"}], **extra})
        check(status == 400 and r.get("error", {}).get("param") == param, "a tool_choice the grammar cannot take: 400 naming %s" % param, r)
    # tool_choice auto is not constrained: the same schema that is refused above is fine there
    status, r = sv.http("POST", "/v1/chat/completions", {"model": MODEL_ID, "messages": [{"role": "user", "content": "x"}], "tools": [bad],
                                                         "max_tokens": 5})
    check(status == 200, "tool_choice auto with a schema the compiler refuses: 200 (nothing to enforce)", r)


def test_strict_tools_auto(sv):
    """tool_choice auto with a function marked strict: every call the model writes keeps to its schema. The built-in model
    answers in arithmetic unless pushed, so a logit_bias on <|tool_call> makes it call (again and again, until max_tokens):
    each complete call is a declared function with arguments jsonschema validates."""
    strict = {"type": "function", "function": dict(WEATHER["function"], strict=True,
                                                   parameters=dict(WEATHER["function"]["parameters"], additionalProperties=False))}
    with open(os.path.join(MODEL, "tokenizer.json"), encoding="utf-8") as f:
        open_id = [t["id"] for t in json.load(f)["added_tokens"] if t["content"] == "<|tool_call>"][0]
    schema = strict["function"]["parameters"]
    n_calls = 0
    for seed in range(1, 6):
        body = {"model": MODEL_ID, "messages": [{"role": "user", "content": "Weather in Paris?"}], "tools": [strict], "temperature": 1,
                "seed": seed, "max_tokens": 120, "logit_bias": {str(open_id): 100}}
        status, r = sv.http("POST", "/v1/chat/completions", body)
        tcs = r["choices"][0]["message"].get("tool_calls") or [] if status == 200 else []
        ok = status == 200 and len(tcs) >= 1
        for tc in tcs:
            try:
                ok = ok and tc["function"]["name"] == "get_weather"
                jsonschema.Draft202012Validator(schema).validate(json.loads(tc["function"]["arguments"]))
            except (ValueError, jsonschema.ValidationError):
                ok = False
        n_calls += len(tcs)
        check(ok, "strict tool, tool_choice auto, seed %d: %d calls, each valid" % (seed, len(tcs)), r)
    print("info strict tools under tool_choice auto: %d calls over 5 replies" % n_calls)
    # unpushed, the model answers in text: still a 200
    status, r = sv.http("POST", "/v1/chat/completions", {"model": MODEL_ID, "messages": [{"role": "user", "content": "2+2?"}], "tools": [strict],
                                                         "max_tokens": 30})
    check(status == 200 and r["choices"][0]["message"]["content"], "strict tool, tool_choice auto: a text answer", r)


def run():
    sv = Server("--parallel", "2")
    try:
        test_schema_fields(sv)
        test_json_object_and_grammars(sv)
        test_refusals(sv)
        test_openai_parse(sv)
        test_thinking(sv)
        test_tool_calls(sv)
        test_strict_tools_auto(sv)
    finally:
        sv.stop()
    print("ok structured output: schema fields, json_object, grammars, refusals, openai parse(), thinking, tool calls")
