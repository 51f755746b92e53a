"""The operator console: a pane per agent, a prompt, and a status line (a textual app).

Each pane shows its agent's turns as they stream, the notes it sends and receives with
their receipts, refusals, and — in a box on that agent's own pane — the question for a
held note, ``write to NAME? y / n``. The prompt at the bottom types into the selected
pane's agent (``/team`` lines and ``@`` mentions included); ``ctrl+n`` / ``ctrl+p`` (or
``ctrl+right`` / ``ctrl+left``) move between panes; ``ctrl+q`` quits. While the selected
agent has a question up, the prompt steps aside and the next key answers it: ``y`` sends,
every other key is no — which is what makes it safe to raise under a hand that was
typing something else.

The plane runs in the same event loop, owned by the same task group as the app, so
events reach the panes without threads.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, ClassVar

from rich.text import Text
from textual import events
from textual.app import App, ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Horizontal, Vertical
from textual.widgets import Input, RichLog, Static

from melchior.plane.config import PlaneConfig
from melchior.plane.delivery import Event
from melchior.plane.runner import Plane

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


class Pane(Vertical):
    """One agent: its log and, when a held note waits, the question."""

    def __init__(self, agent: str) -> None:
        super().__init__(id=f"pane-{agent}", classes="pane")
        self.agent = agent
        self.log_view = RichLog(wrap=True, markup=False, max_lines=2000, min_width=16)
        self.question = Static("", classes="question")

    def compose(self) -> ComposeResult:
        yield self.log_view
        yield self.question

    def write(self, event: Event) -> None:
        if event.kind == "state":
            return
        prefix = {"operator": "> ", "progress": "  . ", "turn": "-- ", "done": "<< "}.get(
            event.kind, f"[{event.kind}] "
        )
        style = STYLE.get(event.kind, "")
        for i, line in enumerate(event.text.splitlines() or [""]):
            self.log_view.write(
                Text(("" if i == 0 else "   ") + (prefix if i == 0 else "") + line, style=style)
            )


class Console(App[int]):
    """The operator console for one plane."""

    CSS = """
    #panes { height: 1fr; }
    .pane { border: round $panel-lighten-2; width: 1fr; }
    .pane.selected { border: double $accent; }
    .question { display: none; border: round $warning; height: 3; padding: 0 1; }
    .question.up { display: block; }
    #status { height: 1; background: $panel; }
    #prompt { dock: bottom; }
    """
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("ctrl+n,ctrl+right", "move(1)", "next pane", priority=True),
        Binding("ctrl+p,ctrl+left", "move(-1)", "previous pane", priority=True),
        Binding("ctrl+q", "quit", "quit", priority=True),
    ]

    def __init__(self, plane: Plane) -> None:
        super().__init__()
        self.plane = plane
        self.panes = {a: Pane(a) for a in plane.config.ids}
        self.order = list(plane.config.ids)
        self.selected = 0
        self.webhook_at = ""
        self.drawn = asyncio.Event()
        """Set once the app is mounted: the plane starts (and recovers) only then."""
        self.status = Static("", id="status")
        self.prompt = Input(placeholder="type to the selected agent (/team, @name)", id="prompt")
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
        yield self.status
        yield self.prompt

    def on_mount(self) -> None:
        self.title = "melchior plane"
        self._select(0)
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
        asked = self.plane.questions(agent)
        pane = self.panes.get(agent)
        if pane is None:
            return
        if asked:
            pane.question.update(Text(f"write to {asked[0].recipient}? y / n"))
            pane.question.add_class("up")
        else:
            pane.question.remove_class("up")
        self._refresh_prompt()

    def _refresh_prompt(self) -> None:
        asking = bool(self.plane.questions(self.agent))
        self.prompt.disabled = asking
        if not asking:
            self.prompt.focus()
        self.prompt.placeholder = (
            f"{self.agent} asks a question above: y sends it, any other key is no"
            if asking
            else f"type to {self.agent} (/team, /team NAME, @name)"
        )

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

    def on_input_submitted(self, message: Input.Submitted) -> None:
        line = message.value
        self.prompt.value = ""
        if not line.strip():
            return
        shown = self.plane.operator_line(self.agent, line)
        if not shown.startswith("> "):
            return  # a /team line: its answer is already in the pane
        self._refresh_status()

    def on_key(self, event: events.Key) -> None:
        asked = self.plane.questions(self.agent)
        if not asked or not self.prompt.disabled:
            return
        event.stop()
        event.prevent_default()
        self.plane.answer(asked[0].id, event.character or event.key)
        self._show_question(self.agent)
        self._refresh_status()


def run_console(config: PlaneConfig) -> int:
    """Run the plane under the console until the operator quits."""

    async def main() -> int:
        plane = Plane(config)
        app = Console(plane)
        code = 0

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
