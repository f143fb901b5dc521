# The runtime library's sources (src/, libg4), one list for the build (Makefile) and the fuzz targets (fuzz/Makefile).
LIB_SRC = \
  src/util/err.c src/util/file.c src/util/select.c \
  src/format/safetensors.c src/format/config.c \
  src/quant/pack.c src/quant/int8.c src/quant/dynamic.c \
  src/kernels/ref.c src/kernels/portable.c src/kernels/dispatch.c src/kernels/codes_f32.c src/kernels/codes_argmax.c src/kernels/attention.c src/kernels/avx2.c src/kernels/avx512vnni.c src/kernels/amx.c src/kernels/amx_pack.c src/kernels/avxvnni.c src/kernels/cpu_x86.c src/kernels/neon.c src/kernels/pool.c \
  src/model/model.c src/model/session.c src/model/decode.c src/model/forward.c src/model/options.c src/model/lmhead.c src/model/linear.c src/model/layer.c src/model/profile.c src/model/describe.c src/model/draft.c src/model/modules.c \
  src/generate/sampler.c src/generate/stepper.c src/generate/generate.c src/generate/grammar.c src/generate/json_schema.c src/generate/grammar_cache.c \
  src/text/tokenizer.c src/text/chat.c src/text/reply.c src/text/conversation.c src/text/tools.c
# a checkpoint folder opened whole (g4_checkpoint_open: model, tokenizer, drafter)
LIB_SRC += src/model/checkpoint.c
# The development library (dev/, libg4dev.a, its header dev/g4dev.h): what no inference path uses,
# the GSM8K harness, the checkpoint writers (synth, quantize, their block quantizer and safetensors
# writer), tensor capture and .npy files. The g4 command and the tests link it; libg4.so never holds it.
DEV_SRC = dev/util/npy.c dev/format/safetensors_write.c dev/quant/blockq.c \
  dev/model/capture.c dev/model/synth.c dev/model/quantize.c \
  dev/eval/gsm8k.c dev/eval/results.c dev/eval/harness.c dev/eval/merge.c
# what g4 bench measures inside the runtime (kernel levels by name, the towers' encodes, one linear)
DEV_SRC += dev/bench/measure.c
# Image and audio input (issue 35): decoding (libpng, libjpeg-turbo; WAV), resampling (libsoxr), the
# log-mel FFT (kissfft), the towers. Kept out of LIB_SRC so the aarch64 cross build (neon-test), which
# has only cjson/pcre2 arm64 copies, needs none of their libraries.
MEDIA_SRC = src/model/tower.c src/vision/image.c src/vision/preprocess.c src/vision/tower.c src/vision/api.c \
  src/audio/wav.c src/audio/resample.c src/audio/mel.c src/audio/subsample.c src/audio/attention.c src/audio/lconv.c src/audio/tower.c
MEDIA_LIBS = -lpng -ljpeg -lsoxr -lkissfft-float
