"""A tiny text-free agentic task for the CCAPO trainer: fetch a key, then open the chest.

Rooms have fixed *types* (kitchen, hall, ...) but every layout (the "prompt" / seed) wires them
differently and hides the key and the chest in different rooms, so the STDB has to generalise
across layouts through abstract fingerprints, exactly the setting of seed 004 §3.1. Actions are
ALFWorld-style commands ("go to hall 1", "take key 1", "open chest 1"); only corridors from the
current room are admissible, and a take or open that cannot succeed is a no-op that still costs a
step (an A→A loop when repeated).
"""
from __future__ import annotations

import dataclasses

import numpy as np

ROOMS = ("kitchen", "hall", "bedroom", "bathroom", "garage", "office")
R = len(ROOMS)
ACTIONS = tuple(f"go to {r} 1" for r in ROOMS) + ("take key 1", "open chest 1")
TAKE, OPEN = R, R + 1
OBS_DIM = 4 * R + 1


@dataclasses.dataclass(frozen=True)
class Layout:
    adjacency: np.ndarray  # [R, R] bool, symmetric, connected
    start: int
    key: int
    chest: int

    @property
    def shortest(self) -> int:
        """Steps of the best episode: walk to the key, take it, walk to the chest, open it."""
        return _dist(self.adjacency, self.start, self.key) + _dist(self.adjacency, self.key, self.chest) + 2


def _dist(adj: np.ndarray, a: int, b: int) -> int:
    seen, frontier, d = {a}, [a], 0
    while b not in seen:
        frontier = [j for i in frontier for j in np.flatnonzero(adj[i]) if j not in seen]
        seen.update(frontier)
        d += 1
    return d


KEY_HOME, CHEST_HOME = (ROOMS.index("bedroom"), ROOMS.index("office")), (ROOMS.index("garage"), ROOMS.index("kitchen"))


def make_layout(rng: np.random.Generator, *, prior: float = 0.0) -> Layout:
    """A random spanning tree over the rooms plus one extra corridor; key and chest in distinct rooms.

    With probability ``prior`` the key lies in a bedroom or office and the chest in a garage or
    kitchen (a regularity shared by layouts, like ALFWorld's apples in fridges); otherwise anywhere.
    """
    order = rng.permutation(R)
    adj = np.zeros((R, R), dtype=bool)
    for k in range(1, R):
        j = order[rng.integers(0, k)]
        adj[order[k], j] = adj[j, order[k]] = True
    a, b = rng.choice(R, 2, replace=False)
    adj[a, b] = adj[b, a] = True
    start, key, chest = rng.choice(R, 3, replace=False)
    if prior > 0 and rng.random() < prior:  # no draw at prior 0: uniform layouts stay reproducible
        key, chest = rng.choice(KEY_HOME), rng.choice(CHEST_HOME)
        start = rng.choice([r for r in range(R) if r not in (key, chest)])
    return Layout(adj, int(start), int(key), int(chest))


class KeyChestEnv:
    """One episode on one layout."""

    def __init__(self, layout: Layout, max_steps: int):
        self.layout, self.max_steps = layout, max_steps
        self.room, self.has_key, self.t, self.done, self.success = layout.start, False, 0, False, False

    def obs(self) -> np.ndarray:
        L, o = self.layout, np.zeros(OBS_DIM, dtype=np.float32)
        o[self.room] = 1.0
        o[R] = float(self.has_key)
        if not self.has_key:
            o[R + 1 + L.key] = 1.0
        o[2 * R + 1 + L.chest] = 1.0
        o[3 * R + 1:] = L.adjacency[self.room]
        return o

    def legal(self) -> np.ndarray:
        """Admissible commands (as ALFWorld lists them): corridors from here, take, open."""
        return np.concatenate([self.layout.adjacency[self.room], [True, True]])

    def location(self) -> str:
        return ROOMS[self.room]

    def step(self, action: int) -> None:
        L = self.layout
        if action < R:
            if L.adjacency[self.room, action]:
                self.room = action
        elif action == TAKE:
            if self.room == L.key and not self.has_key:
                self.has_key = True
        elif action == OPEN and self.has_key and self.room == L.chest:
            self.success = True
        self.t += 1
        self.done = self.success or self.t >= self.max_steps
