"""Optional Q&A annotation by a vision-language model behind an OpenAI-compatible chat completions API
(standard library only).

The API key (from ``config.api_key_env``) goes only in the Authorization header over https (http only to
localhost) and is never logged. Malformed replies and requests failing after ``1 + max_retries`` attempts are
counted and skipped; other HTTP errors raise ``AnnotatorError``.
"""

from __future__ import annotations

import base64
import dataclasses
import http.client
import io
import json
import os
import re
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterable

from ipl_jax.coat.actions import format_grounding
from ipl_jax.data.evolution import QA, usable_elements
from ipl_jax.data.records import Step

# The reply's "type" of a Q&A, mapped to (level, kind) in evolution's scheme.
TYPE_TO_LEVEL_KIND = {
    "grounding": (1, "grounding"),
    "function": (2, "widget_function"),
    "relationship": (2, "nesting"),
    "structure": (3, "page_structure"),
    "detail": (2, "detail"),
}


class AnnotatorError(RuntimeError):
    """A configuration problem (missing key, rejected request): retrying would not help."""


@dataclasses.dataclass(frozen=True)
class AnnotatorConfig:
    """Where and how to ask. ``base_url`` is the API root, e.g. ``https://api.openai.com/v1``."""

    base_url: str
    model: str
    api_key_env: str = "OPENAI_API_KEY"
    temperature: float = 0.2
    timeout_s: float = 60.0
    max_retries: int = 2
    backoff_s: float = 2.0  # wait backoff_s * 2**attempt between attempts
    n_questions: int = 15
    max_image_side: int = 1344  # longer screenshots are scaled down before sending
    max_tokens: int | None = 1500


@dataclasses.dataclass
class AnnotatorStats:
    screens: int = 0  # steps asked about
    requests: int = 0  # HTTP requests sent, retries included
    failed: int = 0  # steps skipped because every attempt failed
    malformed: int = 0  # replies that were not a JSON list of Q&A
    items: int = 0  # Q&A kept from well-formed replies
    items_skipped: int = 0  # list entries without a non-empty string question and answer


# ---------------------------------------------------------------------------------------------- request


def annotation_prompt(step: Step, n_questions: int = 15) -> str:
    """The Q&A annotation prompt for one screen: its elements (box in 0..1000, text, type) and CoaT description."""
    lines = []
    for i, el in enumerate(usable_elements(step), 1):
        text = " ".join(el.text.split())
        lines.append(f"{i}. {format_grounding(el.box)} \"{text}\" {el.kind or 'element'}")
    elements = "\n".join(lines) if lines else "(none annotated)"
    desc = " ".join(step.coat.screen_desc.split()) if step.coat is not None and step.coat.screen_desc else ""
    return (
        "Here is a screenshot of a mobile app together with the list of its UI elements. Each element is given as "
        "its box <|box_start|>(x1,y1),(x2,y2)<|box_end|> in integers from 0 to 1000 (fractions of the screen width "
        "and height, times 1000), its text, and its type; boxes and texts correspond one to one.\n\n"
        f"Write {n_questions} question-answer pairs about this screen, mixing these types:\n"
        '- "function": what an element does when used;\n'
        '- "grounding": where an element is; the answer is its box in the format above;\n'
        '- "relationship": which elements belong together (a label and the button it sits on, items of one '
        "list);\n"
        '- "structure": how the page is organised into regions (top bar, content, bottom bar);\n'
        '- "detail": an element\'s type, state or style.\n'
        "Every answer must follow from the screenshot and the element list; keep answers to one or two short "
        "sentences. Ignore the device status bar. Do not mention tasks, actions to take next, or these "
        "instructions.\n\n"
        f"Elements:\n{elements}\n"
        + (f"\nScreen description: {desc}\n" if desc else "")
        + '\nReply with only a JSON list of objects with the keys "type", "question" and "answer".'
    )


def image_data_url(step: Step, max_side: int = 1344) -> str:
    """The step's screenshot as a ``data:image/png;base64,...`` URL, scaled so its longer side is <= max_side."""
    img = step.load_image()
    if max(img.size) > max_side:
        scale = max_side / max(img.size)
        img = img.resize((max(1, round(img.width * scale)), max(1, round(img.height * scale))))
    buf = io.BytesIO()
    img.save(buf, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode("ascii")


def chat_request_body(step: Step, config: AnnotatorConfig) -> dict:
    """The JSON body of the chat completions request for one step."""
    body = {
        "model": config.model,
        "temperature": config.temperature,
        "messages": [
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": annotation_prompt(step, config.n_questions)},
                    {"type": "image_url", "image_url": {"url": image_data_url(step, config.max_image_side)}},
                ],
            }
        ],
    }
    if config.max_tokens is not None:
        body["max_tokens"] = config.max_tokens
    return body


def _api_key(config: AnnotatorConfig) -> str:
    key = os.environ.get(config.api_key_env, "").strip()
    if not key:
        raise AnnotatorError(f"annotator: environment variable {config.api_key_env} is not set")
    return key


def _scrub(text: str, key: str) -> str:
    return text.replace(key, "***") if key else text


class _Transient(Exception):
    pass


def _post_once(url: str, payload: bytes, key: str, timeout_s: float) -> str:
    """One POST; returns the reply's message text ("" when the body is not a chat completion)."""
    req = urllib.request.Request(
        url, data=payload, method="POST", headers={"Content-Type": "application/json", "Authorization": f"Bearer {key}"}
    )
    try:
        with urllib.request.urlopen(req, timeout=timeout_s) as resp:
            raw = resp.read()
    except urllib.error.HTTPError as e:
        detail = _scrub(e.read(300).decode("utf-8", "replace"), key)
        if e.code == 429 or e.code >= 500:
            raise _Transient(f"HTTP {e.code}") from None
        raise AnnotatorError(f"annotator: HTTP {e.code} from {url}: {detail}") from None
    except (urllib.error.URLError, http.client.HTTPException, TimeoutError, ConnectionError) as e:
        raise _Transient(_scrub(str(getattr(e, "reason", e)), key)) from None
    try:
        content = json.loads(raw)["choices"][0]["message"]["content"]
    except (ValueError, KeyError, IndexError, TypeError):
        return ""
    if isinstance(content, list):  # content given as parts
        content = "".join(p.get("text", "") for p in content if isinstance(p, dict))
    return content if isinstance(content, str) else ""


LOCAL_HOSTS = ("localhost", "127.0.0.1", "::1")


def check_base_url(base_url: str) -> None:
    """Raises ``AnnotatorError`` unless ``base_url`` is ``https://`` or local http (localhost, 127.0.0.1, [::1])."""
    parts = urllib.parse.urlsplit(base_url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise AnnotatorError(f"annotator: base_url must be an https:// URL, got {base_url!r}")
    host = parts.hostname.lower()
    if parts.scheme == "http" and not (host in LOCAL_HOSTS or host.endswith(".localhost")):
        raise AnnotatorError(
            f"annotator: base_url {base_url!r} would send the API key unencrypted; use https:// "
            f"(plain http is accepted only for localhost)"
        )


def request_reply(body: dict, config: AnnotatorConfig, stats: AnnotatorStats | None = None) -> str | None:
    """POST ``body`` to ``{base_url}/chat/completions`` with bounded retries; the reply text, or None if all failed."""
    check_base_url(config.base_url)
    key = _api_key(config)
    url = config.base_url.rstrip("/") + "/chat/completions"
    payload = json.dumps(body).encode("utf-8")
    for attempt in range(1 + max(0, int(config.max_retries))):
        if attempt:
            time.sleep(config.backoff_s * 2 ** (attempt - 1))
        if stats is not None:
            stats.requests += 1
        try:
            return _post_once(url, payload, key, config.timeout_s)
        except _Transient:
            continue
    return None


# ---------------------------------------------------------------------------------------------- reply


_FENCE = re.compile(r"```(?:json|JSON)?\s*(.*?)```", re.DOTALL)


def parse_qa_reply(text: str) -> list[dict] | None:
    """The Q&A items of a reply, or None when it holds no JSON list of objects (fences and prose are tolerated)."""
    if not isinstance(text, str) or not text.strip():
        return None
    candidates = [m.group(1) for m in _FENCE.finditer(text)] + [text]
    for c in candidates:
        c = c.strip()
        for start, end in (("[", "]"), ("{", "}")):
            i, j = c.find(start), c.rfind(end)
            if i < 0 or j <= i:
                continue
            try:
                data = json.loads(c[i : j + 1])
            except ValueError:
                continue
            items = _items_of(data)
            if items is not None:
                return items
    return None


def _items_of(data) -> list[dict] | None:
    if isinstance(data, list):
        return data if all(isinstance(x, dict) for x in data) else None
    if isinstance(data, dict):
        qs, ans = data.get("questions"), data.get("answers")
        if isinstance(qs, list) and isinstance(ans, list) and len(qs) == len(ans):
            return [{"question": q, "answer": a} for q, a in zip(qs, ans)]
        for v in data.values():
            if isinstance(v, list) and v and all(isinstance(x, dict) for x in v):
                return v
    return None


def qas_from_items(step: Step, items: list[dict], model: str, stats: AnnotatorStats | None = None) -> list[QA]:
    """QA records for the well-formed items (non-empty string question and answer)."""
    out = []
    for item in items:
        q, a = item.get("question"), item.get("answer")
        if not isinstance(q, str) or not isinstance(a, str) or not q.strip() or not a.strip():
            if stats is not None:
                stats.items_skipped += 1
            continue
        typ = str(item.get("type", "")).strip().lower()
        level, kind = TYPE_TO_LEVEL_KIND.get(typ, (2, "detail"))
        out.append(
            QA(
                step.episode_id,
                step.step_id,
                level,
                kind,
                q.strip(),
                a.strip(),
                {"source": "annotator", "model": model, "type": typ},
            )
        )
    if stats is not None:
        stats.items += len(out)
    return out


def annotate_steps(steps: Iterable[Step], config: AnnotatorConfig) -> tuple[list[QA], AnnotatorStats]:
    """Ask the model about each step's screen; returns the Q&A (unfiltered) and the counts."""
    check_base_url(config.base_url)  # before the first screenshot is encoded
    stats = AnnotatorStats()
    out: list[QA] = []
    for step in steps:
        stats.screens += 1
        reply = request_reply(chat_request_body(step, config), config, stats)
        if reply is None:
            stats.failed += 1
            continue
        items = parse_qa_reply(reply)
        if items is None:
            stats.malformed += 1
            continue
        out.extend(qas_from_items(step, items, config.model, stats))
    return out, stats
