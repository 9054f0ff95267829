"""The starting policy's selection (docs/method.md §9): each SFT candidate samples one tree per chosen step (same
keys for all); ``choose`` picks the highest Acc_S + w · Div_R / max Div_R.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable, Sequence

import numpy as np

from ipl_jax.coat.rewards import RewardConfig
from ipl_jax.data.records import Step
from ipl_jax.eval.embeddings import embed_texts, resolve_embedder
from ipl_jax.eval.trees import iter_tree_batches, score_batch
from ipl_jax.progress import progress
from ipl_jax.sampling.tree_records import turn_texts

# ---------------------------------------------------------------------------------------------- the two scores


def sibling_std(embeddings: np.ndarray) -> np.ndarray:
    """embeddings f32[..., K, D] -> f32[...]: std over the K siblings per dimension, averaged over D."""
    return np.std(embeddings, axis=-2).mean(axis=-1)


def tree_diversity(level_embeddings: Sequence[np.ndarray], branching: Sequence[int]) -> np.ndarray:
    """Div of each tree: f32[B], the mean over branching turns of the mean ``sibling_std`` per parent node (NaN
    when no turn branches). level_embeddings[t-1]: f32[B, b1, ..., bt, D], L2-normalised."""
    per_turn = []
    for t, k in enumerate(branching, start=1):
        if int(k) < 2:
            continue
        e = level_embeddings[t - 1]
        b, d = e.shape[0], e.shape[-1]
        per_turn.append(sibling_std(e.reshape(b, -1, int(k), d)).mean(axis=1))
    if not per_turn:
        return np.full(level_embeddings[0].shape[0], np.nan, np.float32)
    return np.mean(np.stack(per_turn, axis=0), axis=0)


@dataclasses.dataclass
class CandidateScore:
    name: str
    acc_s: float
    div_r: float
    leaves: int
    trees: int
    score: float = float("nan")
    alpha: float = 0.0  # shares of the sampled trees whose leaves all / some / none match (docs/method.md §6)
    beta: float = 0.0
    gamma: float = 0.0

    def to_json(self) -> dict:
        return dataclasses.asdict(self)


def choose(scores: Sequence[CandidateScore], diversity_weight: float) -> int:
    """Index of the highest ``Acc_S + w · Div_R / max Div_R`` (earlier on ties); fills each candidate's ``score``."""
    if not scores:
        raise ValueError("no candidates to choose from")
    top = max((s.div_r for s in scores if math.isfinite(s.div_r)), default=0.0)
    best, best_i = -math.inf, 0
    for i, s in enumerate(scores):
        div = s.div_r / top if top > 0 and math.isfinite(s.div_r) else 0.0
        s.score = float(s.acc_s + diversity_weight * div)
        if s.score > best:
            best, best_i = s.score, i
    return best_i


def score_candidates(
    candidates: Sequence[tuple[str, object]],
    steps: Sequence[Step],
    sampler_config: Callable,
    reward: RewardConfig,
    *,
    discount: float,
    seed: int,
    batch_size: int,
    embedder: str = "auto",
    echo: Callable[[str], None] = print,
) -> tuple[list[CandidateScore], str]:
    """Acc_S and Div_R of each ``(name, Policy)`` on ``steps`` (same keys for all): trees of
    ``sampler_config(tokenizer)`` in batches of ``batch_size`` keyed by ``seed``, leaves scored with ``reward`` and
    ``discount``. Returns (scores, embedder used)."""
    kind = resolve_embedder(embedder)
    sampled = []  # per candidate: (per batch: texts, valid, exact)
    for name, policy in candidates:
        t0 = time.perf_counter()
        sconfig = sampler_config(policy.tokenizer)
        batches = []
        for batch in progress(
            iter_tree_batches(policy, steps, sconfig, seed, batch_size),
            total=-(-len(steps) // batch_size),
            desc=f"starting-policy selection {name}",
            unit="batch",
        ):
            texts = turn_texts(batch.tree, policy.tokenizer)
            _, scores = score_batch(batch, texts, reward, discount)
            exact = np.asarray(scores.exact, bool).reshape(len(batch.steps), -1)
            batches.append((texts, np.asarray(batch.tree.step_valid, bool), exact))
        sampled.append((name, sconfig.branching, batches))
        echo(f"  {name}: sampled {len(steps)} trees in {time.perf_counter() - t0:.1f} s")

    # one embedding space for every candidate's texts
    all_texts = [
        str(x) for _, _, batches in sampled for texts, _, _ in batches for level in texts for x in level.reshape(-1)
    ]
    t0 = time.perf_counter()
    table = embed_texts(all_texts, kind)
    echo(
        f"  embedded {len(all_texts)} texts ({len(set(all_texts))} distinct) with {kind} in "
        f"{time.perf_counter() - t0:.1f} s"
    )
    cursor = 0
    scores = []
    for name, branching, batches in sampled:
        hits, leaves, divs = 0, 0, []
        classes = np.zeros(3, np.int64)
        for texts, valid, exact in batches:
            level_emb = []
            for level in texts:
                n = level.size
                level_emb.append(table[cursor : cursor + n].reshape(level.shape + (table.shape[-1],)))
                cursor += n
            div = tree_diversity(level_emb, branching)
            per_tree = exact[valid].sum(axis=1)
            n_leaves = exact.shape[1]
            classes += [
                int(np.sum(per_tree == n_leaves)),
                int(np.sum((per_tree > 0) & (per_tree < n_leaves))),
                int(np.sum(per_tree == 0)),
            ]
            hits += int(exact[valid].sum())
            leaves += int(exact[valid].size)
            divs.extend(float(d) for d in div[valid])
        finite = [d for d in divs if math.isfinite(d)]
        scores.append(
            CandidateScore(
                name=name,
                acc_s=hits / max(1, leaves),
                div_r=float(np.mean(finite)) if finite else float("nan"),
                leaves=leaves,
                trees=len(divs),
                **dict(zip(("alpha", "beta", "gamma"), (classes / max(1, classes.sum())).tolist())),
            )
        )
    return scores, kind


def format_scores(scores: Sequence[CandidateScore], chosen: int) -> str:
    lines = [f"{'candidate':<48}{'Acc_S %':>9}{'Div_R':>9}{'score':>9}"]
    for i, s in enumerate(scores):
        mark = "  <- start" if i == chosen else ""
        lines.append(f"{s.name[-48:]:<48}{100 * s.acc_s:>9.2f}{s.div_r:>9.4f}{s.score:>9.4f}{mark}")
    return "\n".join(lines)
