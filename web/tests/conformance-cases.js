// A large subset of webtensor's conformance matrix (native-tests/conformance.rs), run in the
// browser through the JavaScript API: every case runs on the backend under test and on the
// `reference` backend, and the results are compared with DESIGN.md's tolerances. Loaded
// into the page by conformance.test.mjs; `run(backend)` resolves with the failures.
import init, * as wt from "/pkg/webtensor.js";

const TOL = 1e-5;
const LENGTHS = [0, 1, 3, 64, 255, 257, 4097];
const ROWS_COLS = [[1, 1], [3, 5], [2, 255], [4, 257], [3, 4097], [300, 3], [0, 8], [2, 1]];

/// Deterministic values in [-scale, scale) (xorshift32; the same every run).
function rng(seed) {
  let s = seed >>> 0 || 1;
  return (n, scale) => {
    const out = new Float32Array(n);
    for (let i = 0; i < n; i++) {
      s ^= s << 13; s >>>= 0;
      s ^= s >>> 17;
      s ^= s << 5; s >>>= 0;
      out[i] = (s / 4294967296 * 2 - 1) * scale;
    }
    return out;
  };
}

/// Max error allowed: tol · max(1, max |expected|), as native-tests/common's assert_close.
function check(what, got, want, tol) {
  if (got.length !== want.length) return `${what}: length ${got.length}, reference ${want.length}`;
  if (got instanceof Uint8Array || got instanceof Uint32Array || got instanceof Int32Array) {
    for (let i = 0; i < got.length; i++) {
      if (got[i] !== want[i]) return `${what}: element ${i}: got ${got[i]}, reference ${want[i]} (exact)`;
    }
    return null;
  }
  let scale = 1;
  for (const v of want) if (Number.isFinite(v)) scale = Math.max(scale, Math.abs(v));
  const limit = tol * scale;
  for (let i = 0; i < got.length; i++) {
    const a = got[i], e = want[i];
    if (Number.isNaN(a) || Number.isNaN(e)) {
      if (!(Number.isNaN(a) && Number.isNaN(e))) return `${what}: element ${i}: got ${a}, reference ${e}`;
      continue;
    }
    if (!Number.isFinite(a) || !Number.isFinite(e)) {
      if (a !== e) return `${what}: element ${i}: got ${a}, reference ${e}`;
      continue;
    }
    // Written so that a NaN error fails too.
    if (!(Math.abs(a - e) <= limit)) return `${what}: element ${i}: got ${a}, reference ${e}, error ${Math.abs(a - e)} > ${limit}`;
  }
  return null;
}

export async function run(backend) {
  await init();
  const dev = await wt.createDevice(backend);
  const ref = await wt.createDevice("reference");
  const failures = [];
  let cases = 0;
  const compare = async (what, tol, f) => {
    cases++;
    try {
      const got = await f(dev).toArray();
      const want = await f(ref).toArray();
      const err = check(what, got, want, tol);
      if (err) failures.push(err);
    } catch (e) {
      failures.push(`${what}: threw ${e && e.message ? e.message : e}`);
    }
  };
  const T = (d, data, shape) => d.tensor(data, shape);

  // Elementwise.
  let u = rng(1);
  for (const len of LENGTHS) {
    const x = u(len, 8), y = u(len, 4);
    const unary = { silu: wt.opSilu, gelu: wt.opGelu, gelu_erf: wt.opGeluErf, sigmoid: wt.opSigmoid, scale: (t) => wt.opScale(t, -0.37), softcap: (t) => wt.opSoftcap(t, 2.5) };
    for (const [name, f] of Object.entries(unary)) await compare(`${name} len ${len}`, TOL, (d) => f(T(d, x, [len])));
    const binary = { add: wt.opAdd, mul: wt.opMul, swiglu: wt.opSwiglu };
    for (const [name, f] of Object.entries(binary)) await compare(`${name} len ${len}`, TOL, (d) => f(T(d, x, [len]), T(d, y, [len])));
  }
  const big = new Float32Array([-200, -90, -30, 30, 90, 200]);
  for (const f of [wt.opSilu, wt.opGelu, wt.opGeluErf, wt.opSigmoid]) await compare(`${f.name} big`, TOL, (d) => f(T(d, big, [6])));
  for (const [rows, cols] of [[5, 3], [7, 257], [2, 4097]]) {
    const a = u(rows * cols, 2), b = u(cols, 2);
    await compare(`add broadcast ${rows}x${cols}`, TOL, (d) => wt.opAdd(T(d, a, [rows, cols]), T(d, b, [cols])));
  }

  // Norms and softmax.
  u = rng(3);
  for (const [rows, cols] of ROWS_COLS) {
    const x = u(rows * cols, 3), w = u(cols, 2), b = u(cols, 1);
    const shifted = x.map((v) => v + 5);
    await compare(`rms_norm ${rows}x${cols}`, TOL, (d) => wt.opRmsNorm(T(d, x, [rows, cols]), T(d, w, [cols]), 1e-6));
    await compare(`layer_norm ${rows}x${cols}`, TOL, (d) => wt.opLayerNorm(T(d, shifted, [rows, cols]), T(d, w, [cols]), T(d, b, [cols]), 1e-5));
    const s = u(rows * cols, 60);
    await compare(`softmax ${rows}x${cols}`, TOL, (d) => wt.opSoftmax(T(d, s, [rows, cols])));
  }
  for (const [heads, q, k] of [[1, 1, 1], [2, 3, 3], [3, 5, 9], [2, 1, 300], [1, 17, 257]]) {
    const x = u(heads * q * k, 10);
    await compare(`softmax_causal ${heads}x${q}x${k}`, TOL, (d) => wt.opSoftmaxCausal(T(d, x, [heads, q, k])));
  }

  // Rope, both pairings.
  u = rng(6);
  for (const [rows, heads, hd] of [[1, 1, 2], [3, 2, 8], [7, 4, 64], [257, 1, 6], [2, 8, 80]]) {
    const x = u(rows * heads * hd, 2);
    const pos = new Uint32Array(rows).map((_, i) => (i * 977) % 4096);
    if (rows === 1) pos[0] = 100000;
    for (const layout of ["half", "interleaved"]) {
      await compare(`rope ${rows}x${heads}x${hd} ${layout}`, TOL, (d) => wt.opRope(T(d, x, [rows, heads, hd]), T(d, pos, [rows]), 10000, layout));
    }
  }

  // Products: tolerance 1e-5·√k.
  u = rng(7);
  for (const [batch, m, n, k] of [[1, 1, 1, 1], [1, 1, 3, 5], [1, 1, 257, 255], [1, 1, 64, 4097], [1, 3, 5, 7], [2, 17, 33, 65], [1, 64, 64, 64], [3, 1, 255, 257], [2, 4, 7, 0], [1, 0, 5, 3]]) {
    const a = u(batch * m * k, 1), b = u(batch * n * k, 1);
    const tol = TOL * Math.sqrt(Math.max(k, 1));
    await compare(`matmul_t ${batch}x${m}x${n}x${k}`, tol, (d) => wt.opMatmulT(T(d, a, [batch, m, k]), T(d, b, [batch, n, k])));
    await compare(`matmul ${batch}x${m}x${n}x${k}`, tol, (d) => wt.opMatmul(T(d, a, [batch, m, k]), T(d, b, [batch, k, n])));
  }

  // Layout and indexing: exact.
  u = rng(8);
  for (const [shape, perm] of [[[1], [0]], [[3, 5], [1, 0]], [[4, 7, 2, 3], [0, 2, 1, 3]], [[2, 3, 5], [2, 0, 1]], [[0, 4], [1, 0]]]) {
    const n = shape.reduce((p, v) => p * v, 1);
    const x = u(n, 1);
    await compare(`permute ${shape} by ${perm}`, 0, (d) => wt.opPermute(T(d, x, shape), perm));
  }
  {
    const a = u(3 * 5, 1), b = u(3 * 2, 1);
    await compare("concat axis 1", 0, (d) => wt.opConcat(T(d, a, [3, 5]), T(d, b, [3, 2]), 1));
    await compare("narrow axis 1", 0, (d) => wt.opNarrow(T(d, a, [3, 5]), 1, 1, 3));
    const table = u(50 * 17, 1);
    const ids = new Uint32Array([0, 49, 3, 3, 17]);
    await compare("embedding 50x17", 0, (d) => wt.opEmbedding(T(d, table, [50, 17]), T(d, ids, [5])));
    for (const [rows, cols] of [[3, 255], [1, 4097], [7, 1]]) {
      const x = u(rows * cols, 5);
      await compare(`argmax ${rows}x${cols}`, 0, (d) => wt.opArgmax(T(d, x, [rows, cols])));
    }
  }

  // Scans: 1e-5 · log2(len), as the native matrix.
  u = rng(9);
  for (const [outer, len, inner] of [[1, 1, 1], [2, 3, 4], [3, 64, 5], [2, 65, 3], [1, 257, 2], [1, 1000, 1]]) {
    const tol = TOL * Math.log2(Math.max(len, 2));
    const a = u(outer * len * inner, 1).map((v) => 0.5 + 0.45 * v);
    const b = u(outer * len * inner, 1);
    const h0 = u(outer * inner, 1);
    const shape = [outer, len, inner];
    await compare(`linear_scan ${shape}`, tol, (d) => wt.opLinearScan(T(d, a, shape), T(d, b, shape), T(d, h0, [outer, inner]), 1));
    const logTol = Math.max(tol, 4 * 2 ** -21 * Math.sqrt(len));
    await compare(`log_cumprod ${shape}`, logTol, (d) => wt.opLogCumprod(T(d, a.map((v) => v + 0.5), shape), 1));
    await compare(`logcumsumexp ${shape}`, tol, (d) => wt.opLogcumsumexp(T(d, b.map((v) => v * 4), shape), 1));
  }

  // Block formats: bytes exact; products against the reference on the same packed weights.
  u = rng(10);
  for (const format of ["q8_0", "q4_0", "tq2_0", "tq1_0"]) {
    const rows = 3, k = 256;
    const x = u(rows * k, 2);
    await compare(`quantize ${format}`, 0, (d) => wt.opQuantize(T(d, x, [rows, k]), format));
    await compare(`dequantize ${format}`, 0, (d) => wt.opDequantize(wt.opQuantize(T(d, x, [rows, k]), format)));
    for (const [m, n] of [[1, 5], [9, 7]]) {
      const a = u(m * k, 2), w = u(n * k, 1);
      for (const act of ["f32", "q8_0"]) {
        await compare(`qmatmul_t ${format} ${m}x${n}x${k} ${act}`, TOL * Math.sqrt(k), (d) =>
          wt.opQmatmulT(T(d, a, [m, k]), wt.opQuantize(T(d, w, [n, k]), format), act));
      }
    }
  }

  // llama.cpp's super-block formats (what its K-quant files hold) and its legacy 32-value
  // ones, read from random blocks whose f16 scales (and minimums) are small normal numbers,
  // and bf16 weights (each an f32's high half, read 32 at a time by the WebGPU decoder as
  // natively): dequantization (1e-6, as natively: a GPU may fuse a scale's multiply-add) and
  // products with f32 activations against the reference.
  // Format: [block bytes, values per block, byte offsets of its f16 scales].
  const LLAMA_CPP_BLOCKS = {
    q2_k: [84, 256, [80, 82]], q3_k: [110, 256, [108]], q4_k: [144, 256, [0, 2]], q5_k: [176, 256, [0, 2]], q6_k: [210, 256, [208]], iq4_xs: [136, 256, [0]],
    q4_1: [20, 32, [0, 2]], q5_0: [22, 32, [0]], q5_1: [24, 32, [0, 2]], iq4_nl: [18, 32, [0]],
  };
  u = rng(11);
  const randomBlocks = (count, [size, , scales]) => {
    const bytes = Uint8Array.from(u(count * size, 1), (v) => Math.floor((v + 1) * 128) & 255);
    for (let b = 0; b < count; b++) {
      for (const at of scales) {
        // 2^-9 · (1 + m / 1024): exponent 6, a random mantissa.
        const half = 0x1800 | (bytes[b * size + at] << 2);
        bytes[b * size + at] = half & 255;
        bytes[b * size + at + 1] = half >> 8;
      }
    }
    return bytes;
  };
  const bf16Bytes = (values) => {
    const bytes = new Uint8Array(2 * values.length);
    const words = new Uint32Array(Float32Array.from(values).buffer);
    words.forEach((word, i) => {
      bytes[2 * i] = (word >>> 16) & 255;
      bytes[2 * i + 1] = word >>> 24;
    });
    return bytes;
  };
  for (const format of [...Object.keys(LLAMA_CPP_BLOCKS), "bf16"]) {
    const layout = LLAMA_CPP_BLOCKS[format];
    const k = 512;
    for (const [m, n] of [[1, 5], [9, 7]]) {
      const w = layout ? randomBlocks((n * k) / layout[1], layout) : bf16Bytes(u(n * k, 1));
      const a = u(m * k, 2);
      const W = (d) => d.tensorFromBytes(format, w, [n, k]);
      await compare(`dequantize ${format} ${n}x${k}`, 1e-6, (d) => wt.opDequantize(W(d)));
      await compare(`qmatmul_t ${format} ${m}x${n}x${k} f32`, TOL * Math.sqrt(k), (d) => wt.opQmatmulT(T(d, a, [m, k]), W(d), "f32"));
    }
  }

  // Bad input is an Error with the library's message, not a crash.
  let errorMessage = null;
  try {
    wt.opAdd(T(dev, new Float32Array(3), [3]), T(dev, new Float32Array(4), [4]));
  } catch (e) {
    errorMessage = e instanceof Error ? e.message : `not an Error: ${e}`;
  }
  if (!errorMessage || !/add/.test(errorMessage)) failures.push(`a shape mismatch gave ${errorMessage}`);

  return { backend: dev.backend, adapter: dev.info().info.device_name, cases, failures, errorMessage };
}
