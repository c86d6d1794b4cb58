"""optimum-dynamo's options on optimum's command parsers, added so that they never collide.

optimum's own parser may already define an option we add (optimum-onnx's main branch defines `--dynamo`):
argparse then raises and optimum-cli dies before it does anything. So each option says what to do on a
collision: `take_over` options (`--dynamo`, whose meaning here is this package's pipeline) replace optimum's
definition; the others are left to optimum's definition of the same spelling (only free spellings are added).
"""

from __future__ import annotations

import argparse
import itertools
import logging
from dataclasses import dataclass, field
from typing import Any

logger = logging.getLogger(__name__)
GROUP = "optimum-dynamo"


@dataclass(frozen=True)
class Option:
    strings: tuple[str, ...]  # spellings, as argparse takes them ("-v", "--verbose")
    kwargs: dict[str, Any] = field(default_factory=dict)  # add_argument's keywords
    take_over: bool = False  # replace optimum's definition of the same spelling


def _subsets(strings: tuple[str, ...]):
    """Non-empty subsets of `strings`, largest first, in their order."""
    for size in range(len(strings), 0, -1):
        yield from itertools.combinations(strings, size)


def add_options(parser: argparse.ArgumentParser, options) -> None:
    """Add `options` to `parser` in one group; a spelling optimum already defines is taken over (`take_over`)
    or left to optimum's definition (argparse refuses a second one before changing anything, so the largest
    free subset of the spellings is added)."""
    group = parser.add_argument_group(GROUP)
    for option in options:
        for strings in _subsets(option.strings):
            try:
                group.add_argument(*strings, **option.kwargs)
                break
            except argparse.ArgumentError:
                if option.take_over:  # replace optimum's definition of these spellings
                    group.conflict_handler = "resolve"
                    try:
                        group.add_argument(*strings, **option.kwargs)
                    finally:
                        group.conflict_handler = "error"
                    logger.debug("%s taken over from optimum's parser", "/".join(strings))
                    break
        else:
            logger.debug("%s: optimum's definition is used", "/".join(option.strings))


def defaults(build, argv) -> dict[str, Any]:
    """Every option of the parser `build(parser)` makes -> its default (`argv`: its required arguments)."""
    parser = argparse.ArgumentParser()
    build(parser)
    return vars(parser.parse_args(argv))


def collisions(build, options) -> dict[str, list[str]]:
    """Spellings of `options` that the parser `build(parser)` makes (optimum's alone) defines already."""
    found = {}
    for option in options:
        for string in option.strings:
            parser = argparse.ArgumentParser(add_help=False)
            build(parser)
            try:
                parser.add_argument(string, action="store_true")
            except argparse.ArgumentError:
                found.setdefault("/".join(option.strings), []).append(string)
    return found


__all__ = ["GROUP", "Option", "add_options", "collisions", "defaults"]
