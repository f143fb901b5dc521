"""The four clients of issue 36's acceptance against `g4 serve` with the built-in model
(models/gemma4-tiny-math), each asking for a Pydantic model the way its documentation shows:

  openai     client.chat.completions.parse(..., response_format=Pet)       (response_format json_schema, strict)
  langchain  ChatOpenAI(...).with_structured_output(Pet)  (default method)  (response_format json_schema, strict)
  instructor instructor.from_openai(client, mode=instructor.Mode.JSON)     (response_format json_object + the schema in a prompt)
  litellm    litellm.completion(model="openai/...", response_format=Pet)   (response_format json_schema)

Pet's fields are ones a grammar bounds (Literal, bool, int with ge/le, str with max_length), so a
constrained reply always ends well inside max_tokens. Sampled at temperature 1 over SEEDS seeds per
client. A client passes when every request of it returns a Pet that Python's jsonschema validates
against Pet's schema. The paths where the schema reaches the model only as prompt text (the server
enforces "a JSON object", not the schema) -- instructor Mode.JSON (its own system message) and
LangChain method="json_mode" (the caller's prompt: LangChain's PydanticOutputParser format
instructions) -- need a model that reads a schema: they run against a second server with the
built-in JSON model (models/gemma4-tiny-json, tools/train/task_json.py), the server treating them as
any other request, and must give a valid Pet every time too (the shipped JSON model: 97.6 % valid
greedy replies on held-out schemas; at temperature 1 about 87 of 100 seeds give a valid Pet, the rest
a JSON object with a kind outside the enum or a name over max_length: its MODEL_CARD.md; the SEEDS
seeds here are fixed, and g4's sampling gives the same bits on every kernel level, so the outcome is
the same on every machine). Prints one "client:" line per client (requests, successes, what failed and why)."""
import json
import os
import re
import signal
import subprocess
import sys
import time
from collections import Counter
from typing import Literal

import jsonschema
import pydantic

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
G4 = os.environ.get("G4_BIN") or os.path.join(ROOT, "build", "release", "g4")
MODEL = os.path.join(ROOT, "models", "gemma4-tiny-math")
MODEL_ID = "gemma4-tiny-math"
JSON_MODEL = os.path.join(ROOT, "models", "gemma4-tiny-json")  # for the schema-in-the-prompt paths
JSON_BASE = []  # its server's base URL
SEEDS = int(os.environ.get("CLIENT_SEEDS", "10"))
MAX_TOKENS = 500
PROMPT = "Describe a pet as JSON."


class OpenPet(pydantic.BaseModel):
    """Pydantic's default: its schema has no "additionalProperties": false, so any other property may follow (with a
    string of any length), and the grammar must let it."""
    kind: Literal["cat", "dog", "fish"]
    legs: int = pydantic.Field(ge=0, le=8)
    indoor: bool
    name: str = pydantic.Field(max_length=8)


class Pet(OpenPet):
    """The same fields and nothing else (extra="forbid": "additionalProperties": false), as the openai client's strict
    schema says anyway."""
    model_config = pydantic.ConfigDict(extra="forbid")


SCHEMA = Pet.model_json_schema()
failed = 0


def valid_pet(obj):
    """A Pet instance, or the dict a client returned, that Python's jsonschema validates against Pet's schema."""
    data = obj.model_dump() if isinstance(obj, pydantic.BaseModel) else obj
    try:
        jsonschema.Draft202012Validator(SCHEMA).validate(data)
        return True
    except jsonschema.ValidationError:
        return False


def start_server(model=MODEL):
    proc = subprocess.Popen([G4, "serve", "-m", model, "--port", "0", "--parallel", "2"], stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 120
    while time.time() < deadline:
        line = proc.stderr.readline()
        if not line:
            break
        m = re.search(r"on http://127\.0\.0\.1:(\d+) ", line)
        if m:
            return proc, "http://127.0.0.1:%s/v1" % m.group(1)
    proc.kill()
    raise RuntimeError("g4 serve did not start")


def report(name, how, outcomes, passed_if):
    """outcomes: one reason per request ("ok" for a valid Pet). Prints the client's line; counts a failure."""
    global failed
    c = Counter(outcomes)
    ok = c.pop("ok", 0)
    why = ", ".join("%d %s" % (n, r) for r, n in c.most_common()) or "none"
    good = passed_if(ok, outcomes)
    failed += not good
    print("client: %-10s %s: %d requests, %d valid Pet; other outcomes: %s -> %s" % (name, how, len(outcomes), ok, why,
                                                                                      "ok" if good else "FAIL"), flush=True)


def reason(e):
    """A short name for what a client raised."""
    text = str(e).splitlines()[0][:160] if str(e) else ""
    return "%s(%s)" % (type(e).__name__, text)


def run_openai(base):
    import openai
    client = openai.OpenAI(base_url=base, api_key="none", max_retries=0, timeout=120)
    out = []
    for seed in range(SEEDS):
        try:
            r = client.chat.completions.parse(model=MODEL_ID, messages=[{"role": "user", "content": PROMPT}], response_format=Pet,
                                              temperature=1, seed=seed, max_tokens=MAX_TOKENS)
            pet = r.choices[0].message.parsed
            out.append("ok" if isinstance(pet, Pet) and valid_pet(pet) else "not a valid Pet: %r" % r.choices[0].message.content)
        except Exception as e:  # noqa: BLE001 - every outcome is reported
            out.append(reason(e))
    report("openai", "chat.completions.parse(response_format=Pet)", out, lambda ok, o: ok == len(o))


def run_langchain(base):
    from langchain_openai import ChatOpenAI
    out = []
    for seed in range(SEEDS):
        try:
            llm = ChatOpenAI(model=MODEL_ID, base_url=base, api_key="none", temperature=1, seed=seed, max_tokens=MAX_TOKENS,
                             max_retries=0, timeout=120)
            pet = llm.with_structured_output(Pet).invoke(PROMPT)
            out.append("ok" if isinstance(pet, Pet) and valid_pet(pet) else "not a valid Pet: %r" % (pet,))
        except Exception as e:  # noqa: BLE001
            out.append(reason(e))
    report("langchain", "ChatOpenAI.with_structured_output(Pet) (default method)", out, lambda ok, o: ok == len(o))


def run_langchain_tools(base):
    """LangChain's other structured paths, each of which must give a Pet every time: method="function_calling" (a named
    tool_choice: the call's arguments are constrained to Pet's schema), and method="json_mode" (json_object, the schema only in
    the caller's prompt: LangChain's documentation says to put the format there, here PydanticOutputParser's
    get_format_instructions() after the request) against the JSON model's server."""
    from langchain_core.output_parsers import PydanticOutputParser
    from langchain_openai import ChatOpenAI
    json_prompt = PROMPT + "\n\n" + PydanticOutputParser(pydantic_object=Pet).get_format_instructions()
    for method, url, model_id, prompt in (("function_calling", base, MODEL_ID, PROMPT),
                                          ("json_mode", JSON_BASE[0], "gemma4-tiny-json", json_prompt)):
        out = []
        for seed in range(SEEDS):
            try:
                llm = ChatOpenAI(model=model_id, base_url=url, api_key="none", temperature=1, seed=seed, max_tokens=MAX_TOKENS,
                                 max_retries=0, timeout=120)
                pet = llm.with_structured_output(Pet, method=method).invoke(prompt)
                out.append("ok" if isinstance(pet, Pet) and valid_pet(pet) else "not a valid Pet: %r" % (pet,))
            except Exception as e:  # noqa: BLE001
                out.append(reason(e))
        report("langchain", "with_structured_output(Pet, method=%r)%s" % (method, " (gemma4-tiny-json)" if method == "json_mode" else ""),
               out, lambda ok, o: ok == len(o))


def run_instructor_modes(base):
    """instructor's other modes: Mode.TOOLS (its default: a named tool_choice, the call constrained) and Mode.JSON_SCHEMA
    (response_format json_schema) must give a Pet every time. OpenPet (Pydantic's default schema: any further property may
    follow) runs twice: on the math model, which knows nothing of JSON and may write further properties until max_tokens
    (reported only), and on the JSON model, which closes the object and must give a Pet every time."""
    import instructor
    import openai
    for mode, model, url, model_id in ((instructor.Mode.TOOLS, Pet, base, MODEL_ID), (instructor.Mode.JSON_SCHEMA, Pet, base, MODEL_ID),
                                       (instructor.Mode.JSON_SCHEMA, OpenPet, base, MODEL_ID),
                                       (instructor.Mode.JSON_SCHEMA, OpenPet, JSON_BASE[0], "gemma4-tiny-json")):
        client = instructor.from_openai(openai.OpenAI(base_url=url, api_key="none", max_retries=0, timeout=120), mode=mode)
        out = []
        for seed in range(SEEDS):
            try:
                pet = client.chat.completions.create(model=model_id, response_model=model, messages=[{"role": "user", "content": PROMPT}],
                                                     temperature=1, seed=seed, max_tokens=MAX_TOKENS, max_retries=0)
                out.append("ok" if valid_pet(pet) else "not a valid Pet")
            except Exception as e:  # noqa: BLE001
                out.append(reason(e))
        required = model is Pet or model_id != MODEL_ID
        report("instructor", "Mode.%s with %s%s" % (mode.name, model.__name__, "" if model_id == MODEL_ID else " (%s)" % model_id), out,
               (lambda ok, o: ok == len(o)) if required else (lambda ok, o: True))


def run_instructor(_base):
    """instructor Mode.JSON (json_object; Pet's schema in instructor's own system message) against the JSON model's server:
    every reply must be a valid Pet. On a failure, the server's reply to the same request is printed (instructor hides it):
    a JSON object, or its prefix when cut by max_tokens (what the server enforces), tells the model's miss from the server's."""
    import instructor
    import openai
    base = JSON_BASE[0]
    client = instructor.from_openai(openai.OpenAI(base_url=base, api_key="none", max_retries=0, timeout=120), mode=instructor.Mode.JSON)
    raw = openai.OpenAI(base_url=base, api_key="none", max_retries=0, timeout=120)
    out, json_ok = [], 0
    for seed in range(SEEDS):
        try:
            pet, completion = client.chat.completions.create_with_completion(
                model="gemma4-tiny-json", response_model=Pet, messages=[{"role": "user", "content": PROMPT}], temperature=1, seed=seed,
                max_tokens=MAX_TOKENS, max_retries=0)
            out.append("ok" if valid_pet(pet) else "not a valid Pet")
            json_ok += 1
        except Exception as e:  # noqa: BLE001
            # what the server sent for the same request (instructor hides it): a JSON object, or its prefix when cut
            r = raw.chat.completions.create(model="gemma4-tiny-json", messages=instructor_messages(), temperature=1, seed=seed,
                                            max_tokens=MAX_TOKENS, response_format={"type": "json_object"})
            text, finish = r.choices[0].message.content or "", r.choices[0].finish_reason
            print("info instructor Mode.JSON seed %d: %s %r" % (seed, finish, text[:100]), flush=True)
            if finish == "stop":
                try:
                    is_obj = isinstance(json.loads(text), dict)
                except ValueError:
                    is_obj = False
                json_ok += is_obj
                out.append("a JSON object, not a Pet" if is_obj else "NOT a JSON object: %r" % text[:80])
            else:
                json_ok += text.lstrip().startswith("{")
                out.append("cut by max_tokens (%s) inside the object" % finish if text.lstrip().startswith("{") else "NOT a JSON object's prefix")
    report("instructor", "Mode.JSON (json_object, the schema in its system prompt; gemma4-tiny-json)", out,
           lambda ok, o: ok == len(o) and json_ok == len(o))


_INSTRUCTOR_MESSAGES = []


def instructor_messages():
    """The messages instructor Mode.JSON sends for Pet (recorded from its own request by a hook below)."""
    return _INSTRUCTOR_MESSAGES[-1] if _INSTRUCTOR_MESSAGES else [{"role": "user", "content": PROMPT}]


def run_litellm(base):
    import litellm
    out = []
    for seed in range(SEEDS):
        try:
            r = litellm.completion(model="openai/" + MODEL_ID, api_base=base, api_key="none", messages=[{"role": "user", "content": PROMPT}],
                                   response_format=Pet, temperature=1, seed=seed, max_tokens=MAX_TOKENS, num_retries=0, timeout=120)
            content = r.choices[0].message.content
            pet = Pet.model_validate_json(content)
            out.append("ok" if valid_pet(pet) and valid_pet(json.loads(content)) else "not a valid Pet: %r" % content)
        except Exception as e:  # noqa: BLE001
            out.append(reason(e))
    report("litellm", "completion(response_format=Pet)", out, lambda ok, o: ok == len(o))


def record_instructor_messages():
    """Keeps the messages of each request instructor's client sends (its Mode.JSON prompt), through the openai client's
    request hook, so the raw request above is the same one."""
    import openai
    create = openai.resources.chat.completions.Completions.create

    def hooked(self, *a, **kw):
        if kw.get("response_format") == {"type": "json_object"} and "messages" in kw:
            _INSTRUCTOR_MESSAGES.append(list(kw["messages"]))
        return create(self, *a, **kw)
    openai.resources.chat.completions.Completions.create = hooked


SENT = []


def record_bodies():
    """Keeps the JSON body of every request the clients send (httpx underneath each of them), to print which request fields
    each one's path uses."""
    import httpx
    send = httpx.Client.send

    def hooked(self, request, *a, **kw):
        try:
            SENT.append(json.loads(request.content or b"{}"))
        except ValueError:
            pass
        return send(self, request, *a, **kw)
    httpx.Client.send = hooked


def fields_sent(body):
    """The request's fields but messages/model, with the constraint's shape: response_format's type, tool_choice, tools' keys."""
    out = []
    for k, v in sorted(body.items()):
        if k in ("messages", "model"):
            continue
        if k == "response_format":
            k += "=" + v.get("type", "?") + ("(strict)" if (v.get("json_schema") or {}).get("strict") else "")
        elif k == "tool_choice":
            k += "=" + (v if isinstance(v, str) else "named")
        elif k == "tools":
            k += "(" + ",".join(sorted(set(kk for t in v for kk in (t.get("function") or {})))) + ")"
        out.append(k)
    return " ".join(out)


def main():
    proc, base = start_server()
    jproc, jbase = start_server(JSON_MODEL)
    JSON_BASE.append(jbase)
    try:
        record_instructor_messages()
        record_bodies()
        for name, fn in (("openai", run_openai), ("langchain", run_langchain), ("instructor", run_instructor), ("litellm", run_litellm),
                         ("langchain-other", run_langchain_tools), ("instructor-other", run_instructor_modes)):
            if len(sys.argv) > 1 and name not in sys.argv[1:]:
                continue
            t, first = time.time(), len(SENT)
            fn(base)
            for shape in sorted(set(fields_sent(b) for b in SENT[first:])):
                print("info %s sent: %s" % (name, shape), flush=True)
            print("info %s took %.1f s" % (name, time.time() - t), flush=True)
    finally:
        for p in (proc, jproc):
            p.send_signal(signal.SIGTERM)
            p.wait(timeout=60)
    print("clients-test: %s" % ("every client passed" if not failed else "%d client(s) failed" % failed))
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
