"""The SAC trainer's replay (reference_impl/sac/replay.py), the dual-buffer scheme of seed 000 §7: a FIFO
ring whose pointer and fill count stay on the device, uniform sampling over the stored rows only, the mixed
batch (agent rows first, then demo rows; an empty buffer lends its quota) and a checkpoint round trip.
Until now only the trainers' runs exercised it."""
from __future__ import annotations

import pytest
import torch

from reference_impl.sac.replay import FIELDS, Replay, _uniform_index, sample_mixed

pytestmark = pytest.mark.meta
H = 3  # observation window


def _rows(actions, *, demo=False):
    a = torch.tensor(actions, dtype=torch.long)
    n = len(a)
    return {"obs": a[:, None].repeat(1, H), "action": a, "reward": a.float() / 10,
            "next_obs": a[:, None].repeat(1, H) + 1, "done": a % 2 == 0, "is_demo": torch.full((n,), demo),
            "is_relabeled": torch.zeros(n, dtype=torch.bool)}


def _stored(buf: Replay) -> list[int]:
    return buf.data["action"][: len(buf)].tolist()


@pytest.mark.clause("SAC-MIX-1")
def test_the_ring_keeps_the_newest_rows_in_place_and_counts_on_the_device():
    buf = Replay(4, H)
    buf.add(_rows([1, 2, 3]))
    assert (len(buf), int(buf.ptr), _stored(buf)) == (3, 3, [1, 2, 3])
    buf.add(_rows([4, 5, 6]))  # wraps: 4 in slot 3, then 5 and 6 over the two oldest
    assert (len(buf), int(buf.ptr), _stored(buf)) == (4, 2, [5, 6, 3, 4])
    assert buf.ptr.device == buf.size.device == buf.data["action"].device
    row = buf.rows(torch.tensor([1]))
    assert row["obs"].dtype == torch.long and row["obs"].tolist() == [[6] * H] and row["next_obs"].tolist() == [[7] * H]
    assert row["reward"].tolist() == pytest.approx([0.6]) and row["done"].tolist() == [True]
    assert set(row) == set(FIELDS)


def test_only_the_kept_rows_go_in_and_in_their_order():
    buf = Replay(5, H)
    buf.add(_rows([1, 2, 3, 4]), keep=torch.tensor([False, True, False, True]))
    assert (len(buf), int(buf.ptr), _stored(buf)) == (2, 2, [2, 4])
    buf.add(_rows([7, 8]), keep=torch.zeros(2, dtype=torch.bool))  # nothing kept: nothing moves
    assert (len(buf), int(buf.ptr), _stored(buf)) == (2, 2, [2, 4])


def test_an_index_drawn_from_u_is_uniform_over_the_stored_rows():
    u = torch.tensor([0.0, 0.2499, 0.25, 0.99, torch.nextafter(torch.tensor(1.0, dtype=torch.float64),
                                                                torch.tensor(0.0, dtype=torch.float64))],
                     dtype=torch.float64)
    assert _uniform_index(u, torch.tensor(4)).tolist() == [0, 0, 1, 3, 3]
    assert _uniform_index(u, torch.tensor(0)).tolist() == [0] * 5  # an empty count never indexes past row 0
    assert _uniform_index(u, torch.tensor(1)).tolist() == [0] * 5


def test_sampling_draws_every_stored_row_and_never_an_empty_slot():
    buf = Replay(8, H)
    buf.add(_rows([1, 2, 3]))
    got = buf.sample(3000, torch.Generator().manual_seed(0))["action"]
    counts = torch.bincount(got, minlength=9).tolist()
    assert sum(counts[1:4]) == 3000 and min(counts[1:4]) > 900, counts  # 1000 each in expectation


def test_the_mixed_batch_puts_agent_rows_first_and_an_empty_buffer_lends_its_quota():
    agent, demo = Replay(8, H), Replay(8, H)
    g = torch.Generator().manual_seed(1)
    agent.add(_rows([1, 2]))
    only_agent = sample_mixed(agent, demo, 3, 2, g)
    assert set(only_agent["action"].tolist()) <= {1, 2}
    demo.add(_rows([5, 6], demo=True))
    mixed = sample_mixed(agent, demo, 3, 2, g)
    assert set(mixed["action"][:3].tolist()) <= {1, 2} and set(mixed["action"][3:].tolist()) <= {5, 6}
    assert mixed["is_demo"].tolist() == [False] * 3 + [True] * 2
    assert mixed["obs"].shape == (5, H) and mixed["obs"][:3, 0].tolist() == mixed["action"][:3].tolist()
    empty_agent = sample_mixed(Replay(8, H), demo, 3, 2, g)
    assert set(empty_agent["action"].tolist()) <= {5, 6}


def test_a_checkpoint_round_trip_continues_where_it_stopped():
    buf = Replay(4, H)
    buf.add(_rows([1, 2, 3, 4, 5]))
    again = Replay(4, H)
    again.load_state_dict(buf.state_dict())
    assert (len(again), int(again.ptr), _stored(again)) == (4, 1, [5, 2, 3, 4])
    for b in (buf, again):
        b.add(_rows([9]))
    assert _stored(again) == _stored(buf) == [5, 9, 3, 4]
    assert all(torch.equal(again.data[k][:4], buf.data[k][:4]) for k in FIELDS)


def test_a_checkpoint_holds_the_rows_as_they_were_when_it_was_taken():
    """A checkpoint is written after the state is taken (a background save, a resume test that keeps it): rows the
    buffer writes later must not reach it, so its data are copies, not views of the live ring."""
    buf = Replay(4, H)
    buf.add(_rows([1, 2, 3]))
    state = buf.state_dict()
    buf.add(_rows([7, 8]))
    assert state["data"]["action"].tolist() == [1, 2, 3] and state["data"]["obs"][:, 0].tolist() == [1, 2, 3]
    assert all(v.device.type == "cpu" for v in state["data"].values())
