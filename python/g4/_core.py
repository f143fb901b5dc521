"""The Python API over libg4's public C API (_capi): models, tokenizer, generation, chat."""

from __future__ import annotations

import array
import atexit
import ctypes
import os
import queue
import struct
import threading
import warnings
import zlib
from contextlib import contextmanager
from ctypes import POINTER, byref, c_char_p, c_float, c_int, c_int32, c_size_t, c_void_p
from dataclasses import dataclass, field
from typing import (
    Any,
    overload,
    Callable,
    Dict,
    Generic,
    Iterator,
    List,
    Mapping,
    Optional,
    Sequence,
    Tuple,
    TypeVar,
    Union,
)

from typing import Literal

from . import _capi as C
from ._capi import lib

PathLike = Union[str, "os.PathLike[str]"]
Message = Union[Mapping[str, Any], Tuple[str, str]]

# ---- errors and warnings ----


class Error(Exception):
    """A failure of the engine; str(e) is g4's one-line message."""


class LoadError(Error):
    """A model folder or its tokenizer could not be loaded (missing, unreadable, not a Gemma 4 checkpoint)."""


class OptionError(Error, ValueError):
    """An engine option or a generation setting was refused; the message names it and what it takes."""


class InputError(Error, ValueError):
    """A prompt, a message or a token id was refused (unknown role, invalid UTF-8, an id outside the
    vocabulary, a tool message that answers no call)."""


class ContextError(Error):
    """The prompt does not fit the context that is left (the engine option ctx sets its length)."""


class GenerationError(Error):
    """Generation failed for another reason: invalid sampling parameters, or the model's output turned
    non-finite (NaN or infinite logits: a checkpoint whose weights overflow float)."""


class G4Warning(UserWarning):
    """A warning of the engine: a checkpoint oddity, an option with no effect, a bad environment variable."""


# The engine's warnings (g4_set_log) may come from any thread, in the middle of a call; they are
# queued and issued with warnings.warn once the call is back in Python, in the calling thread, so
# that warning filters apply as usual (an "error" filter raises where the call was made).
_pending_warnings: "queue.SimpleQueue[str]" = queue.SimpleQueue()


def _on_log(user: Any, level: int, message: bytes) -> None:
    _pending_warnings.put(message.decode("utf-8", "replace"))


_log_fn = C.LOG_FN(_on_log)
lib.g4_set_log(_log_fn, None)


@atexit.register
def _log_to_stderr() -> None:
    # the library may still warn after the interpreter is gone (its own atexit): write to stderr
    lib.g4_set_log(C.LOG_FN(("g4_log_stderr", lib)), None)


def _flush_warnings(stacklevel: int = 3) -> None:
    while True:
        try:
            msg = _pending_warnings.get_nowait()
        except queue.Empty:
            return
        warnings.warn(msg, G4Warning, stacklevel=stacklevel)


E = TypeVar("E", bound="Error")


def _fail(cls: "type[E]", prefix: str = "") -> E:
    """The calling thread's last g4 error as an exception of class cls."""
    return cls(prefix + C.last_error())


# ---- the process-wide thread pool ----


class _Gate:
    """Generations share it; g4_set_threads (which g4.h allows only while no session computes) waits
    until none runs and holds new ones back meanwhile."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._computing = 0
        self._resizing = False

    @contextmanager
    def compute(self) -> Iterator[None]:
        with self._cond:
            while self._resizing:
                self._cond.wait()
            self._computing += 1
        try:
            yield
        finally:
            with self._cond:
                self._computing -= 1
                self._cond.notify_all()

    @contextmanager
    def exclusive(self) -> Iterator[None]:
        with self._cond:
            while self._resizing or self._computing:
                self._cond.wait()
            self._resizing = True
        try:
            yield
        finally:
            with self._cond:
                self._resizing = False
                self._cond.notify_all()


_gate = _Gate()


def set_threads(n: Optional[int]) -> None:
    """Sets the size of the engine's process-wide matmul thread pool (the calling thread included;
    None or n <= 0: one per online CPU). Waits for generations running in other threads to finish."""
    n = 0 if n is None else _int_arg("threads", n, -(2**31), 2**31 - 1)
    with _gate.exclusive():
        lib.g4_set_threads(n)


def threads() -> int:
    """The size of the engine's thread pool in effect."""
    return int(lib.g4_threads())


# ---- engine options ----


@dataclass(frozen=True)
class OptionInfo:
    """One row of the engine options table (what `g4 help` lists)."""

    name: str  #: the keyword argument of Model ("pmp_scales")
    flag: str  #: the command line's flag ("--pmp-scales")
    values: str  #: the values it takes, in words
    default: str  #: its default, as text
    help: str  #: what it does
    kind: str  #: "result" (changes what is computed), "run" (only how it runs) or "preset"


def options() -> List[OptionInfo]:
    """Every engine option Model takes as a keyword argument, in the table's order."""
    kinds = {C.OPTION_RESULT: "result", C.OPTION_RUN: "run", C.OPTION_PRESET: "preset"}
    out = []
    for i in range(lib.g4_option_count()):
        r = lib.g4_option_at(i).contents
        name = r.name.decode()
        if r.choices:
            choices, j = [], 0
            while r.choices[j].name:
                choices.append(r.choices[j].name.decode())
                j += 1
            values = "|".join(choices)
        else:
            values = (r.values or b"").decode()
        out.append(
            OptionInfo(
                name=name,
                flag="--" + name.replace("_", "-"),
                values=values,
                default=(getattr(r, "def") or b"").decode(),
                help=(r.help or b"").decode(),
                kind=kinds.get(r.kind, str(r.kind)),
            )
        )
    return out


def _option_text(value: Any) -> str:
    """A Python value as the text an engine option takes."""
    if isinstance(value, bool):
        return "on" if value else "off"
    if isinstance(value, float):
        return repr(value)
    if isinstance(value, (list, tuple)):
        return ",".join(_option_text(v) for v in value)
    return str(value)


def _engine_options(kwargs: Mapping[str, Any]) -> C.Options:
    o = C.Options()
    lib.g4_options_default(byref(o))
    for name, value in kwargs.items():
        if value is None:
            continue  # the default
        if lib.g4_options_set(byref(o), name.encode(), _option_text(value).encode()) != 0:
            raise _fail(OptionError)
    return o


def _int_arg(name: str, value: Any, lo: int, hi: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise OptionError(f"{name} {value!r}: expected an integer")
    if not lo <= value <= hi:
        raise OptionError(f"{name} {value}: expected an integer in [{lo}, {hi}]")
    return value


def _float_arg(name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise OptionError(f"{name} {value!r}: expected a number")
    return float(value)


# ---- results ----

_STOP_NAMES = {C.STOP_EOS: "eos", C.STOP_BUDGET: "budget", C.STOP_CONTEXT: "context", C.STOP_USER: "user", C.STOP_ERROR: "error"}


def _c_string(what: str, text: str) -> bytes:
    """text as the NUL-terminated UTF-8 the C API takes. Text holding a NUL is refused: the engine
    would stop reading at it and silently drop the rest (g4.Model.tokenize takes lengths and keeps it)."""
    at = text.find("\0")
    if at >= 0:
        raise InputError(f"{what}: a NUL character (U+0000) at offset {at}; g4 reads text up to a NUL, so it is refused")
    return text.encode("utf-8", "surrogatepass")


@dataclass(frozen=True)
class Completion:
    """A finished generate(): its text and how it ended."""

    text: str  #: the generated text (thoughts left out, a stop string and what followed it cut off)
    tokens: List[int]  #: the generated token ids, a stop id included
    finish_reason: str  #: "eos" (a stop id), "budget" (max_tokens), "context" (the KV cache is full), "stop" (a stop string), "user" (the stream was closed)
    prompt_tokens: int  #: tokens fed as the prompt
    prefill_s: float  #: the engine's time from the prompt's first token to the first generated one
    decode_s: float  #: the engine's time from then to the last


@dataclass(frozen=True)
class ToolCall:
    """A complete tool call of a reply: "<|tool_call>call:NAME{ARGS}<tool_call|>"."""

    name: str  #: NAME; "" when the call is not of the form call:NAME{...}
    arguments: str  #: "{ARGS}" in Gemma's syntax (key:value, strings in <|"|>), or the call's whole text


@dataclass(frozen=True)
class ParsedReply:
    """A reply's text split into its parts (parse_reply)."""

    content: str  #: the answer, trimmed, its thoughts and tool calls left out
    reasoning: str  #: the thoughts, trimmed ("" without any)
    tool_calls: List[ToolCall]  #: the complete tool calls, in order
    truncated_in_thought: bool  #: the text ended inside a thought (no answer yet)
    tool_call_unclosed: bool  #: the text ended inside a tool call (which is in no list)


@dataclass(frozen=True)
class ChatReply:
    """A model's reply to a chat, split as the chat template's parser splits it."""

    content: str  #: the answer, trimmed, its thoughts and tool calls left out
    reasoning: str  #: the thoughts, trimmed ("" without any)
    tool_calls: List[ToolCall]  #: the complete tool calls, in order
    text: str  #: the reply as the model wrote it, markers included
    message: Dict[str, str]  #: the reply as the conversation keeps it: append it to the messages for the next turn
    tokens: List[int]  #: the generated token ids, a stop id included
    finish_reason: str  #: "eos", "budget", "context" or "user" (see Completion)
    prompt_tokens: int
    prefill_s: float
    decode_s: float
    truncated_in_thought: bool = False  #: the reply ended inside a thought (no answer yet)


@dataclass(frozen=True)
class ChatDelta:
    """The text one generated token made final, split by where it is in the reply."""

    content: str = ""  #: answer text
    reasoning: str = ""  #: thought text (markers and the "thought" header left out)
    tool_call: str = ""  #: tool-call text, markers included


# ---- streaming ----

T = TypeVar("T")
R = TypeVar("R")


class _Done:
    def __init__(self, value: Any) -> None:
        self.value = value


class _Failed:
    def __init__(self, exc: BaseException) -> None:
        self.exc = exc


class Stream(Generic[T, R]):
    """Deltas of a generation that runs in a thread of its own while they are read.

    Iterate it for the deltas; `result` is the finished generation's (a Completion or a ChatReply)
    once the iteration is over. close() (or leaving a `with` block, or dropping the stream) stops
    the generation at its next step (its next token, or between two chunks of a long prompt)."""

    def __init__(self, job: Callable[[Callable[[T], None], threading.Event], R]) -> None:
        self._queue: "queue.SimpleQueue[Any]" = queue.SimpleQueue()
        self._cancel = threading.Event()
        self._result: Optional[R] = None
        self._error: Optional[BaseException] = None
        self._finished = False
        q, cancel = self._queue, self._cancel  # the thread holds these, not the stream (which can be dropped)

        def work() -> None:
            try:
                q.put(_Done(job(q.put, cancel)))
            except BaseException as e:  # handed to the reader
                q.put(_Failed(e))

        self._thread = threading.Thread(target=work, name="g4-stream")
        self._thread.start()

    def __iter__(self) -> "Stream[T, R]":
        return self

    def __next__(self) -> T:
        if self._finished:
            raise StopIteration
        item = self._queue.get()
        if isinstance(item, _Done):
            self._finished = True
            self._result = item.value
            self._thread.join()
            raise StopIteration
        if isinstance(item, _Failed):
            self._finished = True
            self._error = item.exc
            self._thread.join()
            raise item.exc
        delta: T = item
        return delta

    @property
    def result(self) -> R:
        """The finished generation; reads the rest of the stream first if need be."""
        for _ in self:
            pass
        if self._error is not None:
            raise self._error
        assert self._result is not None
        return self._result

    def close(self) -> None:
        """Stops the generation (finish_reason "user") and waits for its thread. A failure of the
        generation is not raised here (result raises it)."""
        self._cancel.set()
        try:
            for _ in self:
                pass
        except Exception:
            pass

    def __enter__(self) -> "Stream[T, R]":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __del__(self) -> None:
        self._cancel.set()  # the thread ends on its own at its next token


class _MainWorker:
    """The thread that runs the main thread's generations (see _run): one, kept between calls (a
    daemon: it only ever computes while the main thread waits for it)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._jobs: "queue.SimpleQueue[Any]" = queue.SimpleQueue()
        self._thread: Optional[threading.Thread] = None

    def submit(self, fn: Callable[[], None]) -> None:
        with self._lock:
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._loop, name="g4-main-worker", daemon=True)
                self._thread.start()
        self._jobs.put(fn)

    def _loop(self) -> None:
        while True:
            self._jobs.get()()


_main_worker = _MainWorker()


def _run(job: Callable[[Any, Optional[threading.Event]], R]) -> R:
    """Runs a generation and returns what it gives.

    The engine calls back into Python for each token, and Python runs signal handlers (Ctrl-C's
    KeyboardInterrupt) in the main thread wherever it is, the first instruction of a callback
    included, where no `try` can catch them and ctypes would only print them. So in the main thread
    the generation runs in a worker thread while this one waits: an exception here stops it at its
    next step (a token, or a prompt chunk: g4_generate_params.cancel) and is raised once it has stopped. In other threads (where no signal handler runs)
    it runs in place."""
    if threading.current_thread() is not threading.main_thread():
        return job(None, None)
    box: Dict[str, Any] = {}
    done = threading.Event()
    cancel = threading.Event()

    def work() -> None:
        try:
            box["value"] = job(None, cancel)
        except BaseException as e:  # raised below, in the caller's thread
            box["error"] = e
        finally:
            done.set()

    _main_worker.submit(work)
    try:
        done.wait()
    except BaseException:
        cancel.set()
        while not done.is_set():
            try:
                done.wait()
            except BaseException:  # a second Ctrl-C: the generation stops at its next token all the same
                pass
        raise
    if "error" in box:
        raise box["error"]
    value: R = box["value"]
    return value


# ---- the engine's reply loop ----


class _Reply:
    """One g4_conversation_reply: the callback that sees each delta, and what the reply left."""

    def __init__(self, on_spans: Callable[[int, str, str, str], bool], cancel: Optional[threading.Event]) -> None:
        self.on_spans = on_spans
        self.cancel = cancel
        self.exc: Optional[BaseException] = None
        self.stopped = False  # a stop string ended the reply (the library's reply reader matched it)
        self.fn = C.REPLY_FN(self._delta)

    def _delta(self, user: Any, addr: int) -> int:
        try:
            d = C.ReplyDelta.from_address(addr)
            self.stopped = self.stopped or d.stop_string >= 0
            n = d.n_spans
            if n == 1 and d.spans[0].span == C.SPAN_ANSWER:  # most tokens
                sp = d.spans[0]
                stop = self.on_spans(d.token, ctypes.string_at(sp.text, sp.len).decode("utf-8", "replace"), "", "")
            else:
                answer: List[str] = []
                thought: List[str] = []
                tool: List[str] = []
                for i in range(n):
                    sp = d.spans[i]
                    t = C.text(sp.text, sp.len)
                    (thought if sp.span == C.SPAN_THOUGHT else tool if sp.span == C.SPAN_TOOL_CALL else answer).append(t)
                stop = self.on_spans(d.token, "".join(answer), "".join(thought), "".join(tool))
            return 1 if stop or (self.cancel is not None and self.cancel.is_set()) else 0
        except BaseException as e:  # stop there; raised after the call
            self.exc = e
            return 1


@dataclass
class _Turn:
    """What one reply gave."""

    result: C.GenerateResult
    tokens: List[int]
    conv: int  # the conversation, still open
    keep: Any = None  # what must outlive it (the tools' declarations)
    stopped: bool = False  # a stop string ended it


class _Session:
    """A g4_session of a model (one sequence, a KV cache of ctx tokens), leased to one thread at a time."""

    def __init__(self, model: "Model") -> None:
        self.drafter = None
        self.draft_tokens = model._draft_tokens
        self.handle = lib.g4_session_new(model._m, byref(model._opts))
        if not self.handle:
            raise _fail(Error, f"{model.path}: cannot open a session: ")
        if model._d:
            self.drafter = lib.g4_drafter_new(model._d, self.handle)
            if not self.drafter:
                err = _fail(Error, f"{model.path}: cannot open a session: ")
                self.free()
                raise err

    def free(self) -> None:
        if self.drafter:
            lib.g4_drafter_free(self.drafter)
            self.drafter = None
        if self.handle:
            lib.g4_session_free(self.handle)
            self.handle = None


# A media part of a message: (kind, the file's bytes, soft-token budget (0: the model's), its name in errors).
_Media = Tuple[int, bytes, int, str]
_Msg = Tuple[int, bytes, List[_Media]]
_IMAGE_BUDGETS = (70, 140, 280, 560, 1120)


def _png(a: Any, what: str) -> bytes:
    """A uint8 HxWx3 array as a PNG file (lossless: the C API takes image files)."""
    if getattr(a, "dtype", None) is None or str(a.dtype) != "uint8" or a.ndim != 3 or a.shape[2] != 3 or not a.shape[0] or not a.shape[1]:
        raise InputError(f"{what}: an image array must be uint8 of shape (H, W, 3), not {getattr(a, 'dtype', '?')} {getattr(a, 'shape', '?')}")
    h, w = int(a.shape[0]), int(a.shape[1])
    rows = a.tobytes(order="C")
    raw = b"".join(b"\x00" + rows[y * w * 3:(y + 1) * w * 3] for y in range(h))

    def chunk(tag: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + tag + data + struct.pack(">I", zlib.crc32(tag + data) & 0xFFFFFFFF)

    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 8, 2, 0, 0, 0)) + chunk(b"IDAT", zlib.compress(raw)) + chunk(b"IEND", b"")


def _image_part(part: Mapping[str, Any], what: str) -> _Media:
    """{"type": "image", "image": a path, the file's bytes or a uint8 HxWx3 array[, "max_soft_tokens": N]}."""
    v = part.get("image")
    budget = part.get("max_soft_tokens") or 0
    if budget and budget not in _IMAGE_BUDGETS:
        raise OptionError(f"{what}: max_soft_tokens must be one of 70, 140, 280, 560, 1120, not {budget!r}")
    if isinstance(v, (str, os.PathLike)):
        try:
            with open(v, "rb") as f:
                return (C.MEDIA_IMAGE, f.read(), budget, f"{what} ({os.fspath(v)})")
        except OSError as e:
            raise InputError(f"{what}: {os.fspath(v)}: {e.strerror}") from None
    if isinstance(v, (bytes, bytearray, memoryview)):
        return (C.MEDIA_IMAGE, bytes(v), budget, what)
    if hasattr(v, "dtype") and hasattr(v, "shape"):
        return (C.MEDIA_IMAGE, _png(v, what), budget, what)
    raise InputError(f"{what}: 'image' must be a path, the file's bytes or a uint8 (H, W, 3) array, not {type(v).__name__}")


def _wav(a: Any, rate: Any, what: str) -> bytes:
    """A float32 array of samples ((n,) mono or (n, channels)) as a 32-bit float WAV file."""
    if str(getattr(a, "dtype", "")) != "float32" or a.ndim not in (1, 2) or not a.size:
        raise InputError(f"{what}: an audio array must be float32 of shape (n,) or (n, channels), not {getattr(a, 'dtype', '?')} {getattr(a, 'shape', '?')}")
    if not isinstance(rate, int) or isinstance(rate, bool) or not 1 <= rate <= 1_000_000:
        raise InputError(f"{what}: an audio array needs 'sample_rate', an integer in [1, 1000000], not {rate!r}")
    ch = 1 if a.ndim == 1 else int(a.shape[1])
    data = a.astype("<f4").tobytes(order="C")
    fmt = struct.pack("<HHIIHH", 3, ch, rate, rate * ch * 4, ch * 4, 32)
    return b"RIFF" + struct.pack("<I", 4 + 8 + len(fmt) + 8 + len(data)) + b"WAVEfmt " + struct.pack("<I", len(fmt)) + fmt + b"data" + struct.pack("<I", len(data)) + data


def _audio_part(part: Mapping[str, Any], what: str) -> _Media:
    """{"type": "audio", "audio": a path, a WAV file's bytes or a float32 array with "sample_rate"}."""
    v = part.get("audio")
    if isinstance(v, (str, os.PathLike)):
        try:
            with open(v, "rb") as f:
                return (C.MEDIA_AUDIO, f.read(), 0, f"{what} ({os.fspath(v)})")
        except OSError as e:
            raise InputError(f"{what}: {os.fspath(v)}: {e.strerror}") from None
    if isinstance(v, (bytes, bytearray, memoryview)):
        return (C.MEDIA_AUDIO, bytes(v), 0, what)
    if hasattr(v, "dtype") and hasattr(v, "shape"):
        return (C.MEDIA_AUDIO, _wav(v, part.get("sample_rate"), what), 0, what)
    raise InputError(f"{what}: 'audio' must be a path, a WAV file's bytes or a float32 array, not {type(v).__name__}")


def _content_from(i: int, content: Any) -> Tuple[str, List[_Media]]:
    """A message's content: a string, or a list of parts (strings, {"type": "text", "text": ...},
    {"type": "image", ...}); the media parts go before the text, in order, as the template puts them."""
    if content is None:
        return "", []
    if isinstance(content, str):
        return content, []
    if not isinstance(content, (list, tuple)):
        raise InputError(f"message {i}: the content must be a string or a list of parts, not {type(content).__name__}")
    text: List[str] = []
    media: List[_Media] = []
    for k, part in enumerate(content):
        what = f"message {i}: part {k}"
        if isinstance(part, str):
            text.append(part)
        elif not isinstance(part, Mapping):
            raise InputError(f"{what}: expected a string or a mapping with a type")
        elif part.get("type") == "text":
            if not isinstance(part.get("text"), str):
                raise InputError(f"{what}: a text part needs a 'text' string")
            text.append(part["text"])
        elif part.get("type") == "image":
            media.append(_image_part(part, what))
        elif part.get("type") == "audio":
            media.append(_audio_part(part, what))
        else:
            raise InputError(f"{what}: unknown part type {part.get('type')!r} (text, image, audio)")
    return "".join(t.strip() for t in text), media


def _messages_from(messages: Sequence[Message]) -> List[_Msg]:
    out: List[_Msg] = []
    for i, m in enumerate(messages):
        if isinstance(m, Mapping):
            role, content = m.get("role"), m.get("content")
            if m.get("tool_calls"):
                raise InputError(
                    f"message {i}: tool_calls are not taken apart from the text: a model message holds the reply's "
                    "text as the model wrote it, its calls included (ChatReply.message)"
                )
        elif isinstance(m, (tuple, list)) and len(m) == 2:
            role, content = m
        else:
            raise InputError(f"message {i}: expected a mapping with role and content, or a (role, content) pair")
        if not isinstance(role, str):
            raise InputError(f"message {i}: the role must be a string, not {type(role).__name__}")
        text, media = _content_from(i, content)
        r = c_int()
        if lib.g4_chat_role_parse(role.encode(), byref(r)) != 0:
            raise _fail(InputError, f"message {i}: ")
        if media and r.value != C.CHAT_USER:
            raise InputError(f"message {i}: images and audio are taken in user messages only")
        out.append((r.value, _c_string(f"message {i}: content", text), media))
    return out


def _schema_text(name: str, schema: Any) -> bytes:
    """A JSON schema given as a dict, a JSON string or a Pydantic model class, as JSON bytes."""
    if hasattr(schema, "model_json_schema"):
        schema = schema.model_json_schema()
    if isinstance(schema, str):
        return _c_string(name, schema)
    if isinstance(schema, (dict, bool)):
        import json

        return json.dumps(schema).encode()
    raise InputError(f"{name}: expected a JSON schema (a dict, a JSON string or a Pydantic model class)")


def _constraint_of(response_format: Any, json_schema: Any, grammar: Optional[str]) -> Optional[Tuple[int, bytes, str]]:
    """(kind, text, the argument's name) of the one constraint asked for, or None."""
    asked: List[Tuple[int, bytes, str]] = []
    if response_format is not None:
        if hasattr(response_format, "model_json_schema"):
            asked.append((C.CONSTRAINT_JSON_SCHEMA, _schema_text("response_format", response_format), "response_format"))
        elif not isinstance(response_format, dict) or not isinstance(response_format.get("type"), str):
            raise InputError('response_format: expected {"type": "text" | "json_object" | "json_schema", ...} or a Pydantic model class')
        elif response_format["type"] == "json_object":
            asked.append((C.CONSTRAINT_JSON_OBJECT, b"", "response_format"))
        elif response_format["type"] == "json_schema":
            js = response_format.get("json_schema")
            if not isinstance(js, dict) or "schema" not in js:
                raise InputError('response_format: json_schema needs {"json_schema": {"name": ..., "schema": {...}}}')
            asked.append((C.CONSTRAINT_JSON_SCHEMA, _schema_text("response_format", js["schema"]), "response_format"))
        elif response_format["type"] != "text":
            raise InputError(f"response_format: type {response_format['type']!r}: expected text, json_object or json_schema")
    if json_schema is not None:
        asked.append((C.CONSTRAINT_JSON_SCHEMA, _schema_text("json_schema", json_schema), "json_schema"))
    if grammar is not None:
        if not isinstance(grammar, str) or not grammar:
            raise InputError("grammar: expected a GBNF grammar (a non-empty string)")
        asked.append((C.CONSTRAINT_GBNF, _c_string("grammar", grammar), "grammar"))
    if len(asked) > 1:
        raise InputError(f"{asked[0][2]} and {asked[1][2]}: give one constraint")
    return asked[0] if asked else None


class _Settings:
    """The keyword arguments of one generation, checked and turned into g4_conversation_options."""

    def __init__(
        self,
        max_tokens: Optional[int] = None,
        temperature: Optional[float] = None,
        top_k: Optional[int] = None,
        top_p: Optional[float] = None,
        min_p: Optional[float] = None,
        repeat_penalty: Optional[float] = None,
        repeat_last_n: Optional[int] = None,
        seed: Optional[int] = None,
        thinking: bool = False,
        tools: Optional[Sequence[str]] = None,
        frequency_penalty: Optional[float] = None,
        presence_penalty: Optional[float] = None,
        logit_bias: Optional[Dict[int, float]] = None,
        response_format: Optional[Any] = None,
        json_schema: Optional[Any] = None,
        grammar: Optional[str] = None,
    ) -> None:
        self.constraint = _constraint_of(response_format, json_schema, grammar)
        self.max_tokens = None if max_tokens is None else _int_arg("max_tokens", max_tokens, 1, 2**31 - 1)
        self.sampling: Dict[str, Any] = {}
        for name, v in (("temperature", temperature), ("top_p", top_p), ("min_p", min_p), ("repeat_penalty", repeat_penalty)):
            if v is not None:
                self.sampling[name] = _float_arg(name, v)
        for name, v in (("top_k", top_k), ("repeat_last_n", repeat_last_n)):
            if v is not None:
                self.sampling[name] = _int_arg(name, v, 0, 2**31 - 1)
        if seed is not None:
            self.sampling["seed"] = _int_arg("seed", seed, 0, 2**64 - 1)
        # OpenAI's penalties, in their range [-2, 2], and logit_bias {token id: bias in [-100, 100]}
        for name, v in (("frequency_penalty", frequency_penalty), ("presence_penalty", presence_penalty)):
            if v is not None:
                x = _float_arg(name, v)
                if not -2 <= x <= 2:
                    raise OptionError(f"{name} {v}: expected a number in [-2, 2]")
                self.sampling[name] = x
        self.bias: List[Tuple[int, float]] = []
        if logit_bias is not None:
            if not isinstance(logit_bias, dict):
                raise OptionError("logit_bias: expected a dict of token ids to biases in [-100, 100]")
            for k, b in logit_bias.items():
                x = _float_arg("logit_bias", b)
                if not -100 <= x <= 100:
                    raise OptionError(f"logit_bias of token {k}: {b}: expected a number in [-100, 100]")
                self.bias.append((_int_arg("logit_bias", k, 0, 2**31 - 1), x))
        self.thinking = bool(thinking)
        if tools is None:
            tools = []
        if isinstance(tools, (str, bytes)) or not all(isinstance(t, str) for t in tools):
            raise InputError(
                'tools: expected a list of declarations in Gemma\'s syntax ("declaration:NAME{description:<|"|>...<|"|>,'
                'parameters:{...}}"), as strings'
            )
        self.tools = [_c_string(f"tools[{i}]", t) for i, t in enumerate(tools)]

    def conversation_options(self, session: "_Session") -> Tuple[C.ConversationOptions, Any]:
        """The options, and what must outlive the conversation (the tools' array)."""
        co = C.ConversationOptions()
        if lib.g4_conversation_default_options(session.handle, byref(co)) != 0:
            raise _fail(Error)
        co.gen.draft = session.drafter
        co.gen.draft_tokens = session.draft_tokens
        co.gen.cancel = _CANCEL_ADDRESS
        co.chat.thinking = int(self.thinking)
        keep = None
        if self.tools:
            keep = (c_char_p * len(self.tools))(*self.tools)
            co.chat.tools = ctypes.cast(keep, POINTER(c_char_p))
            co.chat.n_tools = len(self.tools)
        if self.max_tokens is not None:
            co.gen.max_tokens = self.max_tokens
        # the arguments given, laid over the model's defaults by the library's merge (as the CLI's flags and the server's fields)
        given, mask = C.Sampling(), 0
        for name, v in self.sampling.items():
            setattr(given, name, v)
            mask |= C.SAMPLE_BITS[name]
        if self.bias:
            # borrowed by the conversation (each reply's sampler copies them): kept with the tools
            ids = (c_int32 * len(self.bias))(*(i for i, _ in self.bias))
            values = (c_float * len(self.bias))(*(b for _, b in self.bias))
            given.bias_ids = ctypes.cast(ids, POINTER(c_int32))
            given.bias_values = ctypes.cast(values, POINTER(c_float))
            given.n_bias = len(self.bias)
            mask |= C.SAMPLE_BITS["bias"]
            keep = (keep, ids, values)
        lib.g4_sampling_override(byref(co.gen.sampling), byref(given), mask)
        return co, keep


class Model:
    """A Gemma 4 checkpoint loaded with its tokenizer.

    g4.Model(path, **engine_options) loads the folder (config.json, model.safetensors,
    tokenizer.json) with the engine options the command line takes as flags, under their names:
    act="fake", kv="f32", ctx=2048, threads=2, weights="mapped", pmp_scales=(0.04, 0.0025), ...
    (g4.options() lists them; True/False stand for on/off). threads sets the process-wide pool
    (g4.set_threads).

    A model may be used from several threads at once: each generation runs in a session of its own
    (a KV cache of ctx tokens, kept for the next generation of the model), and sessions compute in
    parallel, each giving what it gives alone. Close it with close() or a `with` block.

    draft=DIR loads a Gemma 4 MTP drafter (a gemma4_assistant folder made for this model) for
    speculative decoding: greedy generations give exactly the text they give without it, sampled
    ones the same distribution (g4 run --draft); draft_tokens=K drafts per round (1-16, default 3).
    """

    def __init__(self, path: PathLike, draft: Optional[PathLike] = None, draft_tokens: Optional[int] = None, **engine_options: Any) -> None:
        self._m: Optional[int] = None
        self._d: Optional[int] = None
        if draft_tokens is not None and draft is None:
            raise OptionError("draft_tokens needs draft=DIR")
        self._draft_tokens = 0 if draft_tokens is None else _int_arg("draft_tokens", draft_tokens, 1, 16)
        self._tok: Optional[int] = None
        self._idle: List[_Session] = []
        self._busy = 0
        self._cond = threading.Condition()
        self._closed = False
        self.path: str = os.fspath(path)
        self._opts = _engine_options(engine_options)
        bpath = os.fsencode(self.path)
        self._grammars: Optional[int] = None  # g4_grammar_cache, made by the first constrained reply
        # the folder's model, tokenizer.json and drafter in one call (g4_checkpoint_open, as the command line opens them);
        # g4_model_load_options sets the pool's size first when threads is given; loading runs pool jobs
        ck = C.Checkpoint()
        with _gate.exclusive() if self._opts.threads else _gate.compute():
            rc = lib.g4_checkpoint_open(byref(ck), bpath, byref(self._opts), None if draft is None else os.fsencode(os.fspath(draft)))
        if rc != 0:
            _flush_warnings()
            raise _fail(LoadError)
        self._m, self._tok, self._d = ck.model, ck.tok, ck.draft  # close() frees them
        # one session now: what would fail (the KV cache's memory) fails here, and the first call is ready
        try:
            self._idle.append(_Session(self))
        except Error:
            self.close()
            raise
        finally:
            _flush_warnings()
        form = c_int()
        self.chat_form: str = "26b" if lib.g4_model_chat_form(self._m, byref(form)) == 0 and form.value == C.CHAT_FORM_26B else "e2b"

    # ---- what the model is ----

    @property
    def vocab_size(self) -> int:
        """The model's vocabulary size (its embedding rows)."""
        return int(lib.g4_model_vocab_size(self._handle()))

    @property
    def bos_id(self) -> int:
        return int(lib.g4_model_bos_id(self._handle()))

    @property
    def stop_ids(self) -> Tuple[int, ...]:
        """The ids that end a generation (generation_config.json / config.json eos)."""
        p = POINTER(c_int)()
        n = lib.g4_model_stop_ids(self._handle(), byref(p))
        return tuple(p[i] for i in range(n))

    @property
    def ctx(self) -> int:
        """The context length of each generation, in tokens (the engine option ctx)."""
        return int(self._opts.ctx)

    @property
    def options(self) -> Dict[str, str]:
        """Every engine option's value in effect, as text, resolved (what the engine chose for "auto")."""
        o = C.Options.from_buffer_copy(self._opts)
        lib.g4_options_resolve(byref(o))
        buf = ctypes.create_string_buffer(256)
        out = {}
        for info in options():
            if lib.g4_options_get(byref(o), info.name.encode(), buf, len(buf)) >= 0:
                out[info.name] = buf.value.decode()
        return out

    @property
    def weights_resident(self) -> bool:
        """Whether the streamed weights were copied into memory (weights="resident") or stay mapped."""
        return bool(lib.g4_model_weights_resident(self._handle()))

    def __repr__(self) -> str:
        return f"g4.Model({self.path!r}{', closed' if self._closed else ''})"

    # ---- the tokenizer ----

    def tokenize(self, text: Union[str, bytes], *, special: bool = True) -> List[int]:
        """The token ids of text (no BOS added). special=True matches control-token strings
        ("<bos>", "<|turn>") as the control tokens; special=False tokenizes them as plain text
        (for untrusted input)."""
        b = text.encode("utf-8", "surrogatepass") if isinstance(text, str) else bytes(text)
        ids = POINTER(c_int32)()
        n = c_size_t()
        if lib.g4_tokenizer_encode(self._tokenizer(), b, len(b), int(bool(special)), byref(ids), byref(n)) != 0:
            raise _fail(InputError)
        try:
            return ids[: n.value]
        finally:
            C.free(ids)

    def detokenize(self, ids: Sequence[int]) -> str:
        """The text of token ids; control tokens appear as their literal text ("<turn|>")."""
        arr = _ids_array(ids)
        out = c_void_p()
        n = c_size_t()
        if lib.g4_tokenizer_decode(self._tokenizer(), arr, len(arr), byref(out), byref(n)) != 0:
            raise _fail(InputError)
        try:
            return C.text(out.value, n.value)
        finally:
            C.free(out)

    def is_special(self, token: int) -> bool:
        """Whether a token id is a control token ("<bos>", "<|turn>", "<eos>", ...)."""
        return bool(lib.g4_tokenizer_is_special(self._tokenizer(), int(token)))

    # ---- generation ----

    @overload
    def generate(
        self,
        prompt: Union[str, Sequence[int]],
        *,
        max_tokens: Optional[int] = None,
        temperature: Optional[float] = None,
        top_k: Optional[int] = None,
        top_p: Optional[float] = None,
        min_p: Optional[float] = None,
        repeat_penalty: Optional[float] = None,
        repeat_last_n: Optional[int] = None,
        seed: Optional[int] = None,
        frequency_penalty: Optional[float] = None,
        presence_penalty: Optional[float] = None,
        logit_bias: Optional[Dict[int, float]] = None,
        stop: Union[str, Sequence[str], None] = None,
        raw: bool = False,
        system: Optional[str] = None,
        thinking: bool = False,
        response_format: Optional[Any] = None,
        json_schema: Optional[Any] = None,
        grammar: Optional[str] = None,
        stream: Literal[False] = False,
    ) -> str: ...

    @overload
    def generate(
        self,
        prompt: Union[str, Sequence[int]],
        *,
        max_tokens: Optional[int] = None,
        temperature: Optional[float] = None,
        top_k: Optional[int] = None,
        top_p: Optional[float] = None,
        min_p: Optional[float] = None,
        repeat_penalty: Optional[float] = None,
        repeat_last_n: Optional[int] = None,
        seed: Optional[int] = None,
        frequency_penalty: Optional[float] = None,
        presence_penalty: Optional[float] = None,
        logit_bias: Optional[Dict[int, float]] = None,
        stop: Union[str, Sequence[str], None] = None,
        raw: bool = False,
        system: Optional[str] = None,
        thinking: bool = False,
        response_format: Optional[Any] = None,
        json_schema: Optional[Any] = None,
        grammar: Optional[str] = None,
        stream: Literal[True],
    ) -> "Stream[str, Completion]": ...

    def generate(
        self,
        prompt: Union[str, Sequence[int]],
        *,
        max_tokens: Optional[int] = None,
        temperature: Optional[float] = None,
        top_k: Optional[int] = None,
        top_p: Optional[float] = None,
        min_p: Optional[float] = None,
        repeat_penalty: Optional[float] = None,
        repeat_last_n: Optional[int] = None,
        seed: Optional[int] = None,
        frequency_penalty: Optional[float] = None,
        presence_penalty: Optional[float] = None,
        logit_bias: Optional[Dict[int, float]] = None,
        stop: Union[str, Sequence[str], None] = None,
        raw: bool = False,
        system: Optional[str] = None,
        thinking: bool = False,
        response_format: Optional[Any] = None,
        json_schema: Optional[Any] = None,
        grammar: Optional[str] = None,
        stream: bool = False,
    ) -> Union[str, "Stream[str, Completion]"]:
        """Answers a prompt, as `g4 run -p PROMPT` does: the text (str), or with stream=True a
        Stream of text deltas (str) whose `result` is the Completion.

        The prompt goes through the model's chat template as a user message (after a system
        message if `system` is given; `thinking` turns thinking on); raw=True feeds the text as it
        is (control-token strings as control tokens, `g4 run --raw`), and a list of token ids is
        fed as it is. Sampling settings left None are the model's (generation_config.json, as on
        the command line); temperature=0 is greedy decoding. max_tokens None: until a stop id or
        the context is full. stop: strings that end the text where the first of them begins (it
        is left out). Thoughts are not part of the text (chat() returns them). Structured output
        as chat() takes it (one of response_format, json_schema, grammar): the text is held to it.
        """
        job = self._generation(
            prompt, max_tokens, temperature, top_k, top_p, min_p, repeat_penalty, repeat_last_n, seed, stop, raw, system, thinking,
            frequency_penalty, presence_penalty, logit_bias, response_format, json_schema, grammar,
        )
        if stream:
            return Stream(job)
        c = _run(job)
        _flush_warnings()
        return c.text

    def complete(
        self,
        prompt: Union[str, Sequence[int]],
        *,
        max_tokens: Optional[int] = None,
        temperature: Optional[float] = None,
        top_k: Optional[int] = None,
        top_p: Optional[float] = None,
        min_p: Optional[float] = None,
        repeat_penalty: Optional[float] = None,
        repeat_last_n: Optional[int] = None,
        seed: Optional[int] = None,
        frequency_penalty: Optional[float] = None,
        presence_penalty: Optional[float] = None,
        logit_bias: Optional[Dict[int, float]] = None,
        stop: Union[str, Sequence[str], None] = None,
        raw: bool = False,
        system: Optional[str] = None,
        thinking: bool = False,
        response_format: Optional[Any] = None,
        json_schema: Optional[Any] = None,
        grammar: Optional[str] = None,
    ) -> Completion:
        """generate() returning the Completion: the text, the token ids, why it ended, timings."""
        job = self._generation(
            prompt, max_tokens, temperature, top_k, top_p, min_p, repeat_penalty, repeat_last_n, seed, stop, raw, system, thinking,
            frequency_penalty, presence_penalty, logit_bias, response_format, json_schema, grammar,
        )
        c = _run(job)
        _flush_warnings()
        return c

    def _generation(
        self,
        prompt: Union[str, Sequence[int]],
        max_tokens: Optional[int],
        temperature: Optional[float],
        top_k: Optional[int],
        top_p: Optional[float],
        min_p: Optional[float],
        repeat_penalty: Optional[float],
        repeat_last_n: Optional[int],
        seed: Optional[int],
        stop: Union[str, Sequence[str], None],
        raw: bool,
        system: Optional[str],
        thinking: bool,
        frequency_penalty: Optional[float] = None,
        presence_penalty: Optional[float] = None,
        logit_bias: Optional[Dict[int, float]] = None,
        response_format: Optional[Any] = None,
        json_schema: Optional[Any] = None,
        grammar: Optional[str] = None,
    ) -> Callable[[Optional[Callable[[str], None]], Optional[threading.Event]], Completion]:
        """generate()'s arguments checked, and the generation to run (here or in a stream's thread)."""
        settings = _Settings(max_tokens, temperature, top_k, top_p, min_p, repeat_penalty, repeat_last_n, seed, thinking, None,
                             frequency_penalty, presence_penalty, logit_bias, response_format, json_schema, grammar)
        stops = [stop] if isinstance(stop, str) else list(stop or [])
        if not all(isinstance(s, str) for s in stops):
            raise OptionError("stop: expected a string or a list of strings")
        ids: Optional[List[int]] = None
        msgs: List[_Msg] = []
        if (raw or not isinstance(prompt, str)) and (system is not None or thinking):
            raise OptionError(
                f"{'system' if system is not None else 'thinking'}: a raw prompt has no chat template to put it in"
            )
        if isinstance(prompt, str):
            if raw:
                ids = self.tokenize(prompt)
            else:
                if system is not None:
                    msgs.append((C.CHAT_SYSTEM, _c_string("system", system), []))
                msgs.append((C.CHAT_USER, _c_string("prompt", prompt), []))
        else:
            ids = list(prompt)
        if ids is not None and not ids:
            raise InputError("empty prompt")
        self._handle()

        def job(emit: Optional[Callable[[str], None]], cancel: Optional[threading.Event]) -> Completion:
            parts: List[str] = []

            def on_spans(token: int, answer: str, thought: str, tool: str) -> bool:
                out = answer + tool  # what `g4 run` prints: all but the thoughts, cut at a stop string
                if out:
                    parts.append(out)
                    if emit is not None:
                        emit(out)
                return False

            with self._lease() as s:
                turn = self._reply(s, settings, msgs, ids, on_spans, cancel, [x for x in stops if x])
                lib.g4_conversation_free(turn.conv)
            r = turn.result
            reason = "stop" if turn.stopped else _STOP_NAMES.get(r.stop, str(r.stop))
            return Completion("".join(parts), turn.tokens, reason, r.n_prompt, r.prefill_s, r.decode_s)

        return job

    @overload
    def chat(
        self,
        messages: Sequence[Message],
        *,
        thinking: bool = False,
        tools: Optional[Sequence[str]] = None,
        max_tokens: Optional[int] = None,
        temperature: Optional[float] = None,
        top_k: Optional[int] = None,
        top_p: Optional[float] = None,
        min_p: Optional[float] = None,
        repeat_penalty: Optional[float] = None,
        repeat_last_n: Optional[int] = None,
        seed: Optional[int] = None,
        frequency_penalty: Optional[float] = None,
        presence_penalty: Optional[float] = None,
        logit_bias: Optional[Dict[int, float]] = None,
        response_format: Optional[Any] = None,
        json_schema: Optional[Any] = None,
        grammar: Optional[str] = None,
        stream: Literal[False] = False,
    ) -> ChatReply: ...

    @overload
    def chat(
        self,
        messages: Sequence[Message],
        *,
        thinking: bool = False,
        tools: Optional[Sequence[str]] = None,
        max_tokens: Optional[int] = None,
        temperature: Optional[float] = None,
        top_k: Optional[int] = None,
        top_p: Optional[float] = None,
        min_p: Optional[float] = None,
        repeat_penalty: Optional[float] = None,
        repeat_last_n: Optional[int] = None,
        seed: Optional[int] = None,
        frequency_penalty: Optional[float] = None,
        presence_penalty: Optional[float] = None,
        logit_bias: Optional[Dict[int, float]] = None,
        response_format: Optional[Any] = None,
        json_schema: Optional[Any] = None,
        grammar: Optional[str] = None,
        stream: Literal[True],
    ) -> "Stream[ChatDelta, ChatReply]": ...

    def chat(
        self,
        messages: Sequence[Message],
        *,
        thinking: bool = False,
        tools: Optional[Sequence[str]] = None,
        max_tokens: Optional[int] = None,
        temperature: Optional[float] = None,
        top_k: Optional[int] = None,
        top_p: Optional[float] = None,
        min_p: Optional[float] = None,
        repeat_penalty: Optional[float] = None,
        repeat_last_n: Optional[int] = None,
        seed: Optional[int] = None,
        frequency_penalty: Optional[float] = None,
        presence_penalty: Optional[float] = None,
        logit_bias: Optional[Dict[int, float]] = None,
        response_format: Optional[Any] = None,
        json_schema: Optional[Any] = None,
        grammar: Optional[str] = None,
        stream: bool = False,
    ) -> Union[ChatReply, "Stream[ChatDelta, ChatReply]"]:
        """The model's reply to a conversation: a ChatReply (content, reasoning, tool_calls), or
        with stream=True a Stream of ChatDelta whose `result` is the ChatReply.

        messages: {"role": ..., "content": ...} mappings (or (role, content) pairs), roles
        "system"/"developer", "user", "model"/"assistant" and "tool" (a tool's response to a call
        of the model message before it, in the calls' order); a model message holds the reply's
        text as the model wrote it (ChatReply.message). thinking turns the model's thinking on;
        tools are declarations in Gemma's syntax ("declaration:NAME{description:<|"|>...<|"|>,
        parameters:{...}}"). Sampling as in generate(). For turns that keep the KV cache of the
        earlier ones, use conversation().

        Structured output (one of): response_format {"type": "json_object"} or {"type":
        "json_schema", "json_schema": {"name": ..., "schema": {...}}} (OpenAI's) or a Pydantic model
        class; json_schema (a dict, a JSON string or a Pydantic model class); grammar (GBNF text).
        Every token of the answer then keeps to it (with thinking on, the answer after the thought),
        and it ends where the grammar does. A schema or grammar g4 cannot enforce raises InputError.
        """
        settings = _Settings(max_tokens, temperature, top_k, top_p, min_p, repeat_penalty, repeat_last_n, seed, thinking, tools,
                             frequency_penalty, presence_penalty, logit_bias, response_format, json_schema, grammar)
        msgs = _messages_from(messages)
        if not msgs:
            raise InputError("chat: no messages")

        def job(emit: Optional[Callable[[ChatDelta], None]], cancel: Optional[threading.Event]) -> ChatReply:
            with self._lease() as s:
                turn = self._reply(s, settings, msgs, None, _chat_sink(emit), cancel)
                try:
                    return _chat_reply(turn)
                finally:
                    lib.g4_conversation_free(turn.conv)

        if stream:
            return Stream(job)
        r = _run(job)
        _flush_warnings()
        return r

    def conversation(
        self,
        *,
        system: Optional[str] = None,
        thinking: bool = False,
        tools: Optional[Sequence[str]] = None,
        max_tokens: Optional[int] = None,
        temperature: Optional[float] = None,
        top_k: Optional[int] = None,
        top_p: Optional[float] = None,
        min_p: Optional[float] = None,
        repeat_penalty: Optional[float] = None,
        repeat_last_n: Optional[int] = None,
        seed: Optional[int] = None,
        frequency_penalty: Optional[float] = None,
        presence_penalty: Optional[float] = None,
        logit_bias: Optional[Dict[int, float]] = None,
    ) -> "Conversation":
        """A conversation that keeps the KV cache of its turns, as `g4 chat` does: each send() feeds
        only the new message. It holds a session of the model until closed."""
        settings = _Settings(max_tokens, temperature, top_k, top_p, min_p, repeat_penalty, repeat_last_n, seed, thinking, tools,
                             frequency_penalty, presence_penalty, logit_bias)
        return Conversation(self, settings, system)

    # ---- sessions ----

    def _handle(self) -> int:
        if self._closed or not self._m:
            raise Error(f"{self.path}: the model is closed")
        return self._m

    def _tokenizer(self) -> int:
        self._handle()
        return self._tok  # type: ignore[return-value]

    @contextmanager
    def _lease(self) -> Iterator[_Session]:
        s = self._acquire()
        try:
            yield s
        finally:
            self._release(s)

    def _acquire(self) -> _Session:
        with self._cond:
            self._handle()
            self._busy += 1
            s = self._idle.pop() if self._idle else None
        if s is None:
            try:
                s = _Session(self)
            except BaseException:
                self._release(None)
                raise
        return s

    def _release(self, s: Optional[_Session]) -> None:
        with self._cond:
            if s is not None:
                self._idle.append(s)
            self._busy -= 1
            last = self._closed and not self._busy
        if last:
            self._free()

    def _reply(
        self,
        s: _Session,
        settings: _Settings,
        msgs: Sequence[_Msg],
        ids: Optional[Sequence[int]],
        on_spans: Callable[[int, str, str, str], bool],
        cancel: Optional[threading.Event],
        stops: Optional[Sequence[str]] = None,
    ) -> _Turn:
        """A new conversation over the session (its sequence emptied), the prompt added, one reply.
        stops: generate()'s stop strings; the reply's text is then all but the thoughts (tool-call
        text is answer text, which the stop strings read)."""
        co, keep = settings.conversation_options(s)
        if stops is not None:
            arr = (c_char_p * max(len(stops), 1))(*(_c_string("stop", x) for x in stops))
            co.stop = ctypes.cast(arr, POINTER(c_char_p))  # copied by g4_conversation_new
            co.n_stop = len(stops)
            co.calls = C.CALLS_TEXT
        start = self._constrain(settings, co)
        conv = lib.g4_conversation_new(s.handle, self._tok, byref(co))
        if not conv:
            self._unconstrain(start)
            raise _fail(Error)
        try:
            for role, content, media in msgs:
                for part in media:
                    self._add_media(conv, part)
                if lib.g4_conversation_add(conv, role, content) != 0:
                    raise _fail(InputError)
            if ids is not None:
                arr = _ids_array(ids)
                if lib.g4_conversation_add_tokens(conv, arr, len(arr)) != 0:
                    raise _fail(InputError)
            turn = _run_reply(s.handle, conv, on_spans, cancel)
            turn.keep = keep
            return turn
        except BaseException:
            lib.g4_conversation_free(conv)
            raise
        finally:
            self._unconstrain(start)  # the reply's generation copied it: the conversation makes no other

    def _constrain(self, settings: _Settings, co: C.ConversationOptions) -> Optional[int]:
        """Structured output: the constraint's start state from the model's grammar cache (made on
        first need: the tokenizer's trie once, each grammar compiled once) into co.gen."""
        if settings.constraint is None:
            return None
        kind, text, name = settings.constraint
        with self._cond:
            if not self._grammars:
                self._grammars = lib.g4_grammar_cache_new(self._tokenizer(), 16)
                if not self._grammars:
                    raise _fail(Error)
            cache = self._grammars
        start = lib.g4_grammar_cache_start(cache, kind, text, len(text))
        if not start:
            raise InputError(f"{name}: {lib.g4_last_error().decode(errors='replace')}")
        co.gen.constraint = start
        co.gen.constraint_vocab = lib.g4_grammar_cache_vocab(cache)
        if settings.thinking:  # the answer after the thought is the constraint's
            co.gen.thought_open = max(0, lib.g4_tokenizer_piece_to_id(self._tok, b"<|channel>"))
            co.gen.thought_close = max(0, lib.g4_tokenizer_piece_to_id(self._tok, b"<channel|>"))
        return start

    def _unconstrain(self, start: Optional[int]) -> None:
        if start:
            lib.g4_grammar_cache_done(self._grammars, start, None)

    def _add_media(self, conv: int, part: _Media) -> None:
        """An image's or a recording's soft tokens (the model's vision or audio tower) as a part of the next user message."""
        kind, data, budget, what = part
        embd, n = POINTER(c_float)(), c_int()
        buf = ctypes.create_string_buffer(data, len(data))
        if kind == C.MEDIA_IMAGE:
            rc = lib.g4_image_soft_tokens(self._m, byref(self._opts), buf, len(data), budget, byref(embd), byref(n))
        else:
            rc = lib.g4_audio_soft_tokens(self._m, byref(self._opts), buf, len(data), byref(embd), byref(n))
        if rc != 0:
            raise _fail(InputError, f"{what}: ")
        try:
            if lib.g4_conversation_add_media(conv, kind, embd, n.value) != 0:
                raise _fail(InputError, f"{what}: ")
        finally:
            C.free(embd)

    # ---- closing ----

    def close(self) -> None:
        """Frees the model. New calls then fail; generations running in other threads and open
        conversations go on, and the model is freed when the last of them is done."""
        with self._cond:
            if self._closed:
                return
            self._closed = True
            if self._busy:
                return
        self._free()

    def _free(self) -> None:
        with self._cond:
            idle, self._idle = self._idle, []
            tok, self._tok = self._tok, None
            m, self._m = self._m, None
        with self._cond:
            d, self._d = self._d, None
        for s in idle:
            s.free()
        grammars, self._grammars = getattr(self, "_grammars", None), None
        if grammars:
            lib.g4_grammar_cache_free(grammars)
        if tok:
            lib.g4_tokenizer_free(tok)
        if d:
            lib.g4_draft_free(d)
        if m:
            lib.g4_model_free(m)

    def __enter__(self) -> "Model":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __del__(self) -> None:
        if getattr(self, "_cond", None) is not None and lib is not None:
            self.close()


def _ids_array(ids: Sequence[int]) -> Any:
    """Token ids as an int32_t array (array.array checks the range, which a ctypes array would wrap)."""
    try:
        a = array.array("i", ids)
    except (TypeError, OverflowError) as e:
        raise InputError(f"token ids: expected a list of 32-bit integers ({e})") from None
    return (c_int32 * len(a)).from_buffer(a) if len(a) else (c_int32 * 0)()


# What g4_generate_params.cancel asks before each step: the cancel event of the reply that the
# asking thread runs (_run_reply sets it), so that Ctrl-C or a closed stream stops a reply between
# two prompt chunks, not only at its next token (a long prompt's prefill took seconds).
_cancels = threading.local()


def _cancel_asked(user: Any) -> int:
    try:
        event = getattr(_cancels, "event", None)
        return 1 if event is not None and event.is_set() else 0
    except BaseException:  # a signal handler's exception in the callback: stop; raised after the call
        return 1


_CANCEL_FN = C.CANCEL_FN(_cancel_asked)
_CANCEL_ADDRESS = ctypes.cast(_CANCEL_FN, ctypes.c_void_p).value


def _run_reply(session: int, conv: int, on_spans: Callable[[int, str, str, str], bool], cancel: Optional[threading.Event]) -> _Turn:
    """g4_conversation_reply, the GIL released while the engine computes (a callback takes it back
    for each token); an exception in the callback stops the reply and is raised after it."""
    rep = _Reply(on_spans, cancel)
    res = C.GenerateResult()
    _cancels.event = cancel
    try:
        with _gate.compute():
            rc = lib.g4_conversation_reply(conv, rep.fn, None, byref(res))
    finally:
        _cancels.event = None
    if rep.exc is not None:
        raise rep.exc
    if rc != 0:
        msg = C.last_error()
        ids = POINTER(c_int32)()
        n = c_size_t()
        # which of the reply's refusals it was, for the exception's class; the message is the engine's
        if lib.g4_conversation_prompt(conv, byref(ids), byref(n)) == 0:
            vocab = lib.g4_model_vocab_size(lib.g4_session_model(session))
            if any(not 0 <= t < vocab for t in ids[: n.value]):
                raise InputError(msg)
            if n.value > lib.g4_session_ctx(session) - lib.g4_session_seq_pos(session, 0):
                raise ContextError(msg)
        raise GenerationError(msg)
    n_tok = c_int()
    p = lib.g4_conversation_reply_tokens(conv, byref(n_tok))
    return _Turn(res, p[: n_tok.value] if n_tok.value else [], conv, stopped=rep.stopped)


def _chat_sink(emit: Optional[Callable[[ChatDelta], None]]) -> Callable[[int, str, str, str], bool]:
    def on_spans(token: int, answer: str, thought: str, tool: str) -> bool:
        if emit is not None and (answer or thought or tool):
            emit(ChatDelta(answer, thought, tool))
        return False

    return on_spans


def _parsed(r: C.ChatReply) -> ParsedReply:
    """A g4_chat_reply's fields, the struct freed."""
    try:
        return ParsedReply(
            content=C.text(r.answer, r.answer_len),
            reasoning=C.text(r.thinking, r.thinking_len),
            tool_calls=[ToolCall(C.ctext(r.tool_calls[i].name), C.ctext(r.tool_calls[i].arguments)) for i in range(r.n_tool_calls)],
            truncated_in_thought=bool(r.thought_unclosed),
            tool_call_unclosed=bool(r.tool_call_unclosed),
        )
    finally:
        lib.g4_chat_reply_free(byref(r))


def parse_reply(text: str) -> ParsedReply:
    """A model's reply text (as generated, without the stop token) split into its answer, its
    thoughts and its tool calls, as the chat template's parser splits it (g4_chat_parse_reply)."""
    b = text.encode("utf-8", "surrogatepass")
    r = C.ChatReply()
    if lib.g4_chat_parse_reply(b, len(b), byref(r)) != 0:
        raise _fail(InputError)
    return _parsed(r)


def _chat_reply(turn: _Turn) -> ChatReply:
    conv = turn.conv
    n = c_size_t()
    p = lib.g4_conversation_reply_text(conv, byref(n))
    text = C.text(p, n.value)
    r = C.ChatReply()
    if lib.g4_conversation_reply_parse(conv, byref(r)) != 0:
        raise _fail(GenerationError)
    parts = _parsed(r)
    msgs = POINTER(C.ChatMessage)()
    nm = c_size_t()
    lib.g4_conversation_messages(conv, byref(msgs), byref(nm))
    last = msgs[nm.value - 1].content if nm.value else None
    message = {"role": "assistant", "content": (last or b"").decode("utf-8", "replace") if nm.value else text}
    res = turn.result
    return ChatReply(
        content=parts.content,
        reasoning=parts.reasoning,
        tool_calls=parts.tool_calls,
        text=text,
        message=message,
        tokens=turn.tokens,
        finish_reason=_STOP_NAMES.get(res.stop, str(res.stop)),
        prompt_tokens=res.n_prompt,
        prefill_s=res.prefill_s,
        decode_s=res.decode_s,
        truncated_in_thought=parts.truncated_in_thought,
    )


class Conversation:
    """Chat turns over one session whose KV cache keeps the earlier turns (model.conversation()).

    send(content) adds a user message and returns the model's ChatReply; add() adds messages of
    any role (tool responses after a reply's tool calls) and reply() answers them. One thread at a
    time (calls from others wait)."""

    def __init__(self, model: Model, settings: _Settings, system: Optional[str]) -> None:
        self.model = model
        self._lock = threading.RLock()
        self._session: Optional[_Session] = model._acquire()
        self._conv: Optional[int] = None
        try:
            co, self._keep = settings.conversation_options(self._session)
            self._conv = lib.g4_conversation_new(self._session.handle, model._tok, byref(co))
            if not self._conv:
                raise _fail(Error)
            self._system = _c_string("system", system) if system is not None else None
            self._fresh = True
        except BaseException:
            self.close()
            raise

    def _handle(self) -> int:
        if not self._conv:
            raise Error("the conversation is closed")
        return self._conv

    def add(self, role: str, content: Any) -> None:
        """Adds a message for the next reply (role and content as in Model.chat: a user message may
        hold image parts)."""
        with self._lock:
            conv = self._handle()
            ((r, b, media),) = _messages_from([(role, content)])
            self._add_system()
            for part in media:
                self.model._add_media(conv, part)
            if lib.g4_conversation_add(conv, r, b) != 0:
                raise _fail(InputError)

    def _add_system(self) -> None:
        if self._fresh and self._system is not None:
            if lib.g4_conversation_add(self._conv, C.CHAT_SYSTEM, self._system) != 0:
                raise _fail(InputError)
        self._fresh = False

    @overload
    def reply(self, *, stream: Literal[False] = False) -> ChatReply: ...

    @overload
    def reply(self, *, stream: Literal[True]) -> "Stream[ChatDelta, ChatReply]": ...

    def reply(self, *, stream: bool = False) -> Union[ChatReply, "Stream[ChatDelta, ChatReply]"]:
        """The model's reply to the messages added since the last one (a ChatReply; with
        stream=True a Stream of ChatDelta). With none added the model goes on where it stopped.
        A failed reply drops the messages added for it."""

        def job(emit: Optional[Callable[[ChatDelta], None]], cancel: Optional[threading.Event]) -> ChatReply:
            with self._lock:
                conv = self._handle()
                try:
                    turn = _run_reply(self._session.handle, conv, _chat_sink(emit), cancel)  # type: ignore[union-attr]
                except BaseException:
                    lib.g4_conversation_discard(conv)
                    raise
                return _chat_reply(turn)

        if stream:
            return Stream(job)
        r = _run(job)
        _flush_warnings()
        return r

    @overload
    def send(self, content: Any, *, stream: Literal[False] = False) -> ChatReply: ...

    @overload
    def send(self, content: Any, *, stream: Literal[True]) -> "Stream[ChatDelta, ChatReply]": ...

    def send(self, content: Any, *, stream: bool = False) -> Union[ChatReply, "Stream[ChatDelta, ChatReply]"]:
        """Adds a user message and returns the model's reply (see reply())."""
        self.add("user", content)
        return self.reply(stream=True) if stream else self.reply()

    @property
    def messages(self) -> List[Dict[str, str]]:
        """The messages so far, replies included."""
        names = {C.CHAT_SYSTEM: "system", C.CHAT_USER: "user", C.CHAT_MODEL: "assistant", C.CHAT_TOOL: "tool"}
        with self._lock:
            msgs = POINTER(C.ChatMessage)()
            n = c_size_t()
            lib.g4_conversation_messages(self._handle(), byref(msgs), byref(n))
            return [
                {"role": names.get(msgs[i].role, str(msgs[i].role)), "content": (msgs[i].content or b"").decode("utf-8", "replace")}
                for i in range(n.value)
            ]

    @property
    def tokens(self) -> List[int]:
        """Every token of the conversation: what the KV cache holds, then the last reply's last token."""
        with self._lock:
            n = c_size_t()
            p = lib.g4_conversation_tokens(self._handle(), byref(n))
            return p[: n.value] if n.value else []

    def reset(self) -> None:
        """Starts over: no messages, the KV cache emptied (the system message comes first again)."""
        with self._lock:
            if lib.g4_conversation_reset(self._handle(), None) != 0:
                raise _fail(Error)
            self._fresh = True

    def close(self) -> None:
        """Frees the conversation and gives its session back to the model."""
        with self._lock:
            if self._conv:
                lib.g4_conversation_free(self._conv)
                self._conv = None
            if self._session is not None:
                self.model._release(self._session)
                self._session = None

    def __enter__(self) -> "Conversation":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __del__(self) -> None:
        if getattr(self, "_lock", None) is not None and lib is not None:
            self.close()
