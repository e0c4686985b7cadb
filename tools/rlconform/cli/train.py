"""``rlconform train NAME ...``: a reference trainer, with its own command line."""
from __future__ import annotations

import importlib

from rlconform.cli._common import UsageError

# Trainers: ``rlconform train NAME ...`` calls ``module:function(argv)``.
TRAINERS = {
    "sac": "reference_impl.sac.trainer:cli",
    "sac-suite": "rlconform.golive:main",
    "ppo": "reference_impl.ppo.trainer:cli",
    "mappo": "reference_impl.ppo.mappo_trainer:cli",
    "isreshape": "reference_impl.isreshape.trainer:cli",
    "isreshape-lm": "reference_impl.isreshape.lm.trainer:cli",
    "ccapo": "reference_impl.ccapo.trainer:cli",
    "ccapo-textworld": "reference_impl.ccapo.textworld.trainer:cli",
}



def add_parser(sub) -> None:
    """The trainer's name; its options are its own."""
    t = sub.add_parser("train", help="train a reference trainer (see `rlconform train NAME --help`)", add_help=False)
    t.add_argument("name", choices=sorted(TRAINERS))


def help_text() -> str:
    lines = ["usage: rlconform train NAME [TRAINER OPTIONS]  (rlconform train NAME --help: the trainer's options)", "",
             "trainers:"]
    lines += [f"  {name:16s} {target.partition(':')[0]}" for name, target in sorted(TRAINERS.items())]
    return "\n".join(lines) + "\n"


def run(args, rest) -> int:
    target = TRAINERS[args.name]
    mod_name, _, fn = target.partition(":")
    try:
        mod = importlib.import_module(mod_name)
    except ModuleNotFoundError as e:
        raise UsageError(f"{args.name}: trainer not available ({e})") from None
    try:
        return int(getattr(mod, fn)(rest) or 0)
    except (FileExistsError, ValueError) as e:  # the trainers refuse a bad configuration or a busy --out this way
        raise UsageError(f"{args.name}: {e}") from None


