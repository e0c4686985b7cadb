"""A TextWorld game as a CCAPO environment: text observation, admissible commands, room, outcome.

Wraps ``textworld.start``. The location (the anchor's Abstract_Loc, CCAPO-ANCHOR-1) is the room the
player is in, read from the game's facts (at(P, r)) rather than parsed from prose. The policy reads
the game's last feedback plus the room and the carried objects, also from the facts: asking
TextWorld for its description and inventory texts replays "look" and "inventory" inside the game
after every command and doubles the cost of a step.
"""
from __future__ import annotations

import warnings
from pathlib import Path


def _request_infos():
    import textworld

    return textworld.EnvInfos(admissible_commands=True, won=True, lost=True, score=True, max_score=True,
                              feedback=True, facts=True)


def _room(facts) -> str:
    """Name of the room r of the fact at(P, r) (P is the player)."""
    for f in facts:
        if f.name == "at" and f.arguments[0].type == "P":
            return f.arguments[1].name
    raise ValueError("the game state has no at(P, room) fact")


def _carried(facts) -> list[str]:
    """Names of the objects o of the facts in(o, I) (I is the inventory), sorted."""
    return sorted(f.arguments[0].name for f in facts if f.name == "in" and f.arguments[1].type == "I")


class TextWorldEnv:
    """One episode at a time of one compiled game, cut off after ``max_steps`` commands."""

    def __init__(self, path: str | Path, max_steps: int):
        import textworld

        self.path = str(path)
        self.max_steps = max_steps
        with warnings.catch_warnings():  # jericho: "not fully supported"; TextWorld tracks score and state itself
            warnings.simplefilter("ignore", UserWarning)
            self._env = textworld.start(self.path, request_infos=_request_infos())
        self.reset()

    def reset(self) -> None:
        self._state = self._env.reset()
        self.t = 0
        self.done = False

    @property
    def won(self) -> bool:
        return bool(self._state.won)

    @property
    def score(self) -> int:
        return int(self._state.score)

    @property
    def max_score(self) -> int:
        return int(self._state.max_score)

    def admissible(self, drop_examine: bool = False) -> list[str]:
        """The game's admissible commands, sorted; ``drop_examine`` leaves out examine/look/inventory,
        which never change the state of these games (kept when nothing else is admissible)."""
        cmds = sorted(self._state.admissible_commands)
        if drop_examine:
            cmds = [c for c in cmds if c.split()[0] not in ("examine", "look", "inventory")] or cmds
        return cmds

    def location(self) -> str:
        return _room(self._state.facts)

    def state_key(self) -> str:
        """The full world state (all facts): equal keys mean the same state (GiGPO's anchor states)."""
        return "|".join(sorted(str(f) for f in self._state.facts))

    def observation(self) -> str:
        """What the policy reads: room, carried objects, then the last feedback."""
        carried = ", ".join(_carried(self._state.facts)) or "nothing"
        return f"room: {self.location()}. carrying: {carried}. {self._state.feedback.strip()}"

    def step(self, command: str) -> None:
        if self.done:
            raise RuntimeError("step() on a finished episode; call reset()")
        self._state, _, game_over = self._env.step(command)
        self.t += 1
        self.done = bool(game_over) or self.won or bool(self._state.lost) or self.t >= self.max_steps

    def close(self) -> None:
        self._env.close()
