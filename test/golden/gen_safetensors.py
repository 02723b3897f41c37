"""Golden safetensors files for test/test_io.c, written by Python's safetensors.

    bench/peers/.venv/bin/python test/golden/gen_safetensors.py
        writes test/golden/st_*.safetensors (the files test_io.c loads)
    bench/peers/.venv/bin/python test/golden/gen_safetensors.py verify FILE
        checks a file nabla wrote (NABLA_TEST_ST_OUT=FILE build/test/nabla_tests
        --filter 'io/save_for_python') with safetensors.torch.load_file and
        safe_open: names, dtypes, shapes, values and metadata

Every value follows a formula of the element's row-major index i, written
twice: here and in test/test_io.c (st_value), so the C test needs no text
file. The formulas give values exact in every dtype (multiples of 1/8 for the
floats, wrapping patterns covering both ends of each integer range).
"""
import os
import sys

import numpy as np
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

HERE = os.path.dirname(os.path.abspath(__file__))

# nabla dtype name -> torch dtype
TORCH = {
    "f32": torch.float32,
    "f64": torch.float64,
    "f16": torch.float16,
    "bf16": torch.bfloat16,
    "i32": torch.int32,
    "i64": torch.int64,
    "bool": torch.bool,
    "u8": torch.uint8,
    "i8": torch.int8,
    "i16": torch.int16,
}


def value(dt, i):
    """The formula of test_io.c's st_value."""
    if dt in ("f32", "f64", "f16", "bf16"):
        return ((i * 7) % 23 - 11) / 8.0
    if dt == "i32":
        return (i * 1000003) % 4294967296 - 2147483648
    if dt == "i64":
        return (i * 0x9E3779B97F4A7C15) % 2**64 - 2**63
    if dt == "bool":
        return i % 3 == 0
    if dt == "u8":
        return (i * 37 + 11) % 256
    if dt == "i8":
        return (i * 37 + 11) % 256 - 128
    if dt == "i16":
        return (i * 4099 + 7) % 65536 - 32768
    raise ValueError(dt)


def tensor(dt, shape):
    n = int(np.prod(shape)) if len(shape) else 1
    vals = [value(dt, i) for i in range(n)]
    if dt == "bool":
        t = torch.tensor(vals, dtype=torch.bool)
    elif dt in ("f32", "f64", "f16", "bf16"):
        t = torch.tensor(vals, dtype=torch.float64).to(TORCH[dt])
    else:  # every value is in the dtype's range
        t = torch.tensor(vals, dtype=torch.int64).to(TORCH[dt])
    return t.reshape(shape)


# file -> [(name, dtype, shape)], metadata
FILES = {
    "st_dtypes.safetensors": (
        [
            ("x.f32", "f32", (2, 3)),
            ("x.f64", "f64", (5,)),
            ("x.f16", "f16", (3, 1, 2)),
            ("x.bf16", "bf16", (7,)),
            ("x.i32", "i32", (4,)),
            ("x.i64", "i64", (2, 2)),
            ("x.bool", "bool", (9,)),
            ("scalar", "f32", ()),
            ("empty", "f32", (0, 3)),
            ("h.0.attn.w_q", "f32", (4, 4)),
        ],
        {"format": "pt", "note": "quote \" backslash \\ tab \t unicode \u00e9\u4e2d"},
    ),
    "st_small_ints.safetensors": (
        [
            ("u8", "u8", (300,)),
            ("i8", "i8", (2, 150)),
            ("i16", "i16", (3, 5)),
            ("u8_scalar", "u8", ()),
        ],
        None,
    ),
}


def generate():
    for fname, (entries, meta) in FILES.items():
        tensors = {name: tensor(dt, shape).contiguous() for name, dt, shape in entries}
        path = os.path.join(HERE, fname)
        save_file(tensors, path, metadata=meta)
        back = load_file(path)
        for name, t in tensors.items():
            assert torch.equal(back[name], t), name
        print("wrote", path, os.path.getsize(path), "bytes")


def verify(path):
    """A file nabla wrote (test_io.c, save_for_python): every dtype, the same
    formulas, metadata {"writer": "nabla", "utf8": "\u00e9"}."""
    want = {
        "a.f32": ("f32", (2, 3)),
        "a.f64": ("f64", (4,)),
        "a.f16": ("f16", (3,)),
        "a.bf16": ("bf16", (2, 2)),
        "a.i32": ("i32", (5,)),
        "a.i64": ("i64", (3,)),
        "a.bool": ("bool", (7,)),
        "s": ("f64", ()),
        "e": ("i32", (0,)),
    }
    small = {"b.u8": ("u8", (9,)), "b.i8": ("i8", (9,)), "b.i16": ("i16", (2, 3))}
    got = load_file(path)
    for name, (dt, shape) in small.items():
        if name in got:
            want[name] = (dt, shape)
    assert set(got) == set(want), (sorted(got), sorted(want))
    for name, (dt, shape) in want.items():
        t = got[name]
        assert t.dtype == TORCH[dt], (name, t.dtype)
        assert tuple(t.shape) == shape, (name, t.shape)
        assert torch.equal(t, tensor(dt, shape)), (name, t)
    with safe_open(path, framework="pt") as f:
        meta = f.metadata()
    assert meta == {"writer": "nabla", "utf8": "\u00e9"}, meta
    print("ok:", path, "read by safetensors", len(want), "tensors, metadata", meta)


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "verify":
        verify(sys.argv[2])
    else:
        generate()
