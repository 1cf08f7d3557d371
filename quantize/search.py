"""Step 5, the search: the fewest float layers for which the candidate meets the budget."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from onnxpool.quantize.evaluate import Accuracy


@dataclass(frozen=True)
class Trial:
    excluded: tuple[str, ...]
    disagreement: float
    mean_kl: float
    phase: str


@dataclass
class SearchResult:
    best: tuple[str, ...]
    best_disagreement: float
    met: bool
    best_mean_kl: float = math.inf
    trials: list[Trial] = field(default_factory=list)


Evaluate = Callable[[Sequence[str]], Accuracy]


def search_exclusions(
    candidates: Sequence[str],
    ranked: Sequence[str],
    evaluate: Evaluate,
    budget: float,
    gate: str = "all",
    max_float: int = 12,
    beam: int = 4,
    max_kl: float | None = None,
) -> SearchResult:
    """The fewest float layers (`candidates` in graph order) for which disagreement <= budget
    (and mean KL <= max_kl, if given).

    1. Contiguous prefixes of 0..max_float layers; the first that meets the budget wins.
       Then it is trimmed from its first layer on while the budget holds, so the float
       layers stay ONE contiguous run: each extra float island costs a DequantizeLinear,
       float kernels and a QuantizeLinear (EfficientNet-Lite0: 8 scattered float layers
       1.53x FP32's speed, a 6-layer prefix 1.8x).
    2. Only if no prefix met it: greedy forward from the best prefix, each round trying the
       next `beam` layers of `ranked` (widest calibrated output range first) and keeping
       the one that lowers disagreement (then mean KL) most, up to max_float layers; then
       a backward pass drops every float layer that is not needed.
    `evaluate` is cached by exclusion set, so nothing is measured twice.
    """
    result = SearchResult((), math.inf, False)
    seen: dict[tuple[str, ...], Accuracy] = {}

    def score(acc: Accuracy) -> tuple[float, float]:
        return (acc.disagreement(gate), acc.mean_kl)

    def meets(acc: Accuracy) -> bool:
        return acc.disagreement(gate) <= budget and (max_kl is None or acc.mean_kl <= max_kl)

    best_score = (math.inf, math.inf)

    def trial(excluded: Sequence[str], phase: str) -> Accuracy:
        nonlocal best_score
        key = tuple(sorted(excluded))
        if key not in seen:
            acc = seen[key] = evaluate(list(excluded))
            result.trials.append(Trial(tuple(excluded), acc.disagreement(gate), acc.mean_kl, phase))
            if score(acc) < best_score:
                best_score = score(acc)
                result.best, result.best_disagreement = tuple(excluded), acc.disagreement(gate)
                result.best_mean_kl = acc.mean_kl
        return seen[key]

    winner: list[str] | None = None
    best_prefix: tuple[tuple[float, float], list[str]] | None = None
    for k in range(min(max_float, len(candidates)) + 1):
        prefix = list(candidates[:k])
        acc = trial(prefix, "prefix")
        if best_prefix is None or score(acc) < best_prefix[0]:
            best_prefix = (score(acc), prefix)
        if meets(acc):
            winner = prefix
            while len(winner) > 1 and meets(trial(winner[1:], "trim")):
                winner = winner[1:]
            break
    if winner is None and best_prefix is not None:
        current = list(best_prefix[1])
        current_acc = trial(current, "prefix")
        while not meets(current_acc) and len(current) < max_float:
            pool = [c for c in ranked if c not in current][:beam]
            if not pool:
                break
            tried = [(score(trial([*current, c], "forward")), c) for c in pool]
            new_score, choice = min(tried)
            if new_score >= score(current_acc):
                break
            current.append(choice)
            current_acc = trial(current, "forward")
        if meets(current_acc):
            winner = current
            for node in list(winner):
                shorter = [n for n in winner if n != node]
                if meets(trial(shorter, "backward")):
                    winner = shorter
    if winner is not None:
        result.best = tuple(winner)
        result.best_disagreement = seen[tuple(sorted(winner))].disagreement(gate)
        result.best_mean_kl = seen[tuple(sorted(winner))].mean_kl
        result.met = True
    return result
