"""Matmul / convolution FLOPs of a compiled XLA program per device, loop bodies multiplied by their trip count
(``cost_analysis`` counts them once); loops of unknown count are counted once and listed.
"""

from __future__ import annotations

import dataclasses
import math
import re

import numpy as np

_HEADER = re.compile(r"^\s*(ENTRY\s+)?%?([\w.\-]+)\s+\(.*\)\s*->.*\{\s*$")
_INSTR = re.compile(r"^\s*(?:ROOT\s+)?%?([\w.\-]+)\s*=\s*(.*)$")
_ARRAY = re.compile(r"^([a-z]\w*)\[([\d,]*)\]")
_OP = re.compile(r"\s([a-z][\w\-]*)\(")
_CALLEES = re.compile(r"\b(calls|to_apply|body|true_computation|false_computation)=%?([\w.\-]+)")
_BRANCHES = re.compile(r"branch_computations=\{([^}]*)\}")
_TRIP = re.compile(r'"known_trip_count"\s*:\s*\{\s*"n"\s*:\s*"?(\d+)')
_GEMM_TARGETS = ("gemm", "matmul")
_NO_FLOP_TARGETS = (
    "AllocateBuffer",
    "Sharding",
    "SPMDFullToShardShape",
    "SPMDShardToFullShape",
    "MoveToHost",
    "MoveToDevice",
    "annotate_device_placement",
)


@dataclasses.dataclass(frozen=True)
class HloCost:
    """flops: matmul / convolution FLOPs of one run of the program (per device); unknown_loops: while loops
    without a known trip count (counted once); uncounted: custom-call targets whose FLOPs are not known here."""

    flops: float
    unknown_loops: int = 0
    uncounted: tuple = ()


@dataclasses.dataclass
class _Instr:
    name: str
    shape: tuple | None  # array result shape, None for tuples / tokens
    op: str
    rest: str  # from the opcode's "(" on
    root: bool = False


def _shape(type_text: str) -> tuple | None:
    m = _ARRAY.match(type_text.strip())
    if not m:
        return None
    return tuple(int(d) for d in m.group(2).split(",") if d)


def _first_array_in_tuple(type_text: str) -> tuple | None:
    text = type_text.strip()
    if text.startswith("("):
        text = text[1:]
        text = re.sub(r"^/\*[^*]*\*/", "", text)
    return _shape(text)


def parse_computations(hlo_text: str) -> tuple[dict, str]:
    """{computation name: [_Instr]} and the entry computation's name."""
    comps: dict[str, list] = {}
    entry = ""
    current: list | None = None
    for line in hlo_text.splitlines():
        head = _HEADER.match(line)
        if head:
            current = comps.setdefault(head.group(2), [])
            if head.group(1):
                entry = head.group(2)
            continue
        if current is None:
            continue
        if line.strip() == "}":
            current = None
            continue
        m = _INSTR.match(line)
        is_root = line.lstrip().startswith("ROOT ")
        if not m:
            continue
        name, body = m.group(1), m.group(2)
        op = _OP.search(" " + body)
        if not op:
            continue
        # positions in " " + body are one past those in body: the type ends before the opcode, and ``rest``
        # starts at the opcode's "("
        type_text = body[: op.start()]
        shape = _shape(type_text)
        if shape is None and op.group(1) == "custom-call":
            shape = _first_array_in_tuple(type_text)
        current.append(_Instr(name=name, shape=shape, op=op.group(1), rest=body[op.end() - 2 :], root=is_root))
    return comps, entry


def _operands(rest: str) -> list[str]:
    """Operand names of an instruction (the text inside its first parentheses)."""
    depth, end = 0, len(rest)
    for i, ch in enumerate(rest):
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
            if depth == 0:
                end = i
                break
    return re.findall(r"%([\w.\-]+)", rest[:end])


def _dims(rest: str, key: str) -> list[int]:
    m = re.search(key + r"=\{([\d,]*)\}", rest)
    return [int(d) for d in m.group(1).split(",") if d] if m else []


def _dot_flops(ins: _Instr, shapes: dict) -> float:
    ops = _operands(ins.rest)
    lhs = shapes.get(ops[0]) if ops else None
    if ins.shape is None or lhs is None:
        return 0.0
    contract = math.prod(lhs[d] for d in _dims(ins.rest, "lhs_contracting_dims"))
    return 2.0 * math.prod(ins.shape) * contract


def _window_fields(rest: str) -> dict:
    """The ``window={...}`` attribute as {field: [per spatial dim values]} (size, stride, pad as (lo, hi), ...)."""
    m = re.search(r"window=\{([^}]*)\}", rest)
    out: dict = {}
    for part in m.group(1).split() if m else []:
        key, _, value = part.partition("=")
        items = value.split("x")
        out[key] = [tuple(int(v) for v in i.split("_")) if key == "pad" else int(i) for i in items]
    return out


def _taps(n: int, out: int, size: int, stride: int, lo: int, lhs_dilate: int, rhs_dilate: int) -> int:
    """How many (output position, window tap) pairs of one spatial dimension land on a real input element (padding
    and lhs-dilation holes cost nothing; XLA on TPU writes batched matmuls as such convolutions)."""
    p = np.arange(out, dtype=np.int64) * stride - lo  # each output's first tap, in padded dilated coordinates
    count = 0
    for t in range(size):
        q = p + t * rhs_dilate
        count += int(np.count_nonzero((q >= 0) & (q % lhs_dilate == 0) & (q // lhs_dilate < n)))
    return count


def _conv_flops(ins: _Instr, shapes: dict) -> float:
    ops = _operands(ins.rest)
    lhs = shapes.get(ops[0]) if ops else None
    labels = re.search(r"dim_labels=([\w]+)_([\w]+)->([\w]+)", ins.rest)
    if ins.shape is None or lhs is None or not labels:
        return 0.0
    lhs_labels, _, out_labels = labels.groups()
    feat = lhs[lhs_labels.index("f")] if "f" in lhs_labels else 1
    groups = re.search(r"feature_group_count=(\d+)", ins.rest)
    feat /= int(groups.group(1)) if groups else 1
    # output batch and feature dimensions, times the real taps of every spatial dimension
    dense = math.prod(ins.shape[i] for i, c in enumerate(out_labels) if not c.isdigit())
    window = _window_fields(ins.rest)
    taps = 1
    for d in sorted(int(c) for c in out_labels if c.isdigit()):

        def field(key, default, d=d):
            values = window.get(key)
            return values[d] if values and d < len(values) else default

        taps *= _taps(
            n=lhs[lhs_labels.index(str(d))],
            out=ins.shape[out_labels.index(str(d))],
            size=field("size", 1),
            stride=field("stride", 1),
            lo=field("pad", (0, 0))[0],
            lhs_dilate=field("lhs_dilate", 1),
            rhs_dilate=field("rhs_dilate", 1),
        )
    return 2.0 * dense * taps * feat


def _gemm_flops(ins: _Instr, shapes: dict) -> float | None:
    ops = _operands(ins.rest)
    m = re.search(r'"lhs_contracting_dimensions"\s*:\s*\[([^\]]*)\]', ins.rest)
    lhs = shapes.get(ops[0]) if ops else None
    if ins.shape is None or lhs is None or m is None:
        return None
    dims = [int(d.strip().strip('"')) for d in m.group(1).split(",") if d.strip()]
    return 2.0 * math.prod(ins.shape) * math.prod(lhs[d] for d in dims)


def _condition_bound(instrs: list) -> int | None:
    """N when a loop condition's root is ``compare(counter, constant N), direction=LT`` (a scan's loop)."""
    root = next((i for i in instrs if i.root), None)
    if root is None or root.op != "compare" or "direction=LT" not in root.rest:
        return None
    consts = {i.name: i.rest for i in instrs if i.op == "constant"}
    ops = _operands(root.rest)
    if len(ops) != 2 or ops[1] not in consts:
        return None
    value = re.match(r"\((-?\d+)\)", consts[ops[1]])
    return int(value.group(1)) if value else None


def hlo_flops(hlo_text: str) -> HloCost:
    """Matmul / convolution FLOPs of the optimised HLO module ``hlo_text``, loop trip counts included."""
    comps, entry = parse_computations(hlo_text)
    if not entry:
        raise ValueError("hlo_flops: no ENTRY computation in the HLO text")
    memo: dict[str, float] = {}
    unknown = [0]
    uncounted: set = set()

    def cost(name: str, stack: tuple = ()) -> float:
        if name in memo:
            return memo[name]
        if name not in comps or name in stack:
            return 0.0
        instrs = comps[name]
        shapes = {i.name: i.shape for i in instrs}
        total = 0.0
        for ins in instrs:
            if ins.op == "dot":
                total += _dot_flops(ins, shapes)
            elif ins.op == "convolution":
                total += _conv_flops(ins, shapes)
            elif ins.op == "custom-call":
                target = re.search(r'custom_call_target="([^"]+)"', ins.rest)
                target = target.group(1) if target else "?"
                gemm = _gemm_flops(ins, shapes) if any(t in target.lower() for t in _GEMM_TARGETS) else None
                if gemm is not None:
                    total += gemm
                elif target not in _NO_FLOP_TARGETS:
                    uncounted.add(target)
            branches = _BRANCHES.search(ins.rest)
            if branches:
                names = re.findall(r"%?([\w.\-]+)", branches.group(1))
                total += max((cost(n, stack + (name,)) for n in names), default=0.0)
            callees = _CALLEES.findall(ins.rest)
            if ins.op == "conditional" and not branches:
                total += max((cost(c, stack + (name,)) for k, c in callees), default=0.0)
                continue
            for kind, callee in callees:
                sub = cost(callee, stack + (name,))
                if kind == "body":
                    trip = _TRIP.search(ins.rest)
                    n = int(trip.group(1)) if trip else None
                    cond = re.search(r"condition=%?([\w.\-]+)", ins.rest)
                    if n is None and cond and cond.group(1) in comps:
                        n = _condition_bound(comps[cond.group(1)])
                    if n is None:
                        unknown[0] += 1
                    sub *= n if n is not None else 1
                total += sub
        memo[name] = total
        return total

    flops = cost(entry)
    return HloCost(flops=flops, unknown_loops=unknown[0], uncounted=tuple(sorted(uncounted)))


_TYPED = re.compile(r"^\s*(?:ROOT\s+)?%?[\w.\-]+\s*=\s*(\w+)\[([\d,]*)\]\S*\s+([a-z][\w\-]*)\((.*)$")


def widened_bytes(hlo_text: str) -> int:
    """Bytes of the f32 copies a compiler made of whole bf16 arguments (per device): instructions outside fusions
    that convert (or are a fusion that only converts) a value to f32 of an entry bf16 parameter's shape. XLA:CPU
    has no bf16 dot or scatter, so it widens a bf16 KV cache or weights before its loops; a backend with bf16
    arithmetic (GPU, TPU) makes no such copies, so a CPU plan's temporaries overstate theirs by about this."""
    comps, entry = parse_computations(hlo_text)
    fused = {c for instrs in comps.values() for i in instrs for k, c in _CALLEES.findall(i.rest) if k == "calls"}
    converts_only = {
        name for name in fused if [i.op for i in comps.get(name, []) if i.op != "parameter"] == ["convert"]
    }
    lines = [
        (head.group(2), None) if head else (None, _TYPED.match(line))
        for line in hlo_text.splitlines()
        for head in [_HEADER.match(line)]
    ]
    bf16_args, wide, current = set(), [], None
    for name, m in lines:
        current = name or current
        if m is None or current in fused:
            continue
        if current == entry and m.group(1) == "bf16" and m.group(3) == "parameter":
            bf16_args.add(m.group(2))
        callee = re.search(r"calls=%?([\w.\-]+)", m.group(4))
        if m.group(1) == "f32" and (
            m.group(3) == "convert" or (m.group(3) == "fusion" and callee and callee.group(1) in converts_only)
        ):
            wide.append(m.group(2))
    return sum(4 * math.prod(int(d) for d in dims.split(",") if d) for dims in wide if dims in bf16_args)
