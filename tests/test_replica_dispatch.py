"""Generation requests over several engine replicas (``planning.dispatch``, ``System.generate``).

The pieces on hand cases, and on a real local Ray cluster in the stand-in mode (logical GPUs, the engines on their
CPU path): the same short run with one engine replica and with two, which must end with the same rows, league and
adapter files (``comparable_state``): each request keeps its seed and adapter whichever replica serves it.
"""

from __future__ import annotations

import pytest

from planning.dispatch import PIECES_PER_REPLICA, imbalance_s, piece_count, pieces


def test_pieces_cover_every_request_once_in_the_order_handed_out():
    assert pieces([1.0] * 10, 1) == [list(range(10))]
    assert pieces([1.0] * 10, 2, "even") == [[0, 1, 2, 3, 4], [5, 6, 7, 8, 9]]
    assert pieces([1.0] * 3, 2, "even") == [[0, 1], [2]]
    queue = pieces([1.0] * 10, 2)
    assert len(queue) == 2 * PIECES_PER_REPLICA and [i for p in queue for i in p] == list(range(10))
    assert sorted(len(p) for p in queue) == [1] * 6 + [2] * 2
    assert pieces([1.0] * 3, 2) == [[0], [1], [2]]  # never an empty piece
    costs = [1.0, 5.0, 1.0, 9.0, 5.0, 1.0, 1.0, 1.0]
    assert pieces(costs, 2, "longest_first", per_replica=2) == [[3, 1], [4, 0], [2, 5], [6, 7]]  # stable on ties
    assert pieces([2.0] * 8, 2, "longest_first") == pieces([2.0] * 8, 2)  # equal costs: the request order
    assert pieces([], 2) == []
    # no piece below a replica's batch (min_rows) unless that leaves fewer pieces than replicas: the even split
    assert pieces([1.0] * 10, 2, rows=[4] * 10, min_rows=256) == [[0, 1, 2, 3, 4], [5, 6, 7, 8, 9]]
    assert len(pieces([1.0] * 10, 2, rows=[4] * 10, min_rows=10)) == 4  # 40 rows: 4 pieces of 10
    assert piece_count(10, 2, rows=40, min_rows=10) == 4 and piece_count(10, 2, rows=40, min_rows=0) == 8
    with pytest.raises(ValueError, match="unknown dispatch policy 'lpt'"):
        pieces([1.0], 2, "lpt")


def test_the_tail_is_one_mean_piece_on_all_replicas_but_one():
    assert imbalance_s(80.0, 1) == 0.0
    assert imbalance_s(80.0, 2) == pytest.approx(0.5 * 80 / (2 * 2 * PIECES_PER_REPLICA))
    assert imbalance_s(80.0, 4, pieces_per_replica=2) == pytest.approx(0.75 * 80 / (2 * 8))
    assert imbalance_s(80.0, 4, pieces_per_replica=1) == 0.0  # the even split



def test_two_engine_replicas_give_the_run_of_one(short_run, tmp_path, monkeypatch):
    """The shared short run (conftest ``short_run``: two steps of the tiny test model, one engine on the CPU) again
    with two engine replicas (two logical GPUs in the stand-in mode, both engines on their CPU path, the requests
    through the work queue): every request keeps its seed and adapter, and the transformers engine draws each row
    from its own generator, so the rows, the league and the adapter files are byte-equal. Its logits are not
    bit-identical across batches (the left-padding width and one- or two-row matrix products change the float
    sums by ~1e-6, docs/inference.md); the sampled tokens, all a run's rows depend on here, stay the same.
    A replica's batch is set to one row (the engines' cap as ``planning.dispatch`` reads it, ``HF_MAX_BATCH_ROWS``; the driver runs here), so
    the short run's batches go through the queue in up to 4 pieces per replica instead of one each."""
    from actors.driver import train
    from configs import load_config
    from reporting.run_dir import comparable_state
    from short_runs import SHORT_RUN
    from standin_cluster import standin_cluster

    assert short_run.returncode == 0, short_run.stderr[-3000:]
    config = load_config(None, [*SHORT_RUN, "run.steps=2", "run.dashboard=false", "resources.inference_gpus=2",
                                f"run.run_dir={tmp_path / 'two'}"])
    monkeypatch.setattr("planning.dispatch.HF_MAX_BATCH_ROWS", 1)
    with standin_cluster({"num_cpus": 6, "num_gpus": 2}):
        assert train(config, output="quiet") == 0
    one, two = comparable_state(short_run.run_dir, 2), comparable_state(tmp_path / "two", 2)
    assert two[2] == one[2], "the step rows differ"
    assert two[0] == one[0], "the league differs"
    assert two[1].keys() == one[1].keys() and two[1] == one[1], "the adapter files differ"
