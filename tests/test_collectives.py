"""One collective matcher for the findings and the replay (issue 23): gpuprof.collectives.match_ids.

The tables here are SYNTHETIC, built in the test: rows as collective_table / comm_rows give them."""

from __future__ import annotations

import numpy as np
import pandas as pd

from gpuprof.collectives import match_ids

STEP_US = 70_000.0


def _rows(rank: int, lag_us: float, steps: list[int], seq: bool = False) -> pd.DataFrame:
    """Per step a broadcast then three all-reduces on one stream of group "0", the rank starting
    ``lag_us`` behind rank 0 (a slow rank)."""
    out = []
    for n, s in enumerate(steps):
        for j, (coll, nel) in enumerate([("broadcast", 1e6), ("allreduce", 2e6), ("allreduce", 7e6), ("allreduce", 7e6)]):
            out.append({"rank_i": rank, "stream": 17, "ts": s * STEP_US + lag_us + j * 1000.0, "pg": "0", "coll": coll,
                        "name": f"nccl_{coll}", "seq": float(4 * s + j) if seq else np.nan, "nelems": nel, "step": s})
    return pd.DataFrame(out)


def test_a_rank_more_than_half_a_step_behind_is_matched_by_step_not_by_nearest_time() -> None:
    # rank 1 runs 42 ms behind in a 70 ms step: its step-3 broadcast is nearer in time to rank 0's
    # step-4 one than to rank 0's step-3 one; the step numbers say which is which
    c = pd.concat([_rows(0, 0.0, [3, 4, 5]), _rows(1, 42_000.0, [3, 4, 5])], ignore_index=True)
    ids = match_ids(c)
    pairs = pd.DataFrame({"id": ids, "rank": c["rank_i"], "step": c["step"], "coll": c["coll"]})
    per_id = pairs.groupby("id").agg(ranks=("rank", "nunique"), steps=("step", "nunique"), colls=("coll", "nunique"))
    assert len(per_id) == 12 and (per_id["ranks"] == 2).all() and (per_id["steps"] == 1).all()
    assert (per_id["colls"] == 1).all()


def test_sequence_numbers_win_over_order_and_outside_steps_order_is_aligned_by_shift() -> None:
    # with Seq, rank 1's rows given in another order still pair by Seq
    a, b = _rows(0, 0.0, [3, 4], seq=True), _rows(1, 500.0, [3, 4], seq=True).iloc[::-1]
    c = pd.concat([a, b], ignore_index=True)
    ids = match_ids(c)
    same = pd.DataFrame({"id": ids, "seq": c["seq"]}).groupby("id")["seq"].nunique()
    assert len(same) == 8 and (same == 1).all()
    # outside the steps (step -1), no Seq: rank 1's window opened one collective later; the shift
    # that makes kinds and sizes agree pairs them
    x, y = _rows(0, 0.0, [3, 4]), _rows(1, 300.0, [3, 4]).iloc[1:]
    c = pd.concat([x, y], ignore_index=True).assign(step=-1)
    ids = match_ids(c)
    got = pd.DataFrame({"id": ids, "rank": c["rank_i"], "nel": c["nelems"], "coll": c["coll"], "ts": c["ts"]})
    both = got.groupby("id").filter(lambda g: g["rank"].nunique() == 2)
    assert len(both) == 14 and (both.groupby("id")["coll"].nunique() == 1).all()
    assert (both.groupby("id")["ts"].agg(lambda t: t.max() - t.min()) < 1000).all()
