"""Trainer configs as dataclasses whose fields carry a one-line description, exposed as CLI flags."""
from __future__ import annotations

import argparse
import dataclasses
from typing import Any


def arg(default: Any, help: str) -> Any:
    """A config field with its one-line description (also the ``--help`` text of its CLI flag)."""
    return dataclasses.field(default=default, metadata={"help": help})


def add_config_flags(parser: argparse.ArgumentParser, config_cls) -> None:
    """One ``--field-name`` flag per config field, defaulting to None (= keep the dataclass default)."""
    for f in dataclasses.fields(config_cls):
        parser.add_argument("--" + f.name.replace("_", "-"), type=type(f.default), default=None,
                            help=f.metadata.get("help", ""))


def config_overrides(args: argparse.Namespace, config_cls) -> dict:
    """The config fields given on the command line."""
    return {f.name: getattr(args, f.name) for f in dataclasses.fields(config_cls) if getattr(args, f.name) is not None}
