"""A small self-contained HTML viewer for sampled CoaT-trees (``ipl-jax sample --html``); no scripts, no files."""

from __future__ import annotations

import base64
import html
import io
from collections.abc import Sequence
from pathlib import Path

from ipl_jax import storage

TURN_NAMES = {1: "s1 description", 2: "s2 thought", 3: "s3 action", 4: "s4 grounding"}

_STYLE = """
body{font-family:system-ui,sans-serif;margin:1.5em;color:#222}
section{display:flex;gap:1.5em;border-top:1px solid #ccc;padding:1em 0}
section img{max-width:280px;border:1px solid #999;align-self:flex-start}
.meta{font-size:.9em;margin-bottom:.5em} .meta b{display:inline-block;min-width:7em}
ul{list-style:none;padding-left:1.2em;margin:.1em 0} li{margin:.15em 0}
summary{cursor:pointer} .node{padding:.05em .35em;border-radius:.3em}
.text{white-space:pre-wrap;font-family:ui-monospace,monospace;font-size:.85em}
.small{color:#555;font-size:.8em} .cut{color:#a00}
.class-alpha{color:#080} .class-beta{color:#b60} .class-gamma{color:#a00}
"""


def value_colour(v: float) -> str:
    """Background colour of a value in [0, 1]: red (0) -> yellow (0.5) -> green (1), light tints."""
    v = min(1.0, max(0.0, float(v)))
    hue = 120.0 * v
    return f"hsl({hue:.0f},70%,82%)"


def image_data_uri(image, max_width: int = 360) -> str:
    """A PIL image as a ``data:image/png;base64,...`` URI, downscaled to at most ``max_width`` pixels wide."""
    img = image.convert("RGB")
    if img.width > max_width:
        img = img.resize((max_width, max(1, round(img.height * max_width / img.width))))
    buf = io.BytesIO()
    img.save(buf, format="PNG", optimize=True)
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode("ascii")


def _node_html(node: dict) -> str:
    t = node["turn"]
    esc = html.escape
    badge = "" if node.get("finished", True) else ' <span class="cut">[cut at budget]</span>'
    head = (
        f'<span class="node" style="background:{value_colour(node["value"])}">'
        f'{esc(TURN_NAMES.get(t, str(t)))} #{node["index"]} · v={node["value"]:.3f}</span> '
        f'<span class="small">{node["num_tokens"]} tok · logp {node["logp"]:.2f}</span>{badge}'
    )
    body = f'<div class="text">{esc(node["text"]) or "<i>(empty)</i>"}</div>'
    if "children" not in node:
        mark = " ✓" if node.get("exact") else ""
        action = esc(", ".join(f"{k}={v}" for k, v in node.get("action", {}).items()))
        return f'<li>{head}{body}<div class="small">action: {action}{mark}</div></li>'
    kids = "".join(_node_html(c) for c in node["children"])
    return f"<li><details open><summary>{head}</summary>{body}<ul>{kids}</ul></details></li>"


def tree_section(record: dict, image_uri: str | None = None) -> str:
    """One step's section: screenshot, metadata and the tree."""
    esc = html.escape
    cls = record.get("class", "")
    history = "; ".join(record.get("history") or []) or "(none)"
    img = f'<img src="{image_uri}" alt="screenshot">' if image_uri else ""
    meta = (
        f'<div class="meta"><b>step</b>{esc(str(record["episode_id"]))} / {record["step_id"]}<br>'
        f'<b>instruction</b>{esc(record.get("instruction", ""))}<br><b>history</b>{esc(history)}<br>'
        f'<b>golden</b><code>{esc(record.get("golden_text", ""))}</code><br>'
        f'<b>class</b><span class="class-{esc(cls)}">{esc(cls)}</span> · root value '
        f'{record.get("root_value", 0.0):.3f} · branching {record.get("branching")}</div>'
    )
    kids = "".join(_node_html(c) for c in record.get("children", []))
    return f"<section>{img}<div>{meta}<ul>{kids}</ul></div></section>"


def render_html(
    records: Sequence[dict], image_uris: Sequence[str | None] | None = None, title: str = "CoaT-trees"
) -> str:
    """The whole page for ``records`` (``sampling.tree_records.tree_record`` dicts) and optional image URIs."""
    uris = list(image_uris) if image_uris is not None else [None] * len(records)
    if len(uris) != len(records):
        raise ValueError(f"render_html: {len(records)} records but {len(uris)} images")
    sections = "\n".join(tree_section(r, u) for r, u in zip(records, uris))
    return (
        f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8"><title>{html.escape(title)}</title>'
        f"<style>{_STYLE}</style></head><body><h1>{html.escape(title)}</h1>"
        f'<p class="small">{len(records)} trees. Node colour = value (red 0, green 1).</p>\n'
        f"{sections}\n</body></html>\n"
    )


def write_html(path, records: Sequence[dict], images: Sequence | None = None, title: str = "CoaT-trees") -> Path:
    """Write the viewer page; ``images``: PIL images (or None) aligned with ``records``."""
    uris = None if images is None else [None if im is None else image_data_uri(im) for im in images]
    out = storage.as_path(path)  # a local path or a URI
    storage.make_dir(out.parent)
    out.write_text(render_html(records, uris, title), encoding="utf-8")
    return out
