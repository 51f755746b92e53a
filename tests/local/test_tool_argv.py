"""The tool's argparse-free reading of ``--flag=value`` says what argparse would say.

The fast path exists for start-up time only; if it ever read a request differently from
the documented parser, a harness would see two tools. Every argv it accepts must give
argparse's namespace, and everything else must be left to argparse.
"""

from __future__ import annotations

import argparse
import subprocess
import sys

from hypothesis import given, settings
from hypothesis import strategies as st

from melchior.commands import tool as tool_command

FLAG = st.sampled_from([*tool_command.FLAGS] * 3 + ["schema", "mess", "bogus", "h"])
VALUE = st.one_of(
    st.text(max_size=12),
    st.sampled_from(["0", "1", "7", "-3", "²", "٣", " 2", "--who", "a=b", "", "--", "-", "-x"]),
)


@st.composite
def arg(draw: st.DrawFn) -> str:
    flag = draw(FLAG)
    # Mostly the accepted shape, so whole argv lists the fast path takes are common.
    shape = draw(st.sampled_from(["--{f}={v}"] * 6 + ["--{f}", "{v}", "-{f}", "--{f}={v}={v}"]))
    value = draw(st.integers(0, 20).map(str) | VALUE if flag == "page" else VALUE)
    return shape.format(f=flag, v=value)


def _argparse(args: list[str]) -> argparse.Namespace | None:
    parser = argparse.ArgumentParser(prog="melchior tool", exit_on_error=False)
    tool_command.add_arguments(parser)

    def fail(message: str) -> None:
        raise argparse.ArgumentError(None, message)

    parser.error = fail  # type: ignore[method-assign]
    try:
        return parser.parse_args(args)
    except (argparse.ArgumentError, SystemExit):
        return None


@settings(max_examples=500)
@given(st.lists(arg(), max_size=6))
def test_fast_path_agrees_with_argparse(args: list[str]) -> None:
    fast = tool_command.parse_fast(args)
    if fast is None:
        return  # argparse decides, with its own messages
    slow = _argparse(args)
    assert slow is not None, f"fast path accepted what argparse refuses: {args}"
    assert vars(fast) == vars(slow)


def test_fast_path_leaves_help_and_spaced_values_to_argparse() -> None:
    assert tool_command.parse_fast(["--help"]) is None
    assert tool_command.parse_fast(["--verb", "who"]) is None
    assert tool_command.parse_fast(["--mess=hi"]) is None
    assert tool_command.parse_fast(["--page=0"]) is None
    ns = tool_command.parse_fast(["--verb=tell", "--message=--who=x", "--page=2", "--schema"])
    assert ns is not None
    assert (ns.verb, ns.message, ns.page, ns.schema) == ("tell", "--who=x", 2, True)


def test_help_still_comes_from_argparse() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "melchior.cli", "tool", "--help"],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    assert "--verb VERB" in out.stdout
    assert "usage: melchior tool" in out.stdout
