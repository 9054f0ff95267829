"""Where a compiled program's device time goes: a ``jax.profiler`` trace of a few calls, summed by part.

Each device event of the trace names the HLO instruction it ran (``hlo_op``); the compiled program's HLO text
maps that instruction to the JAX name stack it came from (``metadata={op_name=...}``), which carries the model's
named scopes (``vision``, ``attention``, ``mlp``, ``logprob_head``, ``optimizer``) and the autodiff phase
(``transpose(`` = backward; ``rematted_computation`` = recomputation). Times are summed per
(part, phase) and per instruction, divided by the number of profiled calls.

    parts = profile_parts(compiled.as_text(), lambda: run_one_step(), calls=2, trace_dir=DIR)
"""

from __future__ import annotations

import collections
import glob
import os
import re

import jax

PARTS = ("vision", "attention", "mlp", "logprob_head", "optimizer")
_OP_NAME = re.compile(r'op_name="([^"]*)"')
_CALLS = re.compile(r"(?:calls|body|to_apply|condition|branch_computations)=\{?%?([\w.\-]+)")
_CONTROL = re.compile(r"\s(while|conditional|call)\(")


def parse_hlo(hlo_text: str) -> tuple[dict[str, str], set[str]]:
    """(instruction name -> JAX op_name, names of control-flow instructions). An instruction without metadata
    (a fusion, a loop) takes the most common op_name of the computations it calls."""
    own, calls, comp_ops, control = {}, {}, collections.defaultdict(list), set()
    comp = None
    for line in hlo_text.splitlines():
        stripped = line.strip()
        if not stripped or stripped.startswith("//"):
            continue
        if not line.startswith(" ") and stripped.endswith("{"):
            comp = stripped.split()[1 if stripped.startswith("ENTRY") else 0].lstrip("%")
            continue
        body = stripped.removeprefix("ROOT ")
        if "=" not in body or not body.startswith("%"):
            continue
        name = body.split("=", 1)[0].strip().lstrip("%")
        rhs = body.split("=", 1)[1]
        m = _OP_NAME.search(rhs)
        if m:
            own[name] = m.group(1)
            comp_ops[comp].append(m.group(1))
        called = _CALLS.findall(rhs)
        if called:
            calls[name] = called
        if _CONTROL.search(rhs):
            control.add(name)

    def of_comp(c):
        names = list(comp_ops.get(c, []))
        return collections.Counter(names).most_common(1)[0][0] if names else ""

    names = dict(own)
    for name, called in calls.items():
        if name not in names:
            for c in called:
                guess = of_comp(c)
                if guess:
                    names[name] = guess
                    break
    return names, control


def classify(op_name: str) -> tuple[str, str]:
    """(part, phase) of an op_name: the innermost of ``PARTS`` it names (else 'other'); phase 'backward',
    'recompute' or 'forward'."""
    part = "other"
    best = -1
    for p in PARTS:
        i = op_name.rfind(p)
        if i > best:
            part, best = p, i
    if "rematted_computation" in op_name:
        phase = "recompute"
    elif "transpose(" in op_name:
        phase = "backward"
    else:
        phase = "forward"
    return part, phase


def _device_events(path: str):
    """(line name, hlo_op, duration_ns) of the events on accelerator planes (CPU planes when there are none)."""
    data = jax.profiler.ProfileData.from_file(path)
    planes = [p for p in data.planes if p.name.startswith("/device:")]
    if not planes:
        planes = [p for p in data.planes if p.name == "/host:CPU"]
    for plane in planes:
        for line in plane.lines:
            for ev in line.events:
                stats = dict(ev.stats)
                op = stats.get("hlo_op")
                if op is None:
                    continue
                yield line.name, str(op), float(ev.duration_ns)


def profile_parts(hlo_text: str, call, calls: int, trace_dir: str, top: int = 25) -> dict:
    """Runs ``call()`` ``calls`` times under the profiler; returns per-call milliseconds: ``total``, ``parts``
    {part: {phase: ms}}, ``top_ops`` [(instruction, op_name, ms)] and ``line`` (the trace line that was summed:
    XLA's per-op line where the trace has one, so kernels are not counted twice)."""
    names, control = parse_hlo(hlo_text)
    jax.profiler.start_trace(trace_dir)
    try:
        for _ in range(calls):
            call()
    finally:
        jax.profiler.stop_trace()
    files = sorted(glob.glob(os.path.join(trace_dir, "**", "*.xplane.pb"), recursive=True), key=os.path.getmtime)
    if not files:
        return {"error": f"no trace written under {trace_dir}"}
    events = list(_device_events(files[-1]))
    lines = collections.Counter(line for line, _, _ in events)
    chosen = "XLA Ops" if "XLA Ops" in lines else (lines.most_common(1)[0][0] if lines else None)
    parts: dict = collections.defaultdict(lambda: collections.defaultdict(float))
    per_op: dict = collections.defaultdict(float)
    total = 0.0
    for line, op, ns in events:
        if line != chosen or op in control:  # a loop's time is its body's kernels, counted on their own
            continue
        ms = ns / 1e6 / calls
        part, phase = classify(names.get(op, ""))
        parts[part][phase] += ms
        per_op[op] += ms
        total += ms
    ranked = sorted(per_op.items(), key=lambda kv: -kv[1])[:top]
    return {
        "line": chosen,
        "lines": dict(lines),
        "total_ms": total,
        "parts": {p: dict(v) for p, v in parts.items()},
        "top_ops": [(op, names.get(op, "")[-160:], ms) for op, ms in ranked],
        "trace": files[-1],
    }
