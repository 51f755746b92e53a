"""The operator console: a pane per agent, a prompt, and a status line (a textual app).

Each pane shows its agent's turns as they stream (a long text as its head and tail, the
whole in the log), the notes it sends and receives with their receipts, refusals, and —
in a box on that agent's own pane — the held note itself with ``write to NAME? y / n``,
one question at a time. The prompt at the bottom types into the selected pane's agent
(``/team`` lines and ``@`` mentions included). While the selected agent has a question
up, the next key answers it (``y`` sends, every other key is no), except within
:data:`GUARD_S` of the box appearing, when it goes on into the prompt: the prompt is
never disabled nor re-focused, so a half-typed line survives every question. The keys
are listed in :data:`HELP` (``?`` / ``F1``) and in docs/plane.md.

The plane runs in the same event loop, owned by the same task group as the app, and
starts once the app is drawn, so events (the recovery after a restart included) reach
the panes without threads.
"""

from __future__ import annotations

import asyncio
import signal
import time
from collections import deque
from collections.abc import Iterable
from typing import TYPE_CHECKING, ClassVar

from rich.table import Table
from rich.text import Text
from textual import events
from textual.app import App, ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.widgets import Input, RichLog, Static

from melchior.plane.config import PlaneConfig
from melchior.plane.delivery import Event
from melchior.plane.runner import Plane
from melchior.plane.state import Held

if TYPE_CHECKING:
    from melchior.plane.webhook import Webhook

STYLE = {
    "operator": "bold",
    "webhook": "yellow",
    "turn": "cyan",
    "progress": "dim",
    "done": "",
    "answer": "green",
    "note": "green",
    "team": "magenta",
    "error": "red",
}


GUARD_S = 0.3
"""A key typed this soon after a question appears is not its answer: it was meant for
the prompt (a hand mid-word cannot have read the note), so it stays there."""
HEAD_LINES = 40
TAIL_LINES = 40
"""A long text shows its first and last lines on the pane; the whole is in ``plane log``."""
LINE_CHARS = 2000
"""The longest line a pane draws; a longer one is cut, saying how much is left out."""


def shorten(text: str) -> str:
    """``text`` as a pane draws it: bounded in lines and in characters per line, with the
    cut said where it is — so a 4 MiB output costs the console what 80 lines do."""
    lines = text.splitlines() or [""]
    if len(lines) > HEAD_LINES + TAIL_LINES:
        left = len(lines) - HEAD_LINES - TAIL_LINES
        lines = [
            *lines[:HEAD_LINES],
            f"… {left} more lines; the whole text is in `melchior plane log` …",
            *lines[-TAIL_LINES:],
        ]
    out = []
    for line in lines:
        if len(line) > LINE_CHARS:
            line = f"{line[:LINE_CHARS]}… ({len(line) - LINE_CHARS} more characters in the log)"
        out.append(line)
    return "\n".join(out)


HELP = (
    "ctrl+n/ctrl+p: next/previous pane · PgUp/PgDn: scroll the pane · Home/End (empty "
    "prompt): top/bottom · ctrl+x: stop the selected agent's running turn · ctrl+r: run "
    "its failed/interrupted/stopped turn again · ctrl+o: what is queued for it · "
    "ctrl+f: search the pane for the prompt's text · a question: y sends, any other key "
    "is no · ? or F1: this help · ctrl+q: quit"
)
"""The help line: every control of the console, in one place (also in docs/plane.md)."""


class Pane(Vertical):
    """One agent: its log and, when a held note waits, the question with the note."""

    def __init__(self, agent: str) -> None:
        super().__init__(id=f"pane-{agent}", classes="pane")
        self.agent = agent
        self.log_view = RichLog(wrap=True, markup=False, max_lines=2000, min_width=16)
        self.note = Static("", classes="note-text")
        self.question = VerticalScroll(self.note, classes="question")
        self.history: deque[str] = deque(maxlen=2000)
        """What the pane drew, as text, for ctrl+f (bounded as the log view is)."""

    def compose(self) -> ComposeResult:
        yield self.log_view
        yield self.question

    def write(self, event: Event) -> None:
        """One event as one entry: a prefix column and the text beside it, so wrapped and
        continuation lines keep their indent; drawn once whatever its length."""
        if event.kind == "state":
            return
        prefix = {"operator": "> ", "progress": "  . ", "turn": "-- ", "done": "<< "}.get(
            event.kind, f"[{event.kind}] "
        )
        style = STYLE.get(event.kind, "")
        text = event.text
        if event.kind == "question":  # the question itself is in the box, with the note
            text = f"note to {(event.data or {}).get('to', '?')} held: it waits for your y / n"
        grid = Table.grid(padding=0, expand=True)
        grid.add_column(width=len(prefix), no_wrap=True)
        grid.add_column(ratio=1, overflow="fold")
        drawn = shorten(text)
        self.history.extend(f"{prefix}{line}" for line in drawn.splitlines())
        grid.add_row(Text(prefix, style=style), Text(drawn, style=style))
        self.log_view.write(grid, expand=True)

    def ask(self, held: Held, more: int) -> None:
        """Show ``held``: who writes to whom on which hop, the note itself, and how many
        more wait behind it (each is shown only once this one is answered)."""
        waiting = f" · {more} more waiting" if more else ""
        head = Text(
            f"{held.sender} → {held.recipient} · hop {held.chain.hop}{waiting}\n",
            style="bold",
        )
        body = Text(shorten(held.text) + "\n")
        tail = Text(f"write to {held.recipient}? y / n  (y sends, any other key is no)")
        self.note.update(Text.assemble(head, body, tail))
        self.question.add_class("up")
        self.question.scroll_home(animate=False)

    def clear_question(self) -> None:
        self.question.remove_class("up")


def key_actions(bindings: Iterable[BindingType], *, skip: str = "") -> dict[str, str]:
    """Each key of ``bindings`` (but ``skip``) and the action it runs: the prompt runs
    these itself, in the order typed, rather than leave them to textual's bindings."""
    actions: dict[str, str] = {}
    for binding in bindings:
        if not isinstance(binding, Binding):
            continue
        for key in binding.key.split(","):
            if key.strip() != skip:
                actions[key.strip()] = binding.action
    return actions


class Prompt(Input):
    """The prompt. It stays enabled and focused while a question is up, and does not
    select its text on focus, so a half-typed line is never lost; a key that answers the
    question is taken before the prompt sees it.

    Every key is handled in the order it was typed: the editing keys run their action
    here rather than as bindings, which textual dispatches after the key has been through
    the widget, so on a busy loop a Left typed before ``-`` moved the cursor after the
    ``-`` had gone in at the end."""

    EDITING: ClassVar[dict[str, str]] = key_actions(Input.BINDINGS, skip="enter")
    """The editing keys (arrows, Home/End, deletes, …) from ``Input``'s own table, so a
    key textual adds is covered too; Enter submits, in :meth:`_on_key`."""

    def __init__(self, console: Console) -> None:
        super().__init__(
            placeholder="type to the selected agent (/team, @name)",
            id="prompt",
            select_on_focus=False,
        )
        self.console_app = console

    async def action_submit(self) -> None:
        self._submit()

    def _submit(self) -> None:
        line = self.value
        self.value = ""
        self.console_app.submit_line(line)

    async def _on_key(self, event: events.Key) -> None:
        if self.console_app.take_answer(event):
            event.stop()
            event.prevent_default()
            return
        action = self.console_app.KEYS.get(event.key)
        if action is not None:
            # The console's own keys too: as priority bindings the app ran them as they
            # arrived, ahead of the keys before them still waiting here (ctrl+f searched
            # for half the text typed before it; an Enter then ctrl+n sent the line to the
            # next pane).
            event.stop()
            event.prevent_default()
            await self.console_app.run_action(action)
            return
        if self.console_app.control_key(event.key, empty=not self.value):
            event.stop()
            event.prevent_default()
            return
        if event.key == "enter":
            # Taken here, in order with the keys around it: as a binding the submit ran
            # after keys typed behind the Enter, which went into the line just sent.
            event.stop()
            event.prevent_default()
            self._submit()
            return
        action = self.EDITING.get(event.key)
        if action is not None:
            event.stop()
            event.prevent_default()
            await self.run_action(action)
            return
        await super()._on_key(event)


class Console(App[int]):
    """The operator console for one plane."""

    CSS = """
    #panes { height: 1fr; }
    .pane { border: round $panel-lighten-2; width: 1fr; }
    .pane.selected { border: double $accent; }
    .question { display: none; border: round $warning; height: auto; max-height: 14;
                padding: 0 1; }
    .note-text { height: auto; }
    .question.up { display: block; }
    #status { height: 1; background: $panel; }
    #help { display: none; height: auto; background: $panel; padding: 0 1; }
    #help.up { display: block; }
    #prompt { dock: bottom; }
    """
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("ctrl+n,ctrl+right", "move(1)", "next pane"),
        Binding("ctrl+p,ctrl+left", "move(-1)", "previous pane"),
        Binding("ctrl+q", "quit", "quit"),
        Binding("ctrl+x", "stop_turn", "stop the selected agent's turn"),
        Binding("ctrl+r", "rerun", "run the last failed turn again"),
        Binding("ctrl+o", "queued", "what is queued for the selected agent"),
        Binding("ctrl+f", "search", "search the pane for the prompt's text"),
        Binding("f1", "help", "help"),
    ]
    """Bindings for when the prompt does not have the focus; while it has (always, but
    for a click elsewhere) the prompt runs them itself from :attr:`KEYS`, in the order
    typed, ahead of its own editing keys of the same name (ctrl+x, ctrl+left, …)."""
    KEYS: ClassVar[dict[str, str]] = key_actions(BINDINGS)

    def __init__(self, plane: Plane) -> None:
        super().__init__()
        self.plane = plane
        self.panes = {a: Pane(a) for a in plane.config.ids}
        self.order = list(plane.config.ids)
        self.selected = 0
        self.webhook_at = ""
        self.asked_at: dict[str, tuple[int, float]] = {}
        """Per agent: the held note its box shows and when it was put in front of the
        operator (for the guard)."""
        self.drawn = asyncio.Event()
        """Set once the app is mounted: the plane starts (and recovers) only then."""
        self.status = Static("", id="status")
        self.help = Static(Text(HELP), id="help")
        self.prompt = Prompt(self)
        # Events that come before the app runs (the recovery after a restart, a webhook
        # line in the first instant) cannot touch a widget yet: they wait here and are
        # drawn, in order, once the app is mounted.
        self._early: list[Event] | None = []
        plane.listeners.append(self.on_plane_event)

    @property
    def agent(self) -> str:
        return self.order[self.selected]

    def compose(self) -> ComposeResult:
        with Horizontal(id="panes"):
            yield from self.panes.values()
        yield self.help
        yield self.status
        yield self.prompt

    def on_mount(self) -> None:
        self.title = "melchior plane"
        self._select(0)
        self.prompt.focus()
        early, self._early = self._early or [], None
        for event in early:
            self.on_plane_event(event)
        for held in self.plane.questions():
            self._show_question(held.sender)
        self.set_interval(1.0, self._refresh_status)
        self.drawn.set()

    # -- panes and status -----------------------------------------------------------------

    def _select(self, index: int) -> None:
        self.selected = index % len(self.order)
        for i, agent in enumerate(self.order):
            self.panes[agent].set_class(i == self.selected, "selected")
        self._refresh_titles()
        asked = self.plane.questions(self.agent)
        if asked:  # the box is in front of the operator from now on
            self.asked_at[self.agent] = (asked[0].id, time.monotonic())
        self._refresh_prompt()

    def action_move(self, step: int) -> None:
        self._select(self.selected + step)

    def _refresh_titles(self) -> None:
        for agent, pane in self.panes.items():
            st = self.plane.status(agent)
            mark = "▶ " if agent == self.agent else ""
            pane.border_title = Text(f"{mark}{agent} · {st.state}")

    def _refresh_status(self) -> None:
        parts = []
        for agent in self.order:
            st = self.plane.status(agent)
            q = f" y/n:{st.questions}" if st.questions else ""
            parts.append(f"{agent}: {st.state} {st.ceiling}{q}")
        if self.webhook_at:
            parts.append(f"webhook {self.webhook_at}")
        self.status.update(Text(" | ".join(parts)))
        self._refresh_titles()

    def _show_question(self, agent: str) -> None:
        """The box shows the oldest held note of ``agent``; the guard starts when a
        different note comes up."""
        asked = self.plane.questions(agent)
        pane = self.panes.get(agent)
        if pane is None:
            return
        if asked:
            held = asked[0]
            if self.asked_at.get(agent, (None,))[0] != held.id:
                self.asked_at[agent] = (held.id, time.monotonic())
            pane.ask(held, len(asked) - 1)
        else:
            self.asked_at.pop(agent, None)
            pane.clear_question()
        self._refresh_prompt()

    def _refresh_prompt(self) -> None:
        """Only the placeholder changes: the prompt is never disabled nor re-focused, so
        what was typed and where the cursor is survive every question and refresh."""
        asking = bool(self.plane.questions(self.agent))
        self.prompt.placeholder = (
            f"{self.agent} asks above: y sends the note, any other key is no"
            if asking
            else f"type to {self.agent} (/team, /team NAME, @name)"
        )

    def take_answer(self, event: events.Key) -> bool:
        """Is ``event`` the answer to the selected agent's question? Then answer it.

        A printable key, Enter or Escape answers (``y`` sends, the rest is no); other keys
        (arrows, scrolling, the bindings) do not. Within :data:`GUARD_S` of the box
        appearing a key is not an answer: a printable one goes on into the prompt, Enter
        and Escape are swallowed so a line is not sent under a question just raised."""
        asked = self.plane.questions(self.agent)
        if not asked:
            return False
        answering = event.is_printable or event.key in ("enter", "escape")
        if not answering:
            return False
        held = asked[0]
        shown = self.asked_at.get(self.agent)
        if shown is None or shown[0] != held.id:
            self._show_question(self.agent)
            shown = self.asked_at.get(self.agent)
        # measured from when the key was read (textual stamps it, with the monotonic
        # clock on POSIX), not when it is handled: a busy loop must not turn keys typed
        # in one burst with the box into answers
        if shown is not None and event.time - shown[1] < GUARD_S:
            return event.key in ("enter", "escape")
        self.plane.answer(held.id, event.character or event.key)
        self._show_question(self.agent)
        self._refresh_status()
        return True

    def on_plane_event(self, event: Event) -> None:
        if self._early is not None:
            self._early.append(event)
            return
        pane = self.panes.get(event.agent)
        if pane is not None:
            pane.write(event)
        if event.kind in ("question", "note"):
            self._show_question(event.agent)
        self._refresh_status()

    # -- input ------------------------------------------------------------------------------

    def control_key(self, key: str, *, empty: bool) -> bool:
        """The console's own keys that reach the prompt: scrolling the selected pane
        (PgUp/PgDn always; Home/End when the prompt is empty, else they move its cursor)
        and ``?`` for help on an empty prompt. True when taken."""
        log = self.panes[self.agent].log_view
        if key == "pageup":
            log.scroll_page_up(animate=False)
        elif key == "pagedown":
            log.scroll_page_down(animate=False)
        elif key == "home" and empty:
            log.scroll_home(animate=False)
        elif key == "end" and empty:
            log.scroll_end(animate=False)
        elif key == "question_mark" and empty:
            self.action_help()
        else:
            return False
        return True

    def action_help(self) -> None:
        self.help.toggle_class("up")

    def action_stop_turn(self) -> None:
        if not self.plane.stop_turn(self.agent):
            self.panes[self.agent].write(
                Event(self.agent, "error", f"ctrl+x: no turn of {self.agent} is running")
            )

    def action_rerun(self) -> None:
        self.panes[self.agent].write(Event(self.agent, "team", self.plane.rerun(self.agent)))
        self._refresh_status()

    def action_queued(self) -> None:
        self.panes[self.agent].write(Event(self.agent, "team", self.plane.queued(self.agent)))

    def action_search(self) -> None:
        """ctrl+f: the prompt's text is searched for (case-insensitive) in what the
        selected pane drew; the matching lines are listed on the pane and the prompt
        keeps its text (to refine it, or to send it after all)."""
        term = self.prompt.value.strip()
        pane = self.panes[self.agent]
        if not term:
            text = "ctrl+f: type what to look for in the prompt first, then ctrl+f"
        else:
            hits = [line for line in pane.history if term.lower() in line.lower()]
            shown = hits[-20:]
            more = f" (the last {len(shown)} shown)" if len(hits) > len(shown) else ""
            text = "\n".join([f"search {term!r}: {len(hits)} line(s){more}", *shown])
        pane.write(Event(self.agent, "search", text))

    def submit_line(self, line: str) -> None:
        """A line the operator typed at the selected agent's prompt."""
        if not line.strip():
            return
        shown = self.plane.operator_line(self.agent, line)
        if not shown.startswith("> "):
            return  # a /team line: its answer is already in the pane
        self._refresh_status()


def run_console(config: PlaneConfig) -> int:
    """Run the plane under the console until the operator quits."""

    async def main() -> int:
        plane = Plane(config)
        app = Console(plane)
        code = 0
        # SIGTERM (a service manager, kill) and SIGINT from outside the terminal end the
        # console as quitting does: turns stopped, the terminal given back as it was. The
        # default action would leave the terminal in the app's raw, alternate screen.
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, app.exit)

        async def plane_once_drawn() -> None:
            # The recovery after a restart (held notes, interrupted turns) draws on the
            # panes, so the plane starts only once the app is up to draw them.
            await app.drawn.wait()
            await plane.run()

        try:
            webhook = _webhook(plane, app)  # a port in use is said before the screen clears
            async with asyncio.TaskGroup() as group:
                running = group.create_task(plane_once_drawn())
                if webhook is not None:
                    group.create_task(webhook.serve())
                try:
                    code = await app.run_async() or 0
                finally:
                    # the app is gone: what the stopping plane says goes to its log only
                    plane.listeners.remove(app.on_plane_event)
                    plane.stop()
                    running.cancel()
                    if webhook is not None:
                        webhook.stop()
        finally:
            plane.state.close()
        return code

    from melchior.plane.state import StateBusy

    try:
        return asyncio.run(main())
    except StateBusy as exc:
        raise SystemExit(f"melchior plane: {exc}") from None


def _webhook(plane: Plane, app: Console) -> Webhook | None:
    import os

    from melchior.plane.webhook import Webhook, WebhookPortError

    hook = plane.config.webhook
    if hook is None:
        return None
    token = os.environ.get(hook.token_env, "")
    if not token:
        raise SystemExit(f"melchior plane: the webhook needs a token in ${hook.token_env}")
    try:
        webhook = Webhook(plane, token, hook.listen, hook.port)
    except WebhookPortError as exc:
        raise SystemExit(f"melchior plane: {exc}") from None
    app.webhook_at = f"http://{hook.listen}:{webhook.port}/agents/NAME/lines"
    return webhook
