"""The C API of libg4 (include/g4.h) through ctypes: the library found and loaded, its structs
mirrored, every function used here given its prototype. Nothing of the engine is here.

The structs must have g4.h's layout exactly; tests/test_abi.py compiles a C program that prints
every mirrored struct's size and field offsets and compares them with these.

ctypes.CDLL releases the GIL for every foreign call, and each callback into Python takes it back
for as long as the callback runs.
"""

from __future__ import annotations

import ctypes
import os
from ctypes import (
    CFUNCTYPE,
    POINTER,
    Structure,
    c_char_p,
    c_double,
    c_float,
    c_int,
    c_int32,
    c_size_t,
    c_uint64,
    c_void_p,
)
from pathlib import Path
from typing import Any, List, Optional

from ._version import __version__ as API_VERSION  # the g4.h mirrored here; the library must report it


def _candidates() -> List[str]:
    """Where libg4 is: the first that applies of G4_LIBRARY (a path), the copy installed beside this
    file (built from the source tree), the folder pkg-config named at install time, and for the
    package used from a source checkout without installing, the tree's build and then the system's
    loader path."""
    env = os.environ.get("G4_LIBRARY")
    if env:
        return [env]
    here = Path(__file__).resolve().parent
    if (here / "libg4.so.0").exists():
        return [str(here / "libg4.so.0")]
    try:
        from . import _build_config  # written by setup.py
    except ImportError:
        _build_config = None  # type: ignore[assignment]
    if _build_config is not None and _build_config.LIBDIR:
        return [os.path.join(_build_config.LIBDIR, "libg4.so.0")]
    tree = here.parent.parent / "build" / "release" / "libg4.so"
    return ([str(tree)] if tree.exists() else []) + ["libg4.so.0"]


def _load() -> ctypes.CDLL:
    errors = []
    for path in _candidates():
        try:
            return ctypes.CDLL(path)
        except OSError as e:
            errors.append(f"{path}: {e}")
    raise ImportError(
        "g4: cannot load libg4 (" + "; ".join(errors) + "); reinstall the package (pip install ./python builds it) "
        "or set G4_LIBRARY to the path of libg4.so"
    )


lib = _load()
#: The file the library was loaded from.
library_path: str = lib._name

# ---- structs (g4.h) ----


class Options(Structure):
    _fields_ = [
        ("act", c_int),
        ("linear_quant", c_int),
        ("kv_quant", c_int),
        ("pmp_quant", c_int),
        ("pmp_out_raw", c_int),
        ("pmp_s_in", c_float),
        ("pmp_s_out", c_float),
        ("round", c_int),
        ("qdiv", c_int),
        ("requant", c_int),
        ("lmhead_dynamic_q8", c_int),
        ("ctx", c_int),
        ("n_seq", c_int),
        ("threads", c_int),
        ("weights", c_int),
    ]


class OptionChoice(Structure):
    _fields_ = [("name", c_char_p), ("value", c_int)]


class OptionInfo(Structure):
    _fields_ = [
        ("name", c_char_p),
        ("short_flag", c_char_p),
        ("choices", POINTER(OptionChoice)),
        ("values", c_char_p),
        ("fields", c_char_p),
        ("def", c_char_p),
        ("kind", c_int),
        ("integer", c_int),
        ("help", c_char_p),
    ]


class Sampling(Structure):
    _fields_ = [
        ("temperature", c_float),
        ("top_k", c_int),
        ("top_p", c_float),
        ("min_p", c_float),
        ("repeat_penalty", c_float),
        ("repeat_last_n", c_int),
        ("seed", c_uint64),
        ("frequency_penalty", c_float),
        ("presence_penalty", c_float),
        ("bias_ids", POINTER(c_int32)),
        ("bias_values", POINTER(c_float)),
        ("n_bias", c_int),
    ]


class GenerateParams(Structure):
    _fields_ = [
        ("max_tokens", c_int),
        ("sampling", Sampling),
        ("stop_ids", POINTER(c_int)),
        ("n_stop_ids", c_int),
        ("output", c_int),
        ("output_k", c_int),
        ("draft", c_void_p),
        ("draft_tokens", c_int),
        ("cancel", c_void_p),  # a CANCEL_FN's address (a CFUNCTYPE field would not take None)
        ("cancel_user", c_void_p),
        ("logprobs", c_int),
        ("top_logprobs", c_int),
        ("constraint", c_void_p),  # const g4_grammar_state * (structured output)
        ("constraint_vocab", c_void_p),
        ("thought_open", c_int32),
        ("thought_close", c_int32),
    ]


class GenerateResult(Structure):
    _fields_ = [
        ("n_prompt", c_int),
        ("n_generated", c_int),
        ("stop", c_int),
        ("stop_id", c_int32),
        ("prefill_s", c_double),
        ("decode_s", c_double),
    ]


class ChatOptions(Structure):
    _fields_ = [
        ("form", c_int),
        ("thinking", c_int),
        ("add_generation_prompt", c_int),
        ("add_bos", c_int),
        ("tools", POINTER(c_char_p)),
        ("n_tools", c_size_t),
    ]


class ConversationOptions(Structure):
    _fields_ = [
        ("seq", c_int),
        ("chat", ChatOptions),
        ("gen", GenerateParams),
        ("stop", POINTER(c_char_p)),  # stop strings, read by the library's reply reader (g4_reply)
        ("n_stop", c_int),
        ("calls", c_int),  # CALLS_STREAM, CALLS_WHOLE or CALLS_TEXT
    ]


class SpanText(Structure):
    _fields_ = [("span", c_int), ("text", c_void_p), ("len", c_size_t)]


class ToolCall(Structure):
    _fields_ = [("name", c_void_p), ("arguments", c_void_p)]


class ReplyDelta(Structure):
    _fields_ = [
        ("token", c_int32),
        ("text", c_void_p),
        ("len", c_size_t),
        ("spans", POINTER(SpanText)),
        ("n_spans", c_int),
        ("calls", POINTER(ToolCall)),
        ("n_calls", c_int),
        ("ended", c_int),
        ("stop_string", c_int),  # the stop string that matched, or -1
        ("finish", c_int),  # FINISH_*
    ]


class ReplyOptions(Structure):
    _fields_ = [
        ("stop", POINTER(c_char_p)),
        ("n_stop", c_int),
        ("end_ids", POINTER(c_int)),
        ("n_end_ids", c_int),
        ("starts_in_thought", c_int),
        ("calls", c_int),
        ("raw", c_int),
        ("prefix", c_char_p),
        ("max_calls", c_int),
    ]


class ChatReply(Structure):
    _fields_ = [
        ("answer", c_void_p),
        ("answer_len", c_size_t),
        ("thinking", c_void_p),
        ("thinking_len", c_size_t),
        ("thought_blocks", c_int),
        ("thought_unclosed", c_int),
        ("tool_calls", POINTER(ToolCall)),
        ("n_tool_calls", c_int),
        ("tool_call_unclosed", c_int),
    ]


class ChatMessage(Structure):
    _fields_ = [("role", c_int), ("content", c_char_p)]


class Checkpoint(Structure):
    _fields_ = [("model", c_void_p), ("tok", c_void_p), ("draft", c_void_p)]


#: Every mirrored struct under its C name (tests/test_abi.py checks their layouts).
STRUCTS = {
    "g4_options": Options,
    "g4_option_choice": OptionChoice,
    "g4_option_info": OptionInfo,
    "g4_sampling": Sampling,
    "g4_generate_params": GenerateParams,
    "g4_generate_result": GenerateResult,
    "g4_chat_options": ChatOptions,
    "g4_conversation_options": ConversationOptions,
    "g4_span_text": SpanText,
    "g4_reply_delta": ReplyDelta,
    "g4_reply_options": ReplyOptions,
    "g4_tool_call": ToolCall,
    "g4_chat_reply": ChatReply,
    "g4_chat_message": ChatMessage,
    "g4_checkpoint": Checkpoint,
}

# ---- enums ----

SPAN_ANSWER, SPAN_THOUGHT, SPAN_TOOL_CALL = 0, 1, 2
CALLS_STREAM, CALLS_WHOLE, CALLS_TEXT = 0, 1, 2
FINISH_NONE, FINISH_STOP, FINISH_LENGTH, FINISH_TOOL_CALLS = 0, 1, 2, 3
STOP_EOS, STOP_BUDGET, STOP_CONTEXT, STOP_USER, STOP_ERROR = 0, 1, 2, 3, 4
CHAT_SYSTEM, CHAT_USER, CHAT_MODEL, CHAT_TOOL = 0, 1, 2, 3
CHAT_FORM_E2B, CHAT_FORM_26B = 0, 1
OPTION_RESULT, OPTION_RUN, OPTION_PRESET = 0, 1, 2
#: g4_sampling's fields as G4_SAMPLE_* bits (g4_sampling_override)
SAMPLE_BITS = {"temperature": 1, "top_k": 2, "top_p": 4, "min_p": 8, "repeat_penalty": 16, "repeat_last_n": 32, "seed": 64,
               "frequency_penalty": 128, "presence_penalty": 256, "bias": 512}

# ---- callbacks ----

LOG_FN = CFUNCTYPE(None, c_void_p, c_int, c_char_p)
REPLY_FN = CFUNCTYPE(c_int, c_void_p, c_void_p)  # (user, const g4_reply_delta *)
CANCEL_FN = CFUNCTYPE(c_int, c_void_p)  # g4_generate_params.cancel (cancel_user)

# ---- functions ----

_p = c_void_p  # every opaque handle: g4_model *, g4_session *, g4_tokenizer *, g4_conversation *


def _proto(name: str, restype: Any, *argtypes: Any) -> None:
    f = getattr(lib, name)
    f.restype = restype
    f.argtypes = list(argtypes)


_proto("g4_version", c_char_p)
_proto("g4_last_error", c_char_p)
_proto("g4_set_log", None, LOG_FN, c_void_p)
_proto("g4_set_threads", None, c_int)
_proto("g4_threads", c_int)

_proto("g4_options_default", None, POINTER(Options))
_proto("g4_option_count", c_int)
_proto("g4_option_at", POINTER(OptionInfo), c_int)
_proto("g4_option_find", POINTER(OptionInfo), c_char_p)
_proto("g4_options_set", c_int, POINTER(Options), c_char_p, c_char_p)
_proto("g4_options_get", c_int, POINTER(Options), c_char_p, c_char_p, c_size_t)
_proto("g4_options_resolve", None, POINTER(Options))

_proto("g4_model_load_options", _p, c_char_p, POINTER(Options))
_proto("g4_model_free", None, _p)
_proto("g4_model_vocab_size", c_int, _p)
_proto("g4_model_stop_ids", c_int, _p, POINTER(POINTER(c_int)))
_proto("g4_model_bos_id", c_int, _p)
_proto("g4_model_dir", c_char_p, _p)
_proto("g4_model_weights_resident", c_int, _p)
_proto("g4_model_sampling_defaults", None, _p, POINTER(Sampling))
_proto("g4_sampling_override", None, POINTER(Sampling), POINTER(Sampling), c_int)
_proto("g4_model_chat_form", c_int, _p, POINTER(c_int))

_proto("g4_session_new", _p, _p, POINTER(Options))
_proto("g4_session_free", None, _p)
_proto("g4_draft_load", _p, c_char_p, _p)
_proto("g4_checkpoint_open", c_int, POINTER(Checkpoint), c_char_p, POINTER(Options), c_char_p)
_proto("g4_draft_free", None, _p)
_proto("g4_drafter_new", _p, _p, _p)
_proto("g4_drafter_free", None, _p)
_proto("g4_session_ctx", c_int, _p)
_proto("g4_session_seq_pos", c_int, _p, c_int)
_proto("g4_session_model", _p, _p)

_proto("g4_tokenizer_load", _p, c_char_p)
_proto("g4_tokenizer_free", None, _p)
_proto("g4_tokenizer_encode", c_int, _p, c_char_p, c_size_t, c_int, POINTER(POINTER(c_int32)), POINTER(c_size_t))
_proto("g4_tokenizer_decode", c_int, _p, POINTER(c_int32), c_size_t, POINTER(c_void_p), POINTER(c_size_t))
_proto("g4_tokenizer_vocab_size", c_size_t, _p)
_proto("g4_tokenizer_is_special", c_int, _p, c_int32)

_proto("g4_chat_role_parse", c_int, c_char_p, POINTER(c_int))
_proto("g4_chat_reply_free", None, POINTER(ChatReply))
_proto("g4_chat_parse_reply", c_int, c_char_p, c_size_t, POINTER(ChatReply))

_proto("g4_conversation_default_options", c_int, _p, POINTER(ConversationOptions))
_proto("g4_conversation_new", _p, _p, _p, POINTER(ConversationOptions))
_proto("g4_conversation_free", None, _p)
_proto("g4_conversation_reset", c_int, _p, POINTER(ChatOptions))
_proto("g4_conversation_add", c_int, _p, c_int, c_char_p)
_proto("g4_conversation_add_tokens", c_int, _p, POINTER(c_int32), c_size_t)
# ---- media parts (issue 35): an image's or a recording's soft tokens into the next user message ----
MEDIA_IMAGE, MEDIA_AUDIO = 0, 1
_proto("g4_image_soft_tokens", c_int, _p, POINTER(Options), c_void_p, c_size_t, c_int, POINTER(POINTER(c_float)), POINTER(c_int))
_proto("g4_audio_soft_tokens", c_int, _p, POINTER(Options), c_void_p, c_size_t, POINTER(POINTER(c_float)), POINTER(c_int))
_proto("g4_conversation_add_media", c_int, _p, c_int, POINTER(c_float), c_int)
_libc = ctypes.CDLL(None)
_libc.free.argtypes, _libc.free.restype = [c_void_p], None
free = _libc.free  # what g4_image_soft_tokens' rows were malloc'd with
_proto("g4_conversation_discard", None, _p)
_proto("g4_conversation_prompt", c_int, _p, POINTER(POINTER(c_int32)), POINTER(c_size_t))
_proto("g4_conversation_reply", c_int, _p, REPLY_FN, c_void_p, POINTER(GenerateResult))
# the reply reader (the conversation reads its replies through it; bound for direct use too)
_proto("g4_reply_new", _p, _p, POINTER(ReplyOptions))
_proto("g4_reply_free", None, _p)
_proto("g4_reply_push_token", c_int, _p, c_int32, POINTER(ReplyDelta))
_proto("g4_reply_finish", c_int, _p, c_int, POINTER(ReplyDelta))
_proto("g4_conversation_reply_tokens", POINTER(c_int32), _p, POINTER(c_int))
_proto("g4_conversation_reply_text", c_void_p, _p, POINTER(c_size_t))
_proto("g4_conversation_reply_parse", c_int, _p, POINTER(ChatReply))
_proto("g4_conversation_messages", None, _p, POINTER(POINTER(ChatMessage)), POINTER(c_size_t))
_proto("g4_conversation_tokens", POINTER(c_int32), _p, POINTER(c_size_t))
_proto("g4_stop_reason_name", c_char_p, c_int)

# what g4_tokenizer_encode / _decode malloc'd, given back to the C library's allocator
_libc = ctypes.CDLL(None)
_libc.free.restype = None
_libc.free.argtypes = [c_void_p]
free = _libc.free

version: str = lib.g4_version().decode()
if version != API_VERSION and not os.environ.get("G4_SKIP_VERSION_CHECK"):
    raise ImportError(
        f"g4: {library_path} is libg4 {version}, this package mirrors g4.h {API_VERSION}: "
        "reinstall the package against the library it is to use (or set G4_LIBRARY)"
    )


def last_error() -> str:
    """The calling thread's last g4 error message (one line)."""
    msg: bytes = lib.g4_last_error()
    return msg.decode("utf-8", "replace")


def text(ptr: Optional[int], n: int) -> str:
    """n bytes at a C pointer as text (the engine's text is valid UTF-8)."""
    if not n or ptr is None:
        return ""
    return ctypes.string_at(ptr, n).decode("utf-8", "replace")


def ctext(ptr: Optional[int]) -> str:
    """A NUL-terminated C string as text."""
    return ctypes.string_at(ptr).decode("utf-8", "replace") if ptr else ""


__all__ = ["lib", "library_path", "version", "free", "last_error", "text", "ctext", "STRUCTS"]

# ---- structured output (g4_grammar_cache: the trie once, grammars compiled once per text) ----

CONSTRAINT_GBNF, CONSTRAINT_JSON_SCHEMA, CONSTRAINT_JSON_OBJECT, CONSTRAINT_REGEX = 0, 1, 2, 3
_proto("g4_grammar_cache_new", _p, _p, c_int)
_proto("g4_grammar_cache_free", None, _p)
_proto("g4_grammar_cache_vocab", _p, _p)
_proto("g4_grammar_cache_start", _p, _p, c_int, c_char_p, c_size_t)
_proto("g4_grammar_cache_done", None, _p, _p, _p)
_proto("g4_tokenizer_piece_to_id", c_int32, _p, c_char_p)
