"""A stand-in plane agent: does what the lines of its prompt say, as a real agent would.

Run by the ``command`` runtime (the prompt on stdin). Each line of the prompt that is a
directive is acted on, in order, through the real ``melchior tool`` (a separate exec, as
a harness would run it); everything it did is appended to ``turns.ndjson`` in its
workspace (the turn's cwd) for a test to read. Directives:

    send NAME: TEXT      melchior tool --verb=send_to --to=NAME --message=TEXT
                         (a literal \\n in TEXT is a line break in the note)
    send- NAME: TEXT     the same with --message=- (TEXT on stdin)
    team                 melchior tool --verb=team
    team-line: LINE      melchior tool --verb=team --message=LINE
    answer: TEXT         TEXT is printed as the turn's answer (default: nothing)
    outbox NAME: TEXT    write the note into the outbox directly, unchecked (as an agent
                         that skips the verb could)
    garbage              write lines that are not notes into the outbox directly
    huge                 write far more than the outbox limit into the outbox directly
    fail                 exit 1 after acting
    sleep: SECONDS       sleep (a turn that takes a while)
    print: N             N numbered lines of output (a long answer)
    after SECONDS: LINE  sleep, then act on LINE (a note that comes late in a turn)

A `` ;; `` in a line splits it into several (one line at the console's prompt can give
several directives).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

MELCHIOR = str(Path(sys.executable).with_name("melchior"))
DIRECTIVE = re.compile(r"^(send-?) ([A-Za-z][\w-]*): (.*)$")


def tool(*args: str, stdin: str | None = None) -> dict[str, object]:
    done = subprocess.run(
        [MELCHIOR, "tool", *args], input=stdin, capture_output=True, text=True, check=False
    )
    try:
        reply = json.loads(done.stdout)
    except ValueError:
        reply = {"unparsed": done.stdout, "stderr": done.stderr}
    return {"args": list(args), "rc": done.returncode, "reply": reply}


def main() -> int:
    prompt = sys.stdin.read()
    calls: list[dict[str, object]] = []
    answers: list[str] = []
    fail = False
    box = os.environ.get("MELCHIOR_PLANE_OUTBOX", "")
    lines = prompt.replace(" ;; ", "\n").splitlines()
    while lines:
        line = lines.pop(0)
        late = re.match(r"^after ([0-9.]+): (.*)$", line)
        if late:
            time.sleep(float(late.group(1)))
            lines.insert(0, late.group(2))
            continue
        m = DIRECTIVE.match(line)
        if m:
            verb, to, text = m.groups()
            text = text.replace("\\n", "\n")  # a literal backslash-n is a line break
            if verb == "send-":
                calls.append(tool("--verb=send_to", f"--to={to}", "--message=-", stdin=text))
            else:
                calls.append(tool("--verb=send_to", f"--to={to}", f"--message={text}"))
        elif line == "team":
            calls.append(tool("--verb=team"))
        elif line.startswith("team-line: "):
            calls.append(tool("--verb=team", f"--message={line[11:]}"))
        elif line.startswith("answer: "):
            answers.append(line[8:])
        elif line.startswith("outbox ") and ": " in line:
            to, _, text = line[7:].partition(": ")
            with open(box, "a", encoding="utf-8") as f:
                f.write(json.dumps({"to": to, "text": text}) + "\n")
        elif line == "garbage":
            with open(box, "a", encoding="utf-8") as f:
                f.write('not json\n{"to": 5}\n[1, 2]\n')
        elif line == "huge":
            with open(box, "a", encoding="utf-8") as f:
                f.write(json.dumps({"to": "x", "text": "y" * 1000}) + "\n")
                f.write("z" * (2 * 1024 * 1024))
        elif line.startswith("print: "):
            count = int(line[7:])
            answers.append("\n".join(f"output line {i} " + "." * 24 for i in range(1, count + 1)))
        elif line == "fail":
            fail = True
        elif line.startswith("sleep: "):
            time.sleep(float(line[7:]))
    env = {k: v for k, v in os.environ.items() if k.startswith(("MELCHIOR_PLANE_", "MAGI_"))}
    roster = json.loads(Path(env["MELCHIOR_PLANE_ROSTER"]).read_text(encoding="utf-8"))
    record = {
        "prompt": prompt,
        "env": env,
        "roster": roster,
        "calls": calls,
        "schema": tool("--schema")["reply"],
    }
    with open("turns.ndjson", "a", encoding="utf-8") as f:
        f.write(json.dumps(record) + "\n")
    if answers:
        print("\n".join(answers))
    return 1 if fail else 0


if __name__ == "__main__":
    sys.exit(main())
