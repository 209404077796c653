"""The three routing tiers on the routing set (issue 35), offline: from each request's candidates
(connector, cosine, BM25) as bench/semantic.py's accuracy section computes them.

    dispatch  lead >= margin: the best is run
    confirm   confirm_margin <= lead < margin: AMBIGUOUS_ACTION with the best two, the first
              suggested (the agent asks its user one yes/no question)
    open      lead < confirm_margin: AMBIGUOUS_ACTION with every candidate

``margin`` and the lexical weight are chosen on dev by semantic.py's rule (least deferral with no
ambiguous request dispatched and >= 98 % of the dispatched right). ``confirm_margin`` is chosen on
dev after them: the largest lower bound (so the most vague requests get the open question) that
keeps the open tier at most MAX_OPEN_SHARE of the clear requests and the right connector among the
two offered in at least 98 % of the clear requests the confirm tier answers.
"""

from __future__ import annotations

from typing import Any

Cands = list[tuple[str, float, float]]  # (connector, cosine, BM25), any order

MAX_OPEN_SHARE = 0.05  # of dev's clear requests; the target is <= 10 % on the held-out splits
MIN_RIGHT_IN_TWO = 0.98
# relaxed margins an operator may opt into, reported with their cost on the held-out splits
RELAXED_MARGINS = (0.035, 0.03, 0.025, 0.02)


def fused(cands: Cands, w_lex: float) -> list[tuple[float, str]]:
    return sorted(((sem + w_lex * lex, name) for name, sem, lex in cands), reverse=True)


def tier_of(cands: Cands, w_lex: float, margin: float, confirm_margin: float) -> tuple[str, list[str]]:
    """(tier, the connectors offered best first: one for dispatch, two for confirm, all for open),
    as connectors.routing.Ranking.tier decides."""
    scores = fused(cands, w_lex)
    lead = scores[0][0] - scores[1][0]
    names = [n for _, n in scores]
    if lead >= margin:
        return "dispatch", names[:1]
    if lead >= confirm_margin and lead > 0:
        return "confirm", names[:2]
    return "open", names


def tally(
    rows: list[dict[str, Any]], cands: list[Cands], w_lex: float, margin: float, confirm: float
) -> dict[str, Any]:
    """Per tier: clear requests (and whether the right connector was run or offered), ambiguous ones."""
    out: dict[str, Any] = {"clear": 0, "ambiguous": 0}
    counts = {t: {"clear": 0, "right": 0, "ambiguous": 0} for t in ("dispatch", "confirm", "open")}
    langs: dict[str, dict[str, int]] = {}
    for row, c in zip(rows, cands):
        tier, offered = tier_of(c, w_lex, margin, confirm)
        if row["expect"] is None:
            out["ambiguous"] += 1
            counts[tier]["ambiguous"] += 1
            continue
        out["clear"] += 1
        counts[tier]["clear"] += 1
        counts[tier]["right"] += row["expect"] in offered
        lang = langs.setdefault(row["lang"], {"clear": 0, "dispatch": 0, "confirm": 0, "open": 0})
        lang["clear"] += 1
        lang[tier] += 1
    clear = max(out["clear"], 1)
    d, c, o = counts["dispatch"], counts["confirm"], counts["open"]
    out.update(
        {
            "tiers": counts,
            "dispatched_share": round(d["clear"] / clear, 4),
            "dispatched_accuracy": round(d["right"] / d["clear"], 4) if d["clear"] else None,
            "ambiguous_dispatched": d["ambiguous"],
            "confirm_share": round(c["clear"] / clear, 4),
            "right_in_two": round(c["right"] / c["clear"], 4) if c["clear"] else None,
            "open_share": round(o["clear"] / clear, 4),
            # run right at once, or settled by one yes/no question whose two include the right one
            "settled_share": round((d["right"] + c["right"]) / clear, 4),
            "by_language": {
                lang: {
                    "clear": v["clear"],
                    **{f"{t}_share": round(v[t] / v["clear"], 4) for t in ("dispatch", "confirm", "open")},
                }
                for lang, v in langs.items()
            },
        }
    )
    return out


def calibrate_confirm(rows: list[dict[str, Any]], cands: list[Cands], w_lex: float, margin: float) -> float:
    """On dev: the largest confirm_margin below ``margin`` whose open tier holds at most
    MAX_OPEN_SHARE of the clear requests and whose confirm tier offers the right connector among
    its two for at least MIN_RIGHT_IN_TWO of the clear requests it answers."""
    leads = sorted({round(fused(c, w_lex)[0][0] - fused(c, w_lex)[1][0], 4) for c in cands})
    best = 0.0
    for bound in [0.0, *(x + 1e-4 for x in leads if x + 1e-4 < margin)]:
        t = tally(rows, cands, w_lex, margin, round(bound, 4))
        if t["open_share"] <= MAX_OPEN_SHARE and (t["right_in_two"] or 1.0) >= MIN_RIGHT_IN_TWO:
            best = max(best, round(bound, 4))
    return best


def relaxed(
    rows: list[dict[str, Any]], cands: list[Cands], w_lex: float, confirm: float, splits: dict[str, list[int]]
) -> list[dict[str, Any]]:
    """What each relaxed margin (an operator's opt-in) costs on the held-out splits: ambiguous
    requests dispatched and wrong dispatches, against the clear requests it settles at once."""
    out = []
    for margin in RELAXED_MARGINS:
        entry: dict[str, Any] = {"margin": margin}
        for split in ("test", "fresh"):
            ids = splits[split]
            t = tally([rows[i] for i in ids], [cands[i] for i in ids], w_lex, margin, min(confirm, margin))
            entry[split] = {
                k: t[k] for k in ("dispatched_share", "dispatched_accuracy", "ambiguous_dispatched", "open_share")
            }
        out.append(entry)
    return out
