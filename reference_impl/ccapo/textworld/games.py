"""TextWorld cooking games generated on this machine, by seed, into a cache directory.

A game is fixed by its settings and its seed: generating it twice gives the same file, so a run
names its games by (settings, seeds) and the cache only saves time. The train and held-out sets use
disjoint seed ranges. Needs the ``textworld`` package (``pip install textworld``); nothing is
downloaded.
"""
from __future__ import annotations

import dataclasses
import os
import warnings
from pathlib import Path

HELDOUT_SEED_OFFSET = 100_000  # held-out seeds start here; train seeds start at 0


@dataclasses.dataclass(frozen=True)
class GameSpec:
    """Settings of ``tw-make tw-cooking`` (see textworld.challenges.tw_cooking.make)."""

    recipe: int = 1  # ingredients in the recipe
    take: int = 1  # ingredients the player must find and take (<= recipe)
    go: int = 1  # rooms: 1, 6, 9 or 12
    open: bool = False  # containers and doors start closed
    cook: bool = False  # some ingredients must be cooked
    cut: bool = False  # some ingredients must be cut
    seed: int = 0

    def stem(self) -> str:
        flags = "".join(f for f, on in (("o", self.open), ("c", self.cook), ("x", self.cut)) if on)
        return f"cooking-r{self.recipe}t{self.take}g{self.go}{flags}-s{self.seed}"

    def tw_make(self, out: str | Path) -> str:
        """The equivalent shell command, for the results page."""
        flags = "".join(f" --{f}" for f in ("open", "cook", "cut") if getattr(self, f))
        return (f"tw-make tw-cooking --recipe {self.recipe} --take {self.take} --go {self.go}{flags} "
                f"--seed {self.seed} --output {out}")


def generate(spec: GameSpec, cache_dir: str | Path) -> Path:
    """Path of the compiled game (``.z8`` plus its ``.json``), generated on first use."""
    import textworld
    from textworld.challenges.tw_cooking import cooking

    cache = Path(cache_dir)
    cache.mkdir(parents=True, exist_ok=True)
    path = cache / f"{spec.stem()}.z8"
    if path.exists() and path.with_suffix(".json").exists():
        return path
    options = textworld.GameOptions()
    options.seeds = spec.seed
    # compile to a private name, then rename: two processes filling one cache never read half a file
    options.path = str(cache / f".{spec.stem()}.{os.getpid()}.z8")
    options.file_ext = ".z8"
    options.force_recompile = True
    settings = {"recipe": spec.recipe, "take": spec.take, "go": spec.go, "open": spec.open, "cook": spec.cook,
                "cut": spec.cut, "drop": False, "recipe_seed": 0, "split": None}
    with warnings.catch_warnings():  # jericho's "not fully supported" on the compile check; harmless here
        warnings.simplefilter("ignore", UserWarning)
        game = cooking.make(settings, options=options)
        compiled = Path(textworld.generator.compile_game(game, options))
    for ext in (".json", ".z8"):  # the .z8 last: its presence means the pair is complete
        os.replace(compiled.with_suffix(ext), path.with_suffix(ext))
    compiled.with_suffix(".ni").unlink(missing_ok=True)
    return path


def game_set(base: GameSpec, seeds, cache_dir: str | Path) -> list[Path]:
    """Games of ``base``'s settings, one per seed."""
    return [generate(dataclasses.replace(base, seed=int(s)), cache_dir) for s in seeds]


def train_and_heldout(base: GameSpec, n_train: int, n_heldout: int, cache_dir: str | Path):
    """Train games use seeds 0..n_train-1, held-out games HELDOUT_SEED_OFFSET + 0..n_heldout-1."""
    train = game_set(base, range(n_train), cache_dir)
    heldout = game_set(base, range(HELDOUT_SEED_OFFSET, HELDOUT_SEED_OFFSET + n_heldout), cache_dir)
    return train, heldout
