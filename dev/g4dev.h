/* g4's development library (libg4dev.a, dev/): what the g4 command and the tests need beyond the
 * runtime's public API (include/g4.h) and no inference path uses. libg4.so never holds any of it.
 *   - eval/:   the GSM8K harness (`g4 eval`): data, extraction, batched greedy runs, records,
 *              scoring, shard merging, the paired comparison;
 *   - model/:  the checkpoint writers (`g4 synth`'s random checkpoints, `g4 quantize --q4_0`),
 *              and capture of a forward pass's tensors (`g4 run --dump-dir`);
 *   - bench/:  what `g4 bench` measures inside the runtime (measure.h: kernel levels by name, the
 *              towers' encodes, one linear timed alone); stream_bw.h, its bandwidth probe, is
 *              header-only and included by the bench alone;
 *   - quant/, format/, util/: their block quantizer, safetensors writer and .npy writer;
 *   - and the runtime's error, file and text-buffer helpers the tools share (g4_fail, g4_warn,
 *     g4_read_file, g4_path_join, g4_textbuf, ...: in libg4.a, not exported by libg4.so).
 * The tools compile with -Iinclude -Idev only: this header is their one way into src/, by the
 * relative includes below. Link libg4dev.a before libg4.a. */
#ifndef G4_DEV_H
#define G4_DEV_H

#include "g4.h"

#include "eval/harness.h"
#include "eval/results.h"
#include "model/capture.h"
#include "model/quantize.h"
#include "model/synth.h"
#include "bench/measure.h"
#include "../src/text/textbuf.h"
#include "../src/util/err.h"
#include "../src/util/file.h"
#include "util/npy.h"

#endif
