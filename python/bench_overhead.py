"""The overhead of a Python generate() against the C engine on the same prompt, same tokens.

    python3 python/bench_overhead.py [--reps 20] [--model DIR] [--prompt FILE] [--threads N]

with the g4 package importable (installed, or PYTHONPATH=python in the source tree) and, for the C
side, a C compiler and the tree's build/release/libg4.a (make). Three measurements, each the
median and the spread over the reps, the two sides alternating every 5 reps:

  generation   wall time of one greedy answer in a loaded process: Python's model.complete() against
               a C program doing what `g4 run` does (a conversation over a session, the prompt added
               as a user message, g4_conversation_reply with a callback that keeps each delta's
               non-thought text), both from before the prompt is rendered to the text in hand;
  engine       the engine's own time inside the same Python call (prefill_s + decode_s of the
               Completion), so generate() - engine is what Python adds around the engine;
  process      the whole `g4 run --temp 0 -f PROMPT` against `python3 -c "import g4; ..."` doing the
               same (start, load, generate, print), and `python3 -c "import g4"` alone.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import g4

ROOT = Path(__file__).resolve().parent.parent

C_SOURCE = r"""
#define _POSIX_C_SOURCE 200809L
#include <g4.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef struct { char *buf; size_t n, cap; int tokens; } sink;

static int on_delta(void *user, const g4_reply_delta *d) { /* what g4 run prints, kept */
    sink *s = user;
    for (int i = 0; i < d->n_spans; i++) {
        if (d->spans[i].span == G4_SPAN_THOUGHT) continue;
        if (s->n + d->spans[i].len + 1 > s->cap) {
            s->cap = 2 * (s->n + d->spans[i].len + 1);
            s->buf = realloc(s->buf, s->cap);
        }
        memcpy(s->buf + s->n, d->spans[i].text, d->spans[i].len);
        s->n += d->spans[i].len;
    }
    if (d->token >= 0) s->tokens++;
    return 0;
}

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* argv: model dir, prompt file, threads. For each line read: one rep, and a line "seconds tokens
 * text-length"; at the end of the input, the last rep's text. */
int main(int argc, char **argv) {
    if (argc != 4) return 2;
    g4_options o;
    g4_options_default(&o);
    o.threads = atoi(argv[3]);
    char path[4096], *prompt = NULL;
    snprintf(path, sizeof path, "%s/tokenizer.json", argv[1]);
    g4_model *m = g4_model_load_options(argv[1], &o);
    g4_tokenizer *tok = m ? g4_tokenizer_load(path) : NULL;
    g4_session *s = tok ? g4_session_new(m, &o) : NULL;
    FILE *f = fopen(argv[2], "rb");
    if (!s || !f) { fprintf(stderr, "%s\n", g4_last_error()); return 1; }
    fseek(f, 0, SEEK_END); long len = ftell(f); fseek(f, 0, SEEK_SET);
    prompt = calloc((size_t)len + 1, 1);
    if (fread(prompt, 1, (size_t)len, f) != (size_t)len) return 1;
    fclose(f);
    sink out = {0};
    char line[64];
    while (fgets(line, sizeof line, stdin)) {
        out.n = 0, out.tokens = 0;
        double t0 = now();
        g4_conversation_options co;
        g4_conversation_default_options(s, &co);
        co.gen.sampling.temperature = 0;
        g4_conversation *c = g4_conversation_new(s, tok, &co);
        g4_generate_result res;
        if (!c || g4_conversation_add(c, G4_CHAT_USER, prompt) || g4_conversation_reply(c, on_delta, &out, &res)) {
            fprintf(stderr, "%s\n", g4_last_error());
            return 1;
        }
        g4_conversation_free(c);
        double t1 = now();
        printf("%.9f %d %zu\n", t1 - t0, out.tokens, out.n);
        fflush(stdout);
    }
    fwrite(out.buf, 1, out.n, stdout);
    return 0;
}
"""


def ms(xs):
    xs = sorted(xs)
    return f"{1e3 * statistics.median(xs):8.3f} ms (min {1e3 * xs[0]:.3f}, max {1e3 * xs[-1]:.3f})"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--model", default=str(ROOT / "models" / "gemma4-tiny-math"))
    ap.add_argument("--prompt", default=None, help="default: the model's example_prompt.txt")
    ap.add_argument("--threads", type=int, default=0, help="matmul threads (0: one per CPU)")
    ap.add_argument("--bin", default=str(ROOT / "build" / "release" / "g4"))
    a = ap.parse_args()
    prompt_file = a.prompt or os.path.join(a.model, "example_prompt.txt")
    prompt = Path(prompt_file).read_text()

    tmp = tempfile.mkdtemp()
    exe = os.path.join(tmp, "gen_c")
    src = os.path.join(tmp, "gen_c.c")
    Path(src).write_text(C_SOURCE)
    subprocess.run(
        ["cc", "-std=c11", "-O2", "-I", str(ROOT / "include"), "-o", exe, src, str(ROOT / "build" / "release" / "libg4.a"),
         "-lcjson", "-lpcre2-8", "-lm", "-pthread"],
        check=True,
    )

    model = g4.Model(a.model, threads=a.threads or None)
    want = model.generate(prompt, temperature=0)  # warm-up, and the answer both sides must give
    n_tokens = len(model.complete(prompt, temperature=0).tokens)

    # the C program keeps its process (and model) for all its reps, as Python does; the two sides
    # alternate, so that the machine's load falls on both alike
    cp = subprocess.Popen([exe, a.model, prompt_file, str(a.threads)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)

    def c_rep() -> float:
        cp.stdin.write("go\n")
        cp.stdin.flush()
        secs, toks, nbytes = cp.stdout.readline().split()
        assert int(toks) == n_tokens and int(nbytes) == len(want.encode()), (toks, nbytes)
        return float(secs)

    c_rep()  # warm-up
    py_gen, py_engine, c_gen = [], [], []
    block = 5  # reps in a row of one side: their caches stay warm as in a loop of generations
    while len(c_gen) < a.reps:
        for _ in range(block):
            c_gen.append(c_rep())
        for _ in range(block):
            t0 = time.perf_counter()
            c = model.complete(prompt, temperature=0)
            t1 = time.perf_counter()
            assert c.text == want and len(c.tokens) == n_tokens
            py_gen.append(t1 - t0)
            py_engine.append(c.prefill_s + c.decode_s)
    c_text = cp.communicate("")[0]
    assert c_text == want, (c_text, want)
    gen_only = []
    for _ in range(a.reps):
        t0 = time.perf_counter()
        out = model.generate(prompt, temperature=0)
        gen_only.append(time.perf_counter() - t0)
        assert out == want

    py_script = (
        "import sys, g4\n"
        "m = g4.Model(sys.argv[1], threads=int(sys.argv[3]) or None)\n"
        "sys.stdout.write(m.generate(open(sys.argv[2]).read(), temperature=0) + '\\n')\n"
    )
    cli_cmd = [a.bin, "run", "-m", a.model, "--temp", "0", "-f", prompt_file] + (["-t", str(a.threads)] if a.threads else [])
    py_cmd = [sys.executable, "-c", py_script, a.model, prompt_file, str(a.threads)]
    import_cmd = [sys.executable, "-c", "import g4"]
    cli_p, py_p, import_p = [], [], []
    for _ in range(a.reps):
        for cmd, acc in ((cli_cmd, cli_p), (py_cmd, py_p), (import_cmd, import_p)):
            t0 = time.perf_counter()
            out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
            acc.append(time.perf_counter() - t0)
            assert out == (want + "\n" if cmd is not import_cmd else ""), out

    print(f"model {a.model}, prompt {prompt_file}: {n_tokens} generated tokens, {g4.threads()} thread(s), {a.reps} reps")
    print(f"  generation, C (g4 run's path)  {ms(c_gen)}")
    print(f"  generation, Python complete()  {ms(py_gen)}")
    print(f"  generation, Python generate()  {ms(gen_only)} (after the others, not alternated)")
    print(f"  engine time in the Python call {ms(py_engine)}")
    over = [p - e for p, e in zip(py_gen, py_engine)]
    for what, f in (("median", statistics.median), ("min", min)):
        c_, p_ = f(c_gen), f(py_gen)
        print(f"  Python over C ({what:6s}) {1e3 * (p_ - c_):+8.3f} ms per generation ({100 * (p_ / c_ - 1):+.1f} %), "
              f"{1e6 * (p_ - c_) / n_tokens:+.1f} us per generated token")
    print(f"  Python call minus the engine's time in it {ms(over)}")
    print(f"  process, g4 run                {ms(cli_p)}")
    print(f"  process, python3 -c (g4)       {ms(py_p)}")
    print(f"    of which python3 -c 'import g4' {ms(import_p)}")


if __name__ == "__main__":
    main()
