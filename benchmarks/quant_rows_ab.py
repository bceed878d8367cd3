"""Few-row quantized products (decode steps) of two builds of the CPU kernels in one process:
a saved library (BASELINE.so, e.g. a copy of the cached build before a change) against the
current sources' build, alternated, one thread, thread CPU time, best of 5 runs over every
layer's weight of that name in the named layer's format (``blk.1.ffn_down.weight``: the
layers whose ffn_down is in layer 1's format) or a single tensor (``output.weight``), at
each of ROWS rows of x (default 1). Prints ms, GB/s of weight bytes, new/old and the
largest output difference.

    python benchmarks/quant_rows_ab.py MODEL.gguf BASELINE.so blk.0.ffn_gate.weight,output.weight [1,4]
"""
import sys, time, ctypes, statistics, functools
import gguf, numpy as np, torch
from pagedchat.kernels.cpu import build, quant as cq
from pagedchat.kernels.quant import QuantizedWeight
torch.set_num_threads(1)
path = sys.argv[1]; base = sys.argv[2]; names = sys.argv[3].split(",")
row_counts = [int(r) for r in (sys.argv[4] if len(sys.argv) > 4 else "1").split(",")]
reader = gguf.GGUFReader(path)
T = {t.name: t for t in reader.tensors}
def load(n):
    t = T[n]; return QuantizedWeight.from_blocks(t.tensor_type.name, torch.from_numpy(np.array(t.data)), int(t.shape[0]))
new = build.kernel_library()
old = ctypes.CDLL(base); build._set_signatures(old, {k: v for k, v in build._SIGNATURES.items() if hasattr(old, k)})
layers = sum(1 for n in T if n.endswith(".attn_norm.weight"))
for name, rows in [(n, r) for n in names for r in row_counts]:
    named = load(name)
    if name.startswith("blk"):  # every layer's weight of that name in the named one's format
        ws = [load(".".join(["blk", str(i), *name.split(".")[2:]])) for i in range(layers)]
        ws = [w for w in ws if w.segments[0].format == named.segments[0].format]
    else:
        ws = [named]
    x = torch.randn(rows, ws[0].in_features)
    res = {}
    for lib in (old, new):
        cq._library = lambda lib=lib: lib
        res[id(lib)] = torch.cat([cq.quantized_linear(x, w) for w in ws], 1)
    d = (res[id(old)] - res[id(new)]).abs().max().item()
    ts = {id(old): [], id(new): []}
    for r in range(5):
        for lib in (old, new):
            cq._library = lambda lib=lib: lib
            s = time.thread_time()
            for w in ws: cq.quantized_linear(x, w)
            ts[id(lib)].append((time.thread_time() - s) * 1e3 / len(ws))
    o, n = min(ts[id(old)]), min(ts[id(new)])
    mb = ws[0].nbytes / 1e6
    print(f"{name:24} {rows}r {ws[0].segments[0].format.name} x{len(ws):<2} {mb:7.2f}MB old {o:7.3f} ms ({mb/o:5.2f} GB/s) new {n:7.3f} ms ({mb/n:5.2f} GB/s) new/old {n/o:.2f} maxdiff {d:.2e}")
