"""An op record's arguments as data: each tensor's shape, stride and dtype, scalars as values.

op_plan.py builds them once per call signature, in argument order:
- a tensor: `TensorArg(shape, stride, dtype)` (`tag`: a quantized weight's storage class,
  shown before its shape: "Int8WeightTensor[64, 64]");
- a list or tuple: a tuple of its items (a list of tensors: a tuple of TensorArg);
- a keyword argument: `Keyword(name, value)`, after the positional ones;
- None, bool, int, float, str: the value itself; anything else (torch.float32, a
  device): `Const`, its repr.

`signature(args)` writes the display text ("[6, 4096], [4096, 4096], dim=1") — the one
way to show args; only `args_from_text` reads it back (files and tests older than args). Readers: `tensor_args` (every tensor, lists
flattened, in order), `numbers` / `pattern` / `with_numbers` (the integers of args apart
from the rest: derived steps fit the integers and rebuild the args), `to_json` /
`from_json` (plain JSON types). `contiguous(shape, dtype)` is a dense row-major tensor.
"""
from __future__ import annotations

import ast
import math
from dataclasses import dataclass

_PLAIN = (type(None), bool, int, float, str)


@dataclass(frozen=True, slots=True)
class TensorArg:
    """One tensor argument: what its cost and its access pattern depend on."""

    shape: tuple[int, ...]
    stride: tuple[int, ...]  # elements (a dim of size 1: see `canonical`); () without strides
    dtype: str  # "float32"
    tag: str = ""  # a tensor subclass's storage ("Int8WeightTensor"), shown before the shape

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    @property
    def dense(self) -> bool:
        """Whether its elements fill one block without gaps in some order of the dims (a
        contiguous tensor, a transpose of one); False for a strided view (x[..., ::2], a
        slice of a wider row) and for a broadcast (stride 0)."""
        if not self.stride:
            return True
        dims = sorted((st, n) for st, n in zip(self.stride, self.shape) if n != 1)
        step = 1
        for st, n in dims:
            if st != step:
                return False
            step *= n
        return True


    @property
    def gapped(self) -> bool:
        """A strided view: not dense, and no dim broadcast (stride 0) either."""
        return not self.dense and 0 not in self.stride

@dataclass(frozen=True, slots=True)
class Keyword:
    """A keyword argument (it follows the positional ones)."""

    name: str
    value: object


@dataclass(frozen=True, slots=True)
class Const:
    """A value that is no plain scalar (torch.float32, a device), as its repr."""

    text: str


def canonical(shape, stride) -> tuple[int, ...]:
    """stride with each dim of size 1 given the stride it has in a contiguous tensor (the
    next dim's stride x size): its stride addresses nothing, and torch leaves what a view
    made (a key's and a value's new row, same layout, differ there): equal layouts, equal
    strides."""
    out, step = list(stride), 1
    for i in range(len(out) - 1, -1, -1):
        if shape[i] == 1:
            out[i] = step
        step = out[i] * max(shape[i], 1)
    return tuple(out)


def tensor_arg(shape, stride, dtype: str, tag: str = "") -> TensorArg:
    """A TensorArg of a tensor's shape, its strides made `canonical`, and dtype."""
    shape = tuple(shape)
    return TensorArg(shape, canonical(shape, stride) if stride else (), dtype, tag)


def contiguous(shape, dtype: str = "float32") -> TensorArg:
    """A dense row-major tensor of `shape` (its strides as torch.empty gives them)."""
    stride, step = [], 1
    for n in reversed(shape):
        stride.append(step)
        step *= max(n, 1)
    return TensorArg(tuple(shape), tuple(reversed(stride)), dtype)


def _fmt(x) -> str:
    kind = type(x)
    if kind is TensorArg:
        return f"{x.tag}{list(x.shape)}"
    if kind is tuple:
        return "[" + ", ".join([_fmt(v) for v in x]) + "]"
    if kind is Keyword:
        return f"{x.name}={_fmt(x.value)}"
    if kind is Const:
        return x.text
    return repr(x)


def signature(args: tuple) -> str:
    """The display text of args: tensors by their shape, then scalars ("[2, 5], dim=1")."""
    return ", ".join([_fmt(a) for a in args])


def tensor_args(args: tuple) -> list[TensorArg]:
    """Every tensor of args in order, those in lists included (keyword ones too)."""
    out = []

    def walk(x):
        kind = type(x)
        if kind is TensorArg:
            out.append(x)
        elif kind is tuple:
            for v in x:
                walk(v)
        elif kind is Keyword:
            walk(x.value)

    walk(args)
    return out


def _walk_numbers(x, out: list, tokens: list | None):
    """Append x's integers to out (shape then stride of a tensor), and to tokens what
    is not an integer, typed (1, 1.0 and True stay apart)."""
    kind = type(x)
    if kind is int:
        out.append(x)
        if tokens is not None:
            tokens.append("#")
    elif kind is TensorArg:
        out += x.shape
        out += x.stride
        if tokens is not None:
            tokens.append(("tensor", len(x.shape), len(x.stride), x.dtype, x.tag))
    elif kind is tuple:
        if tokens is not None:
            tokens.append(("[", len(x)))
        for v in x:
            _walk_numbers(v, out, tokens)
    elif kind is Keyword:
        if tokens is not None:
            tokens.append(("keyword", x.name))
        _walk_numbers(x.value, out, tokens)
    elif tokens is not None:
        tokens.append((kind.__name__, x.text if kind is Const else x))


def numbers(args: tuple) -> list[int]:
    """The integers of args in order: each tensor's shape then stride, integer scalars."""
    out: list[int] = []
    _walk_numbers(args, out, None)
    return out


def pattern(args: tuple) -> tuple:
    """Everything of args but its integers, typed and hashable: args of one pattern differ
    only in `numbers`."""
    tokens: list = []
    _walk_numbers(args, [], tokens)
    return tuple(tokens)


def with_numbers(args: tuple, values) -> tuple:
    """args with its integers replaced, in `numbers` order, by values."""
    it = iter(values)

    def rebuild(x):
        kind = type(x)
        if kind is int:
            return next(it)
        if kind is TensorArg:
            shape = tuple(next(it) for _ in x.shape)
            return TensorArg(shape, tuple(next(it) for _ in x.stride), x.dtype, x.tag)
        if kind is tuple:
            return tuple(rebuild(v) for v in x)
        if kind is Keyword:
            return Keyword(x.name, rebuild(x.value))
        return x

    return rebuild(args)


def _encode(x):
    kind = type(x)
    if kind is TensorArg:
        d = {"shape": list(x.shape), "stride": list(x.stride), "dtype": x.dtype}
        if x.tag:
            d["tag"] = x.tag
        return d
    if kind is tuple:
        return [_encode(v) for v in x]
    if kind is Keyword:
        return {"keyword": x.name, "value": _encode(x.value)}
    if kind is Const:
        return {"const": x.text}
    if kind is float and not math.isfinite(x):  # strict JSON has no inf, nan
        return {"float": repr(x)}
    return x


def to_json(args: tuple) -> list:
    """args as plain JSON types (from_json reads them back)."""
    return [_encode(a) for a in args]


def _decode(x):
    if isinstance(x, list):
        return tuple(_decode(v) for v in x)
    if isinstance(x, dict):
        if "shape" in x:
            return TensorArg(tuple(x["shape"]), tuple(x["stride"]), x["dtype"], x.get("tag", ""))
        if "keyword" in x:
            return Keyword(x["keyword"], _decode(x["value"]))
        if "const" in x:
            return Const(x["const"])
        if "float" in x:
            return float(x["float"])
        raise ValueError(f"an op argument {x!r:.60} is none of tensor, keyword, const, float")
    if not isinstance(x, _PLAIN):
        raise TypeError(f"an op argument {x!r:.60} is no JSON scalar")
    return x


def from_json(items: list) -> tuple:
    """The args that to_json wrote."""
    if not isinstance(items, list):
        raise TypeError(f"field 'args' must be a list, got {type(items).__name__}")
    return tuple(_decode(v) for v in items)


def plain(value) -> bool:
    """Whether a scalar is kept as its value (else it is kept as a Const)."""
    return type(value) in _PLAIN


def args_from_text(text: str, dtype: str) -> tuple:
    """The args a display text stands for: the one place text is read back, for records
    written before records kept args (a file of counts) and records written by hand (tests).
    NB: the text cannot tell a list of sizes from a tensor:
    every list of integers is taken for a contiguous tensor of the record's dtype (re-count
    for the real strides and dtypes); a value that is no literal (torch.float32) a Const."""
    if not text:
        return ()
    try:
        call = ast.parse(f"f({text})", mode="eval").body
    except SyntaxError:
        return (Const(text),)
    source = f"f({text})"

    def convert(v):
        if isinstance(v, (list, tuple)):
            if v and all(type(n) is int for n in v):
                return contiguous(v, dtype)
            return tuple(convert(n) for n in v)
        return v

    def value(node):
        try:
            return convert(ast.literal_eval(node))
        except ValueError:
            return Const(ast.get_source_segment(source, node))

    return (*[value(a) for a in call.args],
            *[Keyword(k.arg, value(k.value)) for k in call.keywords])
