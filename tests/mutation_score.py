"""Score a mutmut run by module: `mutmut results --all true | python tests/mutation_score.py`.

mutmut prints one line per mutant, `    spotlight.rl.grpo.x_clip__mutmut_3: survived`; the
score of a module is killed / (killed + survived). Mutants mutmut could not judge (timeouts,
segfaults, "no tests" for lines no selected test reaches, "not checked" for a cut-off run) are
counted beside it, not in it, so an uncovered function shows up as such instead of lowering
the score silently.
"""
from __future__ import annotations

import sys
from collections import Counter, defaultdict

CAUGHT = {"killed", "timeout", "segfault"}


def tally(lines) -> dict[str, Counter]:
    by_module: dict[str, Counter] = defaultdict(Counter)
    for line in lines:
        name, sep, status = line.strip().rpartition(": ")
        if not sep or "__mutmut_" not in name:
            continue
        module = name.rsplit("__mutmut_", 1)[0].rsplit(".", 1)[0]
        by_module[module][status.strip()] += 1
    return by_module


def score(counts: Counter) -> float:
    caught = sum(counts[s] for s in CAUGHT)
    judged = caught + counts["survived"]
    return caught / judged if judged else float("nan")


def table(by_module: dict[str, Counter]) -> str:
    rows = ["| module | mutants | caught | survived | not covered | not run | score |",
            "|---|---|---|---|---|---|---|"]
    total: Counter = Counter()
    for module in sorted(by_module):
        counts = by_module[module]
        total += counts
        rows.append(_row(module, counts))
    rows.append(_row("**all**", total))
    return "\n".join(rows)


def _row(module: str, counts: Counter) -> str:
    caught = sum(counts[s] for s in CAUGHT)
    return (f"| {module} | {sum(counts.values())} | {caught} | {counts['survived']} | "
            f"{counts['no tests']} | {counts['not checked']} | {score(counts):.1%} |")


if __name__ == "__main__":
    found = tally(sys.stdin)
    if not found:
        sys.exit("mutation_score: no mutant lines on stdin; run `mutmut run` first, then pipe "
                 "`mutmut results --all true` into this script")
    print(table(found))
