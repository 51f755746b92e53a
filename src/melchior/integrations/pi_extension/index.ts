/**
 * melchior's plane tools for pi: `send_to` and `team`.
 *
 * Installed by `melchior integrate pi` (docs/integrations.md), which writes melchior.json
 * beside this file naming the melchior executable to run. Inside a plane turn the
 * plane names three things in the environment: who this agent is, the roster it wrote
 * for this turn, and the outbox the turn's notes go to. Outside one there is nothing
 * to offer, so the extension registers no tool at all.
 *
 * Neither tool decides anything here. Each one runs `melchior tool --verb=send_to|team`
 * (one exec per call, as every other harness does), so the plane's rules — who may
 * write to whom, three notes a turn, once each — live in one place, and the plane
 * judges every note again when the turn is over. What this file adds is the part only
 * pi can do: the tools' descriptions are built from the roster, so the model sees who
 * there is and whom it may write to without having to ask first.
 */

import { spawn } from "node:child_process";
import { readFileSync } from "node:fs";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";
import type { ExtensionAPI } from "@mariozechner/pi-coding-agent";
// pi resolves this import for its extensions itself (no node_modules needed): every
// release from 0.55.1 on aliases "@sinclair/typebox"; 0.69 moved to "typebox" 1.x and
// kept the old name as an alias, so this one name works across the supported range.
import { Type } from "@sinclair/typebox";

const ENV_AGENT = "MELCHIOR_PLANE_AGENT";
const ENV_ROSTER = "MELCHIOR_PLANE_ROSTER";
const ENV_OUTBOX = "MELCHIOR_PLANE_OUTBOX";
const CALL_TIMEOUT_MS = 60_000;
const MAX_REPLY_BYTES = 1 << 20;

interface Member {
	id: string;
	description: string;
	may_write: boolean;
	door: string;
}

interface Roster {
	agent: string;
	team: Member[];
	notes_per_turn: number;
}

interface Reply {
	ok: boolean;
	result?: Array<Record<string, unknown>>;
	error?: { code?: string; reason?: string };
}

/** How to run melchior: what `melchior integrate pi` wrote beside this file, else PATH. */
function melchiorCommand(): string[] {
	try {
		const here = dirname(fileURLToPath(import.meta.url));
		const saved = JSON.parse(readFileSync(join(here, "melchior.json"), "utf8"));
		if (Array.isArray(saved.command) && saved.command.length > 0) {
			return saved.command.map(String);
		}
	} catch {
		// not integrated by melchior (loaded with -e from the package): use PATH
	}
	return ["melchior"];
}

/** The roster the plane wrote before this turn; null when it cannot be read. */
function readRoster(path: string): Roster | null {
	try {
		const raw = JSON.parse(readFileSync(path, "utf8"));
		if (!raw || !Array.isArray(raw.team)) return null;
		const team: Member[] = raw.team
			.filter((m: unknown) => m && typeof (m as Member).id === "string")
			.map((m: Member) => ({
				id: m.id,
				description: typeof m.description === "string" ? m.description : "",
				may_write: m.may_write === true,
				door: typeof m.door === "string" ? m.door : "no-door",
			}));
		const perTurn = Number.isInteger(raw.notes_per_turn) ? raw.notes_per_turn : 3;
		return { agent: String(raw.agent ?? ""), team, notes_per_turn: perTurn };
	} catch {
		return null;
	}
}

function named(m: Member): string {
	return m.description ? `${m.id} (${m.description})` : m.id;
}

function sendToDescription(roster: Roster | null): string {
	const base =
		"Leave a note for another agent on this plane. It goes when this turn ends and wakes " +
		"that agent; what it answers comes back to you later as a turn of your own, so end " +
		"this turn rather than waiting for it. Put the whole request in one note.";
	if (roster === null) {
		return `${base} The roster could not be read: call team to see who there is.`;
	}
	const open = roster.team.filter((m) => m.may_write);
	const shut = roster.team.filter((m) => !m.may_write);
	const parts = [
		base,
		`At most ${roster.notes_per_turn} notes a turn, one per agent.`,
		open.length
			? `You may write to: ${open.map(named).join("; ")}.`
			: "You may write to nobody now.",
	];
	if (shut.length) {
		parts.push(
			`No door is open to ${shut.map(named).join("; ")}: a note to one of them is held ` +
				"until your operator says yes or no.",
		);
	}
	return parts.join(" ");
}

/** Run `melchior tool ARGS` with `input` on stdin; the parsed reply or a thrown Error. */
function melchiorTool(args: string[], input: string, signal?: AbortSignal): Promise<Reply> {
	const [program, ...pre] = melchiorCommand();
	return new Promise((resolve, reject) => {
		const child = spawn(program, [...pre, "tool", ...args], {
			stdio: ["pipe", "pipe", "pipe"],
			signal,
			timeout: CALL_TIMEOUT_MS,
		});
		let out = "";
		let err = "";
		child.stdout.setEncoding("utf8");
		child.stderr.setEncoding("utf8");
		child.stdout.on("data", (chunk: string) => {
			if (out.length < MAX_REPLY_BYTES) out += chunk;
		});
		child.stderr.on("data", (chunk: string) => {
			err = (err + chunk).slice(-2000);
		});
		child.on("error", (e) => reject(new Error(`could not run ${program}: ${e.message}`)));
		child.on("close", (code) => {
			try {
				resolve(JSON.parse(out) as Reply);
			} catch {
				reject(
					new Error(
						`melchior tool exited with ${code} without a reply` +
							(err.trim() ? `: ${err.trim()}` : ""),
					),
				);
			}
		});
		child.stdin.on("error", () => {}); // it may exit before reading: its reply says why
		child.stdin.end(input);
	});
}

function refused(reply: Reply): Error {
	return new Error(reply.error?.reason ?? "melchior refused the call");
}

function text(value: string) {
	return { content: [{ type: "text" as const, text: value }] };
}

function registerTools(pi: ExtensionAPI, rosterPath: string): void {
	const roster = readRoster(rosterPath);
	const ids = roster?.team.map((m) => m.id) ?? [];

	pi.registerTool({
		name: "send_to",
		label: "Send to",
		description: sendToDescription(roster),
		promptSnippet: "Leave a note for another agent on this plane (it goes when this turn ends)",
		parameters: Type.Object({
			to: Type.String({
				description: ids.length ? `the agent's id: one of ${ids.join(", ")}` : "the agent's id",
			}),
			message: Type.String({ description: "the whole request, in one note" }),
		}),
		async execute(_id, params, signal) {
			const reply = await melchiorTool(
				["--verb=send_to", `--to=${params.to}`, "--message=-"],
				params.message,
				signal,
			);
			if (!reply.ok) throw refused(reply);
			const receipt = reply.result?.[0] ?? {};
			return { ...text(String(receipt.text ?? "Written.")), details: receipt };
		},
	});

	pi.registerTool({
		name: "team",
		label: "Team",
		description:
			"Who there is on this plane and whom you may write to now. Read only: doors are " +
			"opened by your operator, and a /team line you pass in line is refused with the " +
			"line your operator would type.",
		promptSnippet: "List the agents on this plane and whom you may write to",
		parameters: Type.Object({
			line: Type.Optional(Type.String({ description: "a /team line (refused: shows the operator's line)" })),
		}),
		async execute(_id, params, signal) {
			const args = ["--verb=team"];
			if (params.line !== undefined) args.push(`--message=${params.line}`);
			const reply = await melchiorTool(args, "", signal);
			if (!reply.ok) throw refused(reply);
			const rows = (reply.result ?? []).map((m) => {
				const may = m.may_write ? `you may write (${m.door})` : "no door: held for your operator";
				return `${m.id}${m.description ? ` — ${m.description}` : ""}: ${may}`;
			});
			return { ...text(rows.join("\n") || "You are the only agent on this plane."), details: reply.result };
		},
	});
}

export default function melchiorPlane(pi: ExtensionAPI): void {
	const rosterPath = process.env[ENV_ROSTER];
	if (!rosterPath || !process.env[ENV_OUTBOX] || !process.env[ENV_AGENT]) {
		return; // not a plane turn: the plane's verbs do not exist here
	}
	registerTools(pi, rosterPath);
	// One pi process is one plane turn, so the roster read above is this turn's; a pi that
	// lives across turns (RPC) reads it again before each, as the plane rewrites it.
	pi.on("before_agent_start", async () => {
		registerTools(pi, rosterPath);
	});
}
