#!/usr/bin/env python3
"""Build one-operation LiteRT models and record what every LiteRT CPU kernel path computes.

The result, tests/litert/litert_fc.json, is the reference that tests/test_litert.c holds
g4's integer arithmetic (src/quant/int8.c) and its dynamic-int8 lm_head emulation
(src/quant/dynamic.c) against. LiteRT itself is the oracle here: the models are written with
the flatbuffer schema that ships in the `ai-edge-litert` wheel (no TensorFlow, no converter)
so that every tensor type, scale and packing is exactly what we say it is.

Model kinds (one operator each, except `chain`):
  fc        int8 [rows, in] --FULLY_CONNECTED(int8/int4/int2 per-channel weights)--> int8
  quantize  f32 --QUANTIZE--> int8
  chain     f32 --QUANTIZE--> int8 --FULLY_CONNECTED--> int8 (both tensors are outputs)
  dynamic   f32 --FULLY_CONNECTED(int weights)--> f32: the lm_head case; LiteRT quantizes the
            input per row at run time (XNNPACK qd8 / TFLite "hybrid" kernels)

Paths: the Interpreter with its three op resolvers (default = XNNPACK delegate applied,
builtin optimized kernels without the delegate, reference kernels) and the CompiledModel API
with each CpuKernelMode, plus YNNPACK. Everything is single-threaded and seeded, so running
this twice gives the same file byte for byte (on the same LiteRT wheel and CPU family).

Usage (from the repository root):
  python3 -m venv /tmp/litert-venv && /tmp/litert-venv/bin/pip install -r tools/ref/requirements.txt
  /tmp/litert-venv/bin/python tools/ref/make_litert_fc.py            # writes tests/litert/litert_fc.json
"""
import argparse
import contextlib
import json
import os
import platform
import re
import struct
import sys
from importlib import metadata
from pathlib import Path

import numpy as np

from ai_edge_litert import schema_py_generated as fb
from ai_edge_litert.interpreter import Interpreter, OpResolverType
from ai_edge_litert.tools import flatbuffer_utils

REPO = Path(__file__).resolve().parents[2]
F32 = np.float32
SEED = 20261105

# ------------------------------------------------------------------ encoding ----------------
# f32 values are stored as IEEE-754 bit patterns (8 hex digits, most significant first) so
# that no decimal round trip can blur the last bit; int8 values as two's-complement bytes.


def f32_hex(v):
    return '%08x' % int(np.asarray(v, dtype='<f4').reshape(()).view('<u4'))


def f32_row_hex(a):
    return ''.join('%08x' % int(u) for u in np.asarray(a, dtype='<f4').reshape(-1).view('<u4'))


def i8_row_hex(a):
    return np.asarray(a).astype(np.int8).view(np.uint8).tobytes().hex()


# ------------------------------------------------------------------ inputs ------------------


def shared_dir():
    env = os.environ.get('G4_SHARED')
    return Path(env) if env else REPO.parent / 'shared'


def read_safetensors(path, names):
    """Only the named tensors, via json + struct: model.safetensors holds BF16 tensors that
    safetensors.numpy cannot load, and we need none of them."""
    blob = Path(path).read_bytes()
    (n,) = struct.unpack('<Q', blob[:8])
    header = json.loads(blob[8:8 + n])
    dtypes = {'F32': '<f4', 'U8': 'u1', 'I8': 'i1', 'I32': '<i4', 'U32': '<u4'}
    out = {}
    for name in names:
        h = header[name]
        b, e = h['data_offsets']
        out[name] = np.frombuffer(blob[8 + n + b:8 + n + e], dtypes[h['dtype']]).reshape(h['shape']).copy()
    return out


# ------------------------------------------------------------------ weight packing ----------

QRANGE = {8: (-127, 127), 4: (-8, 7), 2: (-2, 1)}


def pack_litert(codes, bits):
    """LiteRT's buffer: the [out, in] tensor flattened row-major, two's-complement fields,
    element i at bits [b*i, b*i+b) of byte i*b/8. Rows are not byte-aligned when in*b % 8 != 0."""
    flat = np.asarray(codes, np.int64).reshape(-1)
    if bits == 8:
        return flat.astype(np.int8).view(np.uint8).tobytes()
    per = 8 // bits
    out = bytearray((flat.size + per - 1) // per)
    mask = (1 << bits) - 1
    for i, c in enumerate(flat):
        out[i // per] |= (int(c) & mask) << (bits * (i % per))
    return bytes(out)


def pack_g4(codes, bits):
    """The checkpoint's layout (src/quant/pack.h): one padded byte row per output channel,
    offset-binary fields (code + 2^(b-1)), LSB first; int8 rows are plain two's complement."""
    rows = []
    for row in np.asarray(codes, np.int64):
        if bits == 8:
            rows.append(row.astype(np.int8).view(np.uint8).tobytes().hex())
            continue
        per = 8 // bits
        out = bytearray((row.size + per - 1) // per)
        for i, c in enumerate(row):
            out[i // per] |= (int(c) + (1 << (bits - 1))) << (bits * (i % per))
        rows.append(bytes(out).hex())
    return rows


# ------------------------------------------------------------------ model building ----------

WEIGHT_TYPE = {8: fb.TensorType.INT8, 4: fb.TensorType.INT4, 2: fb.TensorType.INT2}


class Graph:
    def __init__(self):
        self.tensors, self.buffers, self.ops, self.opcodes = [], [fb.BufferT()], [], []

    def tensor(self, name, shape, ttype, scale=None, data=None, per_channel=False):
        t = fb.TensorT()
        t.name, t.shape, t.type, t.buffer = name, list(shape), ttype, 0
        if data is not None:
            b = fb.BufferT()
            b.data = list(data)
            self.buffers.append(b)
            t.buffer = len(self.buffers) - 1
        if scale is not None:
            q = fb.QuantizationParametersT()
            q.scale = [float(s) for s in np.atleast_1d(scale)]
            q.zeroPoint = [0] * len(q.scale)  # symmetric everywhere, as in the checkpoint
            q.quantizedDimension = 0          # FC filters: per output channel
            t.quantization = q
        self.tensors.append(t)
        return len(self.tensors) - 1

    def op(self, code, inputs, outputs, options_type=0, options=None):
        if code not in self.opcodes:
            self.opcodes.append(code)
        o = fb.OperatorT()
        o.opcodeIndex, o.inputs, o.outputs = self.opcodes.index(code), list(inputs), list(outputs)
        if options is not None:
            o.builtinOptionsType, o.builtinOptions = options_type, options
        self.ops.append(o)

    def build(self, inputs, outputs):
        m = fb.ModelT()
        m.version, m.description = 3, 'g4 tools/ref/make_litert_fc.py'
        for code in self.opcodes:
            oc = fb.OperatorCodeT()
            oc.builtinCode, oc.deprecatedBuiltinCode, oc.version = code, min(code, 127), 1
            m.operatorCodes = (m.operatorCodes or []) + [oc]
        sg = fb.SubGraphT()
        sg.name, sg.tensors, sg.operators, sg.inputs, sg.outputs = 'main', self.tensors, self.ops, inputs, outputs
        m.subgraphs, m.buffers = [sg], self.buffers
        return bytes(flatbuffer_utils.convert_object_to_bytearray(m))


def fc_options(asymmetric=False):
    o = fb.FullyConnectedOptionsT()
    o.asymmetricQuantizeInputs = asymmetric
    return o


def fc_model(c, float_in=False, asymmetric=False):
    g = Graph()
    rows, k, n = c['rows'], c['in'], c['out']
    if float_in:
        x = g.tensor('x', [rows, k], fb.TensorType.FLOAT32)
    else:
        x = g.tensor('x', [rows, k], fb.TensorType.INT8, c['s_in'])
    w = g.tensor('w', [n, k], WEIGHT_TYPE[c['bits']], c['w_scale'], pack_litert(c['codes'], c['bits']))
    if float_in:
        y = g.tensor('y', [rows, n], fb.TensorType.FLOAT32)
    else:
        y = g.tensor('y', [rows, n], fb.TensorType.INT8, c['s_out'])
    g.op(fb.BuiltinOperator.FULLY_CONNECTED, [x, w, -1], [y],
         fb.BuiltinOptions.FullyConnectedOptions, fc_options(asymmetric))
    return g.build([x], [y])


def quantize_model(rows, k, s):
    g = Graph()
    x = g.tensor('x', [rows, k], fb.TensorType.FLOAT32)
    q = g.tensor('y', [rows, k], fb.TensorType.INT8, s)
    g.op(fb.BuiltinOperator.QUANTIZE, [x], [q])
    return g.build([x], [q])


def chain_model(c):
    g = Graph()
    rows, k, n = c['rows'], c['in'], c['out']
    x = g.tensor('x', [rows, k], fb.TensorType.FLOAT32)
    xq = g.tensor('xq', [rows, k], fb.TensorType.INT8, c['s_in'])
    w = g.tensor('w', [n, k], WEIGHT_TYPE[c['bits']], c['w_scale'], pack_litert(c['codes'], c['bits']))
    y = g.tensor('y', [rows, n], fb.TensorType.INT8, c['s_out'])
    g.op(fb.BuiltinOperator.QUANTIZE, [x], [xq])
    g.op(fb.BuiltinOperator.FULLY_CONNECTED, [xq, w, -1], [y],
         fb.BuiltinOptions.FullyConnectedOptions, fc_options())
    return g.build([x], [xq, y])


# ------------------------------------------------------------------ running -----------------

PATHS = [
    ('xnnpack', 'Interpreter, op resolver BUILTIN (the default): the XNNPACK delegate is applied'),
    ('builtin', 'Interpreter, op resolver BUILTIN_WITHOUT_DEFAULT_DELEGATES: TFLite optimized kernels'),
    ('reference', 'Interpreter, op resolver BUILTIN_REF: TFLite reference kernels'),
    ('cm_xnnpack', 'CompiledModel, CpuKernelMode.DELEGATE (LiteRT CPU default, XNNPACK)'),
    ('cm_builtin', 'CompiledModel, CpuKernelMode.BUILTIN'),
    ('cm_reference', 'CompiledModel, CpuKernelMode.REFERENCE'),
    ('cm_ynnpack', 'CompiledModel, CpuKernelMode.DELEGATE with enable_ynnpack=True'),
]


@contextlib.contextmanager
def quiet_stderr():
    """LiteRT logs every accelerator and plugin it loads from C++ straight to fd 2."""
    sys.stderr.flush()
    saved = os.dup(2)
    with open(os.devnull, 'wb') as null:
        os.dup2(null.fileno(), 2)
        try:
            yield
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)


def clean_error(exc):
    """A deterministic one-line reason: LiteRT's exception text with pointers scrubbed (they
    change from run to run). Its C++ log adds nothing for the refusals seen so far."""
    text = '%s: %s' % (type(exc).__name__, ' '.join(str(exc).split()))
    return re.sub(r'0x[0-9a-fA-F]+', '0x?', text)[:600]


_ENV = None


def litert_env():
    global _ENV
    if _ENV is None:
        import ai_edge_litert
        from ai_edge_litert.environment import Environment, EnvironmentOptions
        _ENV = Environment.create(options=EnvironmentOptions(
            runtime_path=os.path.dirname(os.path.abspath(ai_edge_litert.__file__))))
    return _ENV


def run_interpreter(model, resolver, x):
    it = Interpreter(model_content=model, experimental_op_resolver_type=resolver, num_threads=1)
    it.allocate_tensors()
    it.set_tensor(it.get_input_details()[0]['index'], x)
    it.invoke()
    outs = [it.get_tensor(d['index']).copy() for d in it.get_output_details()]
    # A DELEGATE node exists only if XNNPACK claimed the operators; otherwise the builtin
    # kernels ran them, which must be recorded rather than passed off as XNNPACK output.
    delegated = any(d['op_name'] == 'DELEGATE' for d in it._get_ops_details())
    return outs, delegated


def run_compiled(model, mode, ynnpack, x, out_specs):
    from ai_edge_litert.compiled_model import CompiledModel
    from ai_edge_litert.hardware_accelerator import HardwareAccelerator
    from ai_edge_litert.options import CpuOptions, Options
    opts = Options(hardware_accelerators=HardwareAccelerator.CPU,
                   cpu_options=CpuOptions(num_threads=1, kernel_mode=mode, enable_ynnpack=ynnpack))
    cm = CompiledModel.from_buffer(model, environment=litert_env(), options=opts)
    ib, ob = cm.create_input_buffers(0), cm.create_output_buffers(0)
    ib[0].write(np.ascontiguousarray(x))
    cm.run_by_index(0, ib, ob)
    outs = [b.read(int(np.prod(shape)), dtype).reshape(shape).copy() for b, (shape, dtype) in zip(ob, out_specs)]
    return outs, bool(cm.is_fully_accelerated())


def run_all_paths(model, x, out_names, out_specs, encode):
    """results[path] = {status, delegated, <outputs> | same_as | error}."""
    from ai_edge_litert.cpu_kernel_mode import CpuKernelMode
    runners = {
        'xnnpack': lambda: run_interpreter(model, OpResolverType.BUILTIN, x),
        'builtin': lambda: run_interpreter(model, OpResolverType.BUILTIN_WITHOUT_DEFAULT_DELEGATES, x),
        'reference': lambda: run_interpreter(model, OpResolverType.BUILTIN_REF, x),
        'cm_xnnpack': lambda: run_compiled(model, CpuKernelMode.DELEGATE, False, x, out_specs),
        'cm_builtin': lambda: run_compiled(model, CpuKernelMode.BUILTIN, False, x, out_specs),
        'cm_reference': lambda: run_compiled(model, CpuKernelMode.REFERENCE, False, x, out_specs),
        'cm_ynnpack': lambda: run_compiled(model, CpuKernelMode.DELEGATE, True, x, out_specs),
    }
    results, raw = {}, {}
    for name, _ in PATHS:
        with quiet_stderr():
            try:
                outs, delegated = runners[name]()
                err = None
            except Exception as exc:  # a refusal is a result to record, not a crash
                err = exc
        if err is not None:
            results[name] = {'status': 'refused', 'error': clean_error(err)}
            continue
        r = {'status': 'ok'}
        if name in ('xnnpack', 'cm_xnnpack', 'cm_ynnpack'):
            r['delegated'] = delegated
        # Bitwise equality (so -0 and +0 differ): only an identical result may be shared.
        same = next((p for p, o in raw.items()
                     if all(a.shape == b.shape and a.tobytes() == b.tobytes() for a, b in zip(o, outs))), None)
        if same is not None:
            r['same_as'] = same
        else:
            for n_, o in zip(out_names, outs):
                r[n_] = [encode(row) for row in o]
        raw[name] = outs
        results[name] = r
    return results, raw


# ------------------------------------------------------------------ rule emulation ----------
# Only used to *choose* inputs that separate the requantization rules (near-ties). Whether a
# LiteRT path follows a rule is decided by the C test from LiteRT's recorded outputs.


def quantize_multiplier(m):
    if m == 0:
        return 0, 0
    q, e = np.frexp(m)
    qf = int(np.floor(q * 2.0 ** 31 + 0.5))  # q > 0: round half away from zero
    if qf == 2 ** 31:
        qf //= 2
        e += 1
    if e < -31:
        return 0, 0
    return qf, int(e)


def requant_rules(acc, s_x, s_w, s_y):
    acc = np.asarray(acc, np.int64)
    s_x, s_w, s_y = F32(s_x), F32(s_w), F32(s_y)
    scale = F32(F32(s_x * s_w) / s_y)
    mult, shift = quantize_multiplier(float(s_x) * float(s_w) / float(s_y))
    assert shift <= 0
    right = -shift
    ab = acc * mult
    s = ab + np.where(ab >= 0, 1 << 30, 1 - (1 << 30))
    hm = np.where(s >= 0, s >> 31, -((-s) >> 31))  # C division truncates toward zero
    mask = (1 << right) - 1
    dbl = (hm >> right) + ((hm & mask) > ((mask >> 1) + (hm < 0))).astype(np.int64)
    t = 31 - shift
    single = (ab + (1 << (t - 1))) >> t
    h = (2 * ab + (1 << 31)) >> 32
    neon = (h + (1 << (right - 1))) >> right if right else h
    out = {
        'f32': np.rint((acc.astype(F32) * scale).astype(F32)).astype(np.int64),
        'f64': np.rint(acc.astype(np.float64) * float(s_x) * float(s_w) / float(s_y)).astype(np.int64),
        'tfl_double': dbl, 'tfl_single': single, 'tfl_neon_4row': neon,
    }
    return {k: np.clip(v, -128, 127) for k, v in out.items()}


CATEGORIES = [('f32', 'f64'), ('tfl_single', 'tfl_double'), ('tfl_neon_4row', 'tfl_double'),
              ('f32', 'tfl_single'), ('tfl_neon_4row', 'tfl_single')]


def hit(base, w, target, rng):
    """Move a few coordinates of base (int8 codes) so that w . x == target, or None."""
    x = base.astype(np.int64).copy()
    nz = np.flatnonzero(w)
    for _ in range(4):
        for j in nz[np.argsort(-np.abs(w[nz]), kind='stable')]:
            d = target - int(w @ x)
            if d == 0:
                return x
            new = int(np.clip(x[j] + int(d / w[j]), -128, 127))
            x[j] = new
    d = target - int(w @ x)
    if d == 0:
        return x
    for j in rng.permutation(nz):
        for k in nz:
            if k == j:
                continue
            for a in range(-48, 49):
                rem = d - int(w[j]) * a
                if rem % int(w[k]) == 0:
                    b = rem // int(w[k])
                    if -128 <= x[j] + a <= 127 and -128 <= x[k] + b <= 127:
                        x[j] += a
                        x[k] += b
                        return x
    return None


def targeted_rows(c, bases, count, rng):
    """Rows that put one channel's accumulator exactly on an input where two LiteRT
    requantization rules disagree, each close to a real activation row."""
    w = np.asarray(c['codes'], np.int64)
    lim = int(min(128 * np.abs(w).sum(axis=1).max(), 1 << 17))
    accs = np.arange(-lim, lim + 1)
    disagree = []
    for o in range(c['out']):
        r = requant_rules(accs, c['s_in'], c['w_scale'][o], c['s_out'])
        disagree.append({cat: accs[r[cat[0]] != r[cat[1]]] for cat in CATEGORIES})
    rows, notes = [], []
    channels = rng.permutation(c['out'])
    ci = 0
    for t in range(count):
        cat = CATEGORIES[t % len(CATEGORIES)]
        base = bases[t % len(bases)]
        for _ in range(c['out']):
            o = int(channels[ci % c['out']])
            ci += 1
            cand = disagree[o][cat]
            if cand.size == 0:
                continue
            acc0 = int(w[o] @ base)
            for target in cand[np.argsort(np.abs(cand - acc0), kind='stable')[:8]]:
                x = hit(base, w[o], int(target), rng)
                if x is not None:
                    rows.append(x)
                    notes.append('targeted: channel %d acc %d (%s != %s)' % (o, int(target), cat[0], cat[1]))
                    break
            else:
                continue
            break
    return rows, notes


# ------------------------------------------------------------------ cases -------------------

UNIT_NOTES = ['unit_linear row 0: real activation (prompt position 5)',
              'unit_linear row 1: real activation (prompt position 23)',
              'unit_linear row 2: wide normal, ~7% clamped',
              'unit_linear row 3: exact x/s_in ties',
              'unit_linear row 4: special values (0, -0, +-1e-30, +-127 s, +-128 s, +-1e4)',
              'unit_linear row 5: uniform in +-130 s']


def unit_case(u, name, bits):
    p = name + '.'
    return {
        'source': 'shared/fixtures/tiny-mobile/unit_linear.safetensors case %s' % name,
        'bits': bits,
        'codes': u[p + 'weight_codes'].astype(np.int64),
        'w_scale': u[p + 'weight_scale'].reshape(-1).astype(F32),
        's_in': F32(u[p + 'input_activation_scale']),
        's_out': F32(u[p + 'output_activation_scale']),
        'x': u[p + 'x'].astype(F32),
        'x_codes': u[p + 'x_codes'].astype(np.int64),
    }


def weight_fields(c):
    return {
        'bits': c['bits'], 'in': c['in'], 'out': c['out'],
        'w_scale': f32_row_hex(c['w_scale']),
        'weight_g4': pack_g4(c['codes'], c['bits']),
        'weight_litert': pack_litert(c['codes'], c['bits']).hex(),
    }


def fc_case(name, c, rows, notes):
    c = dict(c, rows=len(rows), **{'in': c['codes'].shape[1], 'out': c['codes'].shape[0]})
    x = np.asarray(rows, np.int64).astype(np.int8)
    results, _ = run_all_paths(fc_model(c), x, ['y'], [((c['rows'], c['out']), np.int8)], i8_row_hex)
    entry = {'name': name, 'kind': 'fc', 'source': c['source'], 'rows': c['rows']}
    entry.update(weight_fields(c))
    entry.update({'s_in': f32_hex(c['s_in']), 's_out': f32_hex(c['s_out']),
                  'x_codes': [i8_row_hex(r) for r in x], 'row_notes': notes, 'results': results})
    return entry


def quantize_case(name, c):
    x = c['x']
    results, _ = run_all_paths(quantize_model(x.shape[0], x.shape[1], c['s_in']), x, ['y'],
                               [(x.shape, np.int8)], i8_row_hex)
    return {'name': name, 'kind': 'quantize', 'source': c['source'], 'rows': x.shape[0],
            'in': x.shape[1], 's': f32_hex(c['s_in']), 'x': [f32_row_hex(r) for r in x],
            'row_notes': UNIT_NOTES, 'results': results}


def chain_case(name, c):
    x = c['x']
    c = dict(c, rows=x.shape[0], **{'in': x.shape[1], 'out': c['codes'].shape[0]})
    results, _ = run_all_paths(chain_model(c), x, ['xq', 'y'],
                               [((c['rows'], c['in']), np.int8), ((c['rows'], c['out']), np.int8)],
                               i8_row_hex)
    entry = {'name': name, 'kind': 'chain', 'source': c['source'], 'rows': c['rows']}
    entry.update(weight_fields(c))
    entry.update({'s_in': f32_hex(c['s_in']), 's_out': f32_hex(c['s_out']),
                  'x': [f32_row_hex(r) for r in x], 'row_notes': UNIT_NOTES, 'results': results})
    return entry


def dynamic_case(name, c, x, notes, asymmetric=False):
    c = dict(c, rows=x.shape[0], **{'in': x.shape[1], 'out': c['codes'].shape[0]})
    results, _ = run_all_paths(fc_model(c, float_in=True, asymmetric=asymmetric), x, ['y'],
                               [((c['rows'], c['out']), np.float32)], f32_row_hex)
    entry = {'name': name, 'kind': 'dynamic', 'source': c['source'], 'rows': c['rows'],
             'asymmetric_quantize_inputs': asymmetric}
    entry.update(weight_fields(c))
    entry.update({'x': [f32_row_hex(r) for r in x], 'row_notes': notes, 'results': results})
    return entry


def qd8_codes(row, exact_recip):
    """XNNPACK's per-row asymmetric quantization, both ways its convert step may form the
    quantization multiplier; used only to find a row on which the two differ."""
    rmin, rmax = min(F32(0), row.min()), max(F32(0), row.max())
    m = F32(1) if rmin == rmax else F32(F32(255) / F32(rmax - rmin))
    dmin, dmax = F32(rmin * m), F32(rmax * m)
    zp = F32(-128) - dmin if F32(F32(-128) + dmin) + F32(F32(127) + dmax) > 0 else F32(127) - dmax
    zp = int(np.rint(min(max(zp, F32(-128)), F32(127))))
    qs = m if exact_recip else F32(F32(1) / F32(F32(1) / m))
    return np.clip(np.rint((row * qs).astype(F32)) + zp, -128, 127)


def dynamic_rows(real, k, rng):
    """Real lm_head inputs plus rows aimed at the dynamic quantizers' edge cases."""
    rows, notes = [], []
    for i, r in real:
        rows.append(r)
        notes.append('final_norm row %d of golden_fakequant_full (real lm_head input)' % i)
    t = rng.integers(-127, 127, k).astype(F32) + F32(0.5)
    t[0], t[1] = F32(127), F32(-3)
    rows.append(t)
    notes.append('symmetric ties: max |x| = 127 so x * 127/range = k + 0.5 exactly')
    t = (rng.integers(-128, 127, k).astype(F32) + F32(0.5)) * F32(0.125)
    t[0], t[1] = F32(-16), F32(15.875)
    rows.append(t)
    notes.append('asymmetric ties: range [-16, 15.875] gives 255/range = 8, x * 8 = k + 0.5')
    rows.append(np.zeros(k, F32))
    notes.append('all zeros')
    rows.append(np.full(k, -0.0, F32))
    notes.append('all negative zeros')
    rows.append(np.abs(real[0][1]) + F32(0.25))
    notes.append('all positive (row min > 0): |final_norm| + 0.25')
    rows.append(-np.abs(real[1][1]) - F32(0.25))
    notes.append('all negative (row max < 0)')
    t = np.zeros(k, F32)
    t[3] = F32(3.7)
    rows.append(t)
    notes.append('one nonzero element')
    t = real[2][1].copy()
    t[5] = F32(1000)
    rows.append(t)
    notes.append('one outlier (1000) over a real row')
    rows.append((rng.standard_normal(k) * 1e-3).astype(F32))
    notes.append('tiny values (normal * 1e-3)')
    for _ in range(20000):
        t = (rng.standard_normal(k) * rng.uniform(0.1, 10)).astype(F32)
        t[0] = abs(t[0]) + rng.uniform(0, 3)
        if not np.array_equal(qd8_codes(t, True), qd8_codes(t, False)):
            rows.append(t)
            notes.append('1/(1/m) != m: the two qd8 multiplier forms give different codes')
            break
    return np.asarray(rows, F32), notes


def build(shared):
    rng = np.random.default_rng(SEED)
    tiny = shared / 'fixtures' / 'tiny-mobile'
    names = [p + '.' + f for p in ('w8', 'w4', 'w2') for f in
             ('weight_codes', 'weight_scale', 'input_activation_scale', 'output_activation_scale', 'x', 'x_codes')]
    u = read_safetensors(tiny / 'unit_linear.safetensors', names)
    unit = {n: unit_case(u, n, b) for n, b in (('w8', 8), ('w4', 4), ('w2', 2))}
    cases = []

    for n in ('w8', 'w4', 'w2'):
        c = dict(unit[n], **{'in': unit[n]['codes'].shape[1], 'out': unit[n]['codes'].shape[0]})
        bases = [c['x_codes'][0], c['x_codes'][1]]
        trows, tnotes = targeted_rows(c, bases, 24, rng)
        cases.append(fc_case('fc_' + n, c, list(c['x_codes']) + trows, UNIT_NOTES + tnotes))

    # Widths XNNPACK's low-bit FC does not take (int4 needs an even width, int2 a multiple
    # of 4): the first columns of the w4 / w2 cases.
    for n, k in (('w4', 95), ('w2', 62)):
        c = dict(unit[n], codes=unit[n]['codes'][:, :k], x_codes=unit[n]['x_codes'][:, :k],
                 source=unit[n]['source'] + ', first %d input columns' % k)
        c.update({'in': k, 'out': c['codes'].shape[0]})
        trows, tnotes = targeted_rows(c, [c['x_codes'][0], c['x_codes'][1]], 8, rng)
        cases.append(fc_case('fc_%s_k%d' % (n, k), c, list(c['x_codes']) + trows, UNIT_NOTES + tnotes))

    # Power-of-two scales make acc * M exact, so requantization meets exact .5 ties.
    k, n = 64, 32
    pow2 = {'source': 'synthetic: s_in = 2^-5, s_out = 2^-4, s_w = 2^-6..2^-9 (exact requant ties)',
            'bits': 4, 'codes': rng.integers(-8, 8, (n, k)),
            'w_scale': np.array([2.0 ** -(6 + o % 4) for o in range(n)], F32),
            's_in': F32(2.0 ** -5), 's_out': F32(2.0 ** -4), 'in': k, 'out': n}
    bases = [rng.integers(-40, 41, k) for _ in range(4)]
    trows, tnotes = targeted_rows(pow2, bases, 20, rng)
    cases.append(fc_case('fc_pow2_w4', pow2, bases + trows,
                         ['random codes in [-40, 40]'] * 4 + tnotes))

    for n in ('w8', 'w4', 'w2'):
        cases.append(quantize_case('quantize_' + n, unit[n]))
    for n in ('w8', 'w4', 'w2'):
        cases.append(chain_case('chain_' + n, unit[n]))

    # lm_head: float input, int2 weights, float logits (checkpoint scales 0 = unquantized).
    m = read_safetensors(tiny / 'model.safetensors', ['lm_head.weight', 'lm_head.weight_scale'])
    g = read_safetensors(tiny / 'golden_fakequant_full.safetensors', ['final_norm'])
    packed = m['lm_head.weight']
    k = packed.shape[1] * 4
    codes = np.stack([((packed[:, j // 4] >> (2 * (j % 4))) & 3).astype(np.int64) - 2 for j in range(k)], axis=1)
    head = {'source': 'shared/fixtures/tiny-mobile/model.safetensors lm_head (int2, 512 x 64)',
            'bits': 2, 'codes': codes, 'w_scale': m['lm_head.weight_scale'].reshape(-1).astype(F32)}
    fn = g['final_norm'].astype(F32)
    x, notes = dynamic_rows([(i, fn[i]) for i in (0, 7, 15, 23)], k, rng)
    cases.append(dynamic_case('dynamic_lmhead_w2', head, x, notes))
    cases.append(dynamic_case('dynamic_lmhead_w2_asym', head, x, notes, asymmetric=True))
    for n in ('w4', 'w8'):
        cases.append(dynamic_case('dynamic_' + n, unit[n], unit[n]['x'], UNIT_NOTES))
    return cases


def main():
    ap = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    ap.add_argument('--out', default=str(REPO / 'tests' / 'litert' / 'litert_fc.json'))
    args = ap.parse_args()
    cases = build(shared_dir())
    doc = {
        'about': 'What LiteRT CPU kernels compute for one-operation FC / QUANTIZE models. '
                 'Generated by tools/ref/make_litert_fc.py; do not edit by hand.',
        'litert': {'package': 'ai-edge-litert', 'version': metadata.version('ai-edge-litert'),
                   'machine': platform.machine()},
        'encoding': {
            'f32': '8 hex digits per element: the IEEE-754 bit pattern, most significant digit first',
            'int8': '2 hex digits per element: the two\'s-complement byte',
            'weight_g4': 'one hex row per output channel in the checkpoint layout (src/quant/pack.h)',
            'weight_litert': 'the .tflite buffer: [out, in] flattened, two\'s-complement fields, LSB first',
            'results': 'status ok | refused (error says why); delegated: whether XNNPACK/YNNPACK '
                       'claimed the op (false = the builtin kernels ran it); same_as: outputs are '
                       'bit-identical to that earlier path',
        },
        'paths': dict(PATHS),
        'cases': cases,
    }
    text = json.dumps(doc, indent=1) + '\n'
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(text)
    print('wrote %s (%d bytes, %d cases)' % (args.out, len(text), len(cases)))
    # LiteRT logs every accelerator again while the interpreter tears it down at exit.
    sys.stdout.flush()
    sys.stderr.flush()
    null = os.open(os.devnull, os.O_WRONLY)
    os.dup2(null, 2)


if __name__ == '__main__':
    main()
