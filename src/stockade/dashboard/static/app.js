// stockade's dashboard. No framework, no build: one file, standard DOM only.
// Every value that comes from an event is written with textContent (el()
// below turns strings into text nodes): an event holding HTML or a script is
// shown as the text it is, never parsed. The server's CSP forbids inline
// scripts and styles anyway.
"use strict";

const S = { session: null, cleanup: [], approvals: 0 };

// ------------------------------------------------------------------ helpers

function el(tag, attrs, ...children) {
  const node = tag === "svg" || attrs?.svg ? document.createElementNS("http://www.w3.org/2000/svg", tag) : document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (k === "svg" || v === null || v === undefined || v === false) continue;
    if (k === "onclick") node.addEventListener("click", v);
    else if (k === "oninput") node.addEventListener("input", v);
    else if (k === "text") node.textContent = String(v);
    else node.setAttribute(k, String(v));
  }
  for (const c of children.flat()) {
    if (c === null || c === undefined || c === false) continue;
    node.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return node;
}
function svg(tag, attrs, ...children) { return el(tag, { ...attrs, svg: true }, ...children); }

async function api(path, opts) {
  const response = await fetch(path, { credentials: "same-origin", ...(opts || {}) });
  const type = response.headers.get("content-type") || "";
  const body = type.includes("json") ? await response.json() : { error: await response.text() };
  if (!response.ok) throw new Error(body.error || `${response.status}`);
  return body;
}

function when(t) {
  if (!t) return "";
  const d = new Date(t * 1000);
  return d.toISOString().replace("T", " ").replace(/\.\d+Z$/, "Z").slice(0, 20);
}
function clock(t) { return t ? new Date(t * 1000).toISOString().slice(11, 23) : ""; }
function seconds(s) { return s === null || s === undefined ? "" : s < 1 ? `${(s * 1000).toFixed(0)} ms` : `${s.toFixed(1)} s`; }
function view() { return document.getElementById("view"); }
function show(...nodes) { const v = view(); v.replaceChildren(...nodes); }
function onLeave(fn) { S.cleanup.push(fn); }
function every(ms, fn) { fn(); const id = setInterval(fn, ms); onLeave(() => clearInterval(id)); }
function json(value) { return JSON.stringify(value, null, 1); }

const KERNEL = new Set(["landlock", "seccomp", "mount", "dac"]);
const AGENT_KINDS = new Set(["tool.call", "llm.call", "agent.message"]);
const PAIRED_BY_TIME = new Set(["cell.denied", "cell.audited", "http.request"]);
// A tool.call is recorded when its call ends, so its span (its time minus its
// duration) is late by the time the record took to reach the daemon (tens of
// ms on a busy host), and a kernel record's stamp is the kernel's coarse
// clock, up to a tick early. So a kernel refusal or a gateway request goes to
// the first call of its cell that ended at or after it, if that call started
// no more than SLACK before it: the call under way, or the next one (a record
// between two calls is the next call's: the agent makes one call at a time).
const SLACK = 0.25;
const ROWS_MAX = 4000;

function stateBadge(state) { return el("span", { class: `badge state-${state}` }, state); }
function refused(e) { return e.outcome === "denied"; }

// ------------------------------------------------------------------ runs

function runsView() {
  const search = el("input", { type: "search", placeholder: "filter: id, name, state, layer…", id: "run-filter" });
  const tbody = el("tbody", { id: "runs-body" });
  const empty = el("p", { class: "muted", id: "runs-empty" });
  let runs = [];
  const render = () => {
    const q = search.value.trim().toLowerCase();
    const byId = new Map(runs.map((r) => [r.id, r]));
    const kids = new Map();
    for (const r of runs) {
      const p = r.parent && byId.has(r.parent) ? r.parent : "";
      if (!kids.has(p)) kids.set(p, []);
      kids.get(p).push(r);
    }
    const ordered = [];
    const walk = (parent, depth) => { for (const r of kids.get(parent) || []) { ordered.push([r, depth]); walk(r.id, depth + 1); } };
    walk("", 0);
    const rows = [];
    for (const [r, depth] of ordered) {
      const text = [r.id, r.name, r.state, ...Object.keys(r.by_layer), ...Object.keys(r.by_category)].join(" ").toLowerCase();
      if (q && !text.includes(q)) continue;
      const layers = Object.entries(r.by_layer).map(([l, n]) => el("span", { class: `chip layer-${KERNEL.has(l) ? "kernel" : l}` }, `${l} ${n}`));
      const trip = r.denial_limit ? `${r.tripwire}/${r.denial_limit}` : String(r.tripwire);
      rows.push(el("tr", { "data-run": r.id, class: r.halted ? "halted" : "" },
        el("td", {}, el("span", { class: "tree" }, depth ? "  ".repeat(depth - 1) + "└ " : ""), el("a", { href: `#/run/${r.id}` }, r.id)),
        el("td", {}, r.name),
        el("td", {}, stateBadge(r.state)),
        el("td", {}, when(r.started)),
        el("td", { class: "num" }, String(r.refusals)),
        el("td", {}, layers),
        el("td", { class: "num", title: r.tripwire_exact ? "the tripwire's own count" : "refusals seen so far" }, trip),
        el("td", { class: "num" }, String(r.tool_calls)),
        el("td", {}, r.ended ? el("a", { href: `#/debrief/${r.id}` }, "debrief") : ""),
      ));
    }
    tbody.replaceChildren(...rows);
    empty.textContent = runs.length ? (rows.length ? "" : "No run matches the filter.") : "No runs in this record yet.";
  };
  search.addEventListener("input", render);
  show(
    el("h1", {}, "Runs"),
    el("div", { class: "toolbar" }, search),
    el("table", { class: "runs" },
      el("thead", {}, el("tr", {}, ...["run", "name", "state", "started", "refusals", "by layer", "tripwire", "tool calls", ""].map((h) => el("th", {}, h)))),
      tbody),
    empty,
  );
  every(1500, async () => {
    try { const r = await api("api/runs"); runs = r.runs; setApprovals(r.approvals); render(); } catch (e) { empty.textContent = `Could not read the runs: ${e.message}`; }
  });
}

// ------------------------------------------------------------------ a run, live

class Pairing {
  // Ties each tool call to what it caused: by the tool_call id an intent
  // carries, else by the cell and the call's span for kernel refusals and
  // gateway requests, which carry neither.
  constructor(onPair) { this.calls = new Map(); this.byCell = new Map(); this.waitingId = new Map(); this.waitingTime = []; this.onPair = onPair; }
  call(e, seq) {
    const d = e.detail || {};
    const c = { id: d.tool_call, name: d.name, cell: e.cell, end: e.time, start: e.time - (d.duration || 0), seq };
    if (!c.id) return;
    this.calls.set(c.id, c);
    if (!this.byCell.has(c.cell)) this.byCell.set(c.cell, []);
    const list = this.byCell.get(c.cell);
    list.push(c);
    list.sort((a, b) => a.end - b.end);
    const at = list.indexOf(c), before = at > 0 ? list[at - 1].end : -Infinity;
    for (const w of this.waitingId.get(c.id) || []) this.onPair(c, w, "id");
    this.waitingId.delete(c.id);
    this.waitingTime = this.waitingTime.filter((w) => {
      if (w.cell === c.cell && w.time > before && w.time <= c.end && w.time >= c.start - SLACK) { this.onPair(c, w, "cell+time"); return false; }
      return true;
    });
  }
  effect(e, seq) {
    const d = e.detail || {};
    const w = { seq, cell: e.cell, time: e.time, event: e };
    if (d.tool_call) {
      const c = this.calls.get(d.tool_call);
      if (c) this.onPair(c, w, "id");
      else { if (!this.waitingId.has(d.tool_call)) this.waitingId.set(d.tool_call, []); this.waitingId.get(d.tool_call).push(w); }
      return;
    }
    if (!PAIRED_BY_TIME.has(e.kind)) return;
    const c = (this.byCell.get(e.cell) || []).find((c) => c.end >= e.time);
    if (!c) this.waitingTime.push(w); // its call has not ended yet
    else if (e.time >= c.start - SLACK) this.onPair(c, w, "cell+time");
  }
}

function runView(runId) {
  const agent = el("div", { class: "pane-body", id: "agent-pane" });
  const enforcement = el("div", { class: "pane-body", id: "enforcement-pane" });
  const status = el("span", { id: "stream-status", class: "muted" }, "connecting…");
  const head = el("div", { class: "run-head" });
  const counts = el("span", { id: "run-counts", class: "muted" });
  const transcript = el("pre", { id: "transcript", class: "transcript" });
  const persistence = el("section", { id: "persistence" });
  const rows = new Map(); // seq -> row
  const callRows = new Map(); // tool_call id -> row
  let last = 0, shown = { agent: 0, enforcement: 0 }, hidden = { agent: 0, enforcement: 0 }, refusals = 0;
  let queue = [], scheduled = false, ended = false;

  const pairing = new Pairing((call, w, how) => {
    const callRow = callRows.get(call.id), effRow = rows.get(w.seq);
    if (effRow) {
      effRow.dataset.pairedWith = call.id; effRow.dataset.pair = how;
      effRow.querySelector(".pair").replaceChildren(el("span", { class: `link by-${how === "id" ? "id" : "time"}` }, `⟵ ${call.name} ${call.id} (by ${how})`));
    }
    if (callRow) {
      const e = w.event;
      callRow.querySelector(".effects").append(el("span", {
        class: `chip effect ${refused(e) ? "denied" : "ok"} by-${how === "id" ? "id" : "time"}`, "data-effect-seq": w.seq, "data-layer": e.layer, "data-pair": how,
      }, `${e.layer}: ${e.outcome} (${how})`));
      if (refused(e)) { callRow.classList.add("caused-refusal"); flash(callRow); }
    }
  });

  function flash(row) { row.classList.remove("fresh"); void row.offsetWidth; row.classList.add("fresh"); }

  function rowFor(stored) {
    const e = stored.event, d = e.detail || {};
    const side = AGENT_KINDS.has(e.kind) ? "agent" : "enforcement";
    const row = el("div", {
      class: `row kind-${e.kind.replace(/\./g, "-")} ${refused(e) ? "refused" : ""} ${e.outcome === "audited" ? "audited" : ""}`,
      "data-seq": stored.seq, "data-kind": e.kind, "data-layer": e.layer, "data-outcome": e.outcome, "data-cell": e.cell,
      "data-tool-call": e.kind === "tool.call" ? d.tool_call || "" : null,
    },
      el("span", { class: "t" }, clock(e.time)),
      el("span", { class: `layer layer-${KERNEL.has(e.layer) ? "kernel" : e.layer}` }, e.layer),
      el("span", { class: "k" }, e.kind),
      el("details", {}, el("summary", {}, e.summary || e.kind), el("pre", {}, json(d))),
      el("div", { class: side === "agent" ? "effects" : "pair" }),
    );
    return [side, row];
  }

  function append(batch) {
    const fresh = { agent: document.createDocumentFragment(), enforcement: document.createDocumentFragment() };
    const pend = [];
    for (const stored of batch) {
      if (stored.seq <= last) continue; // never twice, whatever the stream repeats
      last = stored.seq;
      const e = stored.event;
      if (e.kind === "run.start" || e.kind === "cell.start" || e.kind === "cell.end" || e.kind === "run.end" || e.kind === "cell.persistence") head.dataset.last = e.kind;
      if (e.kind === "cell.persistence") renderPersistence(persistence, e);
      if (e.kind === "run.end") { ended = true; loadTranscript(); }
      const [side, row] = rowFor(stored);
      rows.set(stored.seq, row);
      if (e.kind === "tool.call" && e.detail?.tool_call) callRows.set(e.detail.tool_call, row);
      if (refused(e)) { refusals += 1; row.classList.add("fresh"); }
      fresh[side].append(row);
      shown[side] += 1;
      pend.push(stored);
    }
    agent.append(fresh.agent); enforcement.append(fresh.enforcement);
    // Pair after the rows exist, so a pair found now is drawn on both.
    for (const stored of pend) {
      if (stored.event.kind === "tool.call") pairing.call(stored.event, stored.seq);
      else if (!AGENT_KINDS.has(stored.event.kind)) pairing.effect(stored.event, stored.seq);
    }
    for (const [side, pane] of [["agent", agent], ["enforcement", enforcement]]) {
      while (shown[side] > ROWS_MAX) { pane.firstElementChild.remove(); shown[side] -= 1; hidden[side] += 1; }
      const note = document.getElementById(`${side}-hidden`);
      note.textContent = hidden[side] ? `${hidden[side]} earlier rows are not drawn here (the page keeps the last ${ROWS_MAX}); the downloads hold every event.` : "";
    }
    counts.textContent = `${rows.size} events, ${refusals} refusals, last seq ${last}` + (ended ? " · the run ended" : "");
    for (const pane of [agent, enforcement]) if (pane.dataset.follow !== "no") pane.scrollTop = pane.scrollHeight;
  }

  // Events come in bursts (thousands in a second): drawn once a frame, in one
  // fragment per pane, so the page never stalls on them.
  function enqueue(stored) {
    queue.push(stored);
    if (!scheduled) { scheduled = true; requestAnimationFrame(() => { scheduled = false; const b = queue; queue = []; append(b); }); }
  }

  async function loadTranscript() {
    try {
      const t = await api(`api/runs/${encodeURIComponent(runId)}/transcript`);
      transcript.textContent = (t.truncated ? `[the first ${t.bytes - new TextEncoder().encode(t.text).length} bytes are not shown: see \`stockade logs\`]\n` : "") + t.text;
    } catch (e) { transcript.textContent = `Could not read the transcript: ${e.message}`; }
  }

  const es = new EventSource(`api/stream?run=${encodeURIComponent(runId)}&after=0`);
  es.onmessage = (m) => { enqueue(JSON.parse(m.data)); };
  es.onopen = () => { status.textContent = S.session.mode === "replay" ? "replay: the recorded events" : "live"; status.className = "live"; };
  es.onerror = () => {
    // The browser retries by itself, sending the last seq it got; a refusal
    // (401: the daemon restarted, and its tokens with it) ends the stream.
    const closed = es.readyState === EventSource.CLOSED;
    status.textContent = closed ? "the stream ended: the daemon may have restarted; get a new URL with `stockade dashboard`" : "reconnecting… (resumes after the last event shown)";
    status.className = closed ? "error" : "muted";
  };
  onLeave(() => es.close());
  every(3000, () => { if (!ended) loadTranscript(); });
  for (const pane of [agent, enforcement]) pane.addEventListener("scroll", () => { pane.dataset.follow = pane.scrollTop + pane.clientHeight >= pane.scrollHeight - 30 ? "yes" : "no"; });

  head.append(
    el("h1", {}, "Run ", el("span", { class: "mono", id: "run-id" }, runId)),
    el("div", { class: "toolbar" }, status, " · ", counts, " · ", el("a", { href: `#/debrief/${runId}` }, "debrief"), " · ",
      ...["json", "jsonl", "text", "bundle"].map((f) => [el("a", { href: `api/runs/${encodeURIComponent(runId)}/download?format=${f}`, download: "" }, f), " "]),
    ),
    el("p", { class: "how", id: "pairing-how" },
      "How a pair is made: an intent carries the id of the tool call that made it (paired by id). A kernel refusal or a gateway request carries only its cell and its time: it is paired with the tool call of the same cell that was under way then, or else the next one, if it started within ",
      `${SLACK * 1000} ms (paired by cell+time; a call's record comes when it ends, a little late, and the kernel's clock is coarse). Refusals are highlighted as they land.`),
  );
  show(
    head,
    el("div", { class: "panes" },
      el("section", { class: "pane" }, el("h2", {}, "Agent: LLM calls, tool calls"), el("p", { class: "muted small", id: "agent-hidden" }), agent),
      el("section", { class: "pane" }, el("h2", {}, "Enforcement: broker, gateway, kernel"), el("p", { class: "muted small", id: "enforcement-hidden" }), enforcement),
    ),
    persistence,
    el("details", { open: "" }, el("summary", {}, "Transcript (the agent's stdout and stderr)"), transcript),
  );
  loadTranscript();
}

function renderPersistence(section, e) {
  const d = e.detail || {};
  const changes = d.changes || [];
  section.replaceChildren(
    el("h2", {}, "Persistence report"),
    changes.length
      ? el("table", { class: "persistence" },
          el("thead", {}, el("tr", {}, ...["path", "kind", "change", "runs", "note"].map((h) => el("th", {}, h)))),
          el("tbody", {}, ...changes.map((c) => el("tr", {}, el("td", { class: "mono" }, c.path), el("td", {}, c.kind), el("td", {}, c.change), el("td", { class: "mono" }, (c.runs || []).join(", ")), el("td", {}, c.note || "")))))
      : el("p", { class: "muted" }, "Nothing left for the operator's tools."),
    d.revert ? el("p", {}, "Undo it with ", el("code", {}, d.revert)) : "",
    d.error ? el("p", { class: "error" }, d.error) : "",
  );
}

// ------------------------------------------------------------------ approvals

function approvalsView() {
  const list = el("div", { id: "approvals" });
  const empty = el("p", { class: "muted", id: "approvals-empty" });
  const cards = new Map();
  const replay = S.session.mode === "replay";
  show(el("h1", {}, "Approvals"), el("p", { class: "how" }, "Every intent waiting for a human, with all of its arguments, whole. The agent gets the answer at once; the decision is an approval.decided event naming you."), empty, list);
  every(1000, async () => {
    let pending;
    try { pending = (await api("api/approvals")).approvals; } catch (e) { empty.textContent = `Could not read the approvals: ${e.message}`; return; }
    setApprovals(pending.length);
    const ids = new Set(pending.map((a) => a.id));
    for (const [id, card] of cards) if (!ids.has(id) && !card.dataset.decided) { card.remove(); cards.delete(id); }
    for (const a of pending) if (!cards.has(a.id)) { const c = approvalCard(a); cards.set(a.id, c); list.append(c); }
    empty.textContent = replay ? "This is a replay: nothing in it can be decided." : pending.length ? "" : "Nothing is waiting for you.";
  });
}

function argValue(value) {
  const text = typeof value === "string" ? value : json(value);
  return el("div", { class: "arg" }, el("span", { class: "muted small" }, `${typeof value === "string" ? "text" : "JSON"}, ${text.length} characters, shown whole`), el("pre", { class: "arg-value" }, text));
}

function approvalCard(a) {
  const reason = el("textarea", { rows: 2, placeholder: "reason (the agent is told it; an ask's answer)", class: "reason" });
  const result = el("p", { class: "result" });
  const decide = async (decision) => {
    result.textContent = "sending…";
    try {
      const r = await api(`api/approvals/${encodeURIComponent(a.id)}`, {
        method: "POST", headers: { "Content-Type": "application/json", "X-Stockade-CSRF": S.session.csrf },
        body: JSON.stringify({ decision, reason: reason.value }),
      });
      card.dataset.decided = r.approval.state;
      card.classList.add("decided");
      result.textContent = `${r.approval.state} by ${r.approval.by}`;
      for (const b of card.querySelectorAll("button")) b.disabled = true;
    } catch (e) { result.textContent = `Not decided: ${e.message}`; }
  };
  const card = el("article", { class: "approval", "data-approval": a.id },
    el("h2", {}, el("span", { class: "mono" }, a.id), " · ", a.intent, " · run ", el("a", { href: `#/run/${a.run}` }, a.run)),
    el("p", { class: "muted" }, `asked ${when(a.asked_at)}, denied by timeout at ${when(a.deadline)} if nobody answers`),
    el("dl", {}, ...Object.entries(a.args || {}).flatMap(([k, v]) => [el("dt", {}, k), el("dd", {}, argValue(v))])),
    reason,
    el("div", { class: "buttons" },
      el("button", { class: "approve", onclick: () => decide("approve") }, "Approve"),
      el("button", { class: "deny", onclick: () => decide("deny") }, "Deny")),
    result,
  );
  return card;
}

function setApprovals(n) {
  S.approvals = n;
  const c = document.getElementById("approval-count");
  c.textContent = String(n);
  c.classList.toggle("waiting", n > 0);
}

// ------------------------------------------------------------------ debrief

function barChart(title, series, buckets, start, width, id) {
  const W = 640, H = 160, pad = 28, names = Object.keys(series);
  const totals = Array.from({ length: buckets }, (_, i) => names.reduce((s, n) => s + series[n][i], 0));
  const max = Math.max(1, ...totals);
  const bw = (W - pad) / buckets;
  const chart = svg("svg", { viewBox: `0 0 ${W} ${H + 40}`, class: "chart", id, role: "img" });
  chart.append(svg("title", {}, title));
  names.forEach((n, k) => {
    for (let i = 0; i < buckets; i++) {
      const below = names.slice(0, k).reduce((s, m) => s + series[m][i], 0);
      const v = series[n][i];
      if (!v) continue;
      const h = (v / max) * H, y = H - (below / max) * H - h;
      chart.append(svg("rect", { x: pad + i * bw, y, width: Math.max(1, bw - 1), height: h, class: `bar c${k % 8}` }, svg("title", {}, `${n}: ${v}`)));
    }
  });
  chart.append(svg("text", { x: 0, y: 10, class: "axis" }, String(max)), svg("text", { x: 0, y: H, class: "axis" }, "0"));
  chart.append(svg("text", { x: pad, y: H + 14, class: "axis" }, clock(start)), svg("text", { x: W - 90, y: H + 14, class: "axis" }, clock(start + width * buckets)));
  names.forEach((n, k) => chart.append(svg("rect", { x: pad + k * 110, y: H + 24, width: 10, height: 10, class: `bar c${k % 8}` }), svg("text", { x: pad + k * 110 + 14, y: H + 33, class: "axis" }, n)));
  return el("figure", {}, el("figcaption", {}, title), chart);
}

function table(id, entries) {
  return el("table", { class: "counts", id }, el("tbody", {}, ...entries.map(([k, v]) => el("tr", { "data-key": k }, el("td", {}, k), el("td", { class: "num" }, String(v))))));
}

async function debriefView(runId) {
  show(el("p", { class: "muted" }, "Reading the record…"));
  let d;
  try { d = await api(`api/runs/${encodeURIComponent(runId)}/debrief`); } catch (e) { show(el("p", { class: "error" }, `No debrief: ${e.message}`)); return; }
  const r = d.run || {}, v = d.verified || {}, tl = d.timeline;
  show(
    el("h1", {}, "Debrief of ", el("a", { class: "mono", href: `#/run/${runId}` }, runId), " ", r.name ? `(${r.name})` : ""),
    el("div", { class: "scores" },
      el("div", { class: `grade grade-${d.grade}`, id: "grade" }, d.grade),
      el("div", {},
        el("p", {}, el("strong", {}, "Containment grade"), `: ${d.blocked} of ${d.attempted} unauthorized reaches blocked. `, el("span", { class: "muted" }, d.grade_rule)),
        el("p", {}, el("strong", {}, "Escalation score"), ": ", el("span", { id: "escalation" }, String(d.escalation_score)), el("span", { class: "muted" }, " (how many unauthorized reaches the agent made: each refusal, and each reach an audit-mode policy let through, counted as stockade bench counts a trial's)")),
        el("p", {}, `State ${r.state}`, r.halted ? `, halted: ${r.halted}` : "", `, exit code ${r.exit_code ?? "none"}, tripwire ${r.tripwire}${r.denial_limit ? "/" + r.denial_limit : ""}, ${r.tool_calls} tool calls, ${r.intents} intents, ${r.requests} gateway requests.`),
      ),
    ),
    el("section", { class: "record" }, el("h2", {}, "The record"),
      el("p", { id: "verified", class: v.ok ? "ok" : "error" }, v.ok ? `Verified: ${v.checked} events intact and in order.` : `NOT verified: ${v.reason}`),
      el("p", {}, "Chain head: ", el("code", { id: "chain-head" }, v.head || "none"), " · this run's events: ", el("span", { id: "record-events" }, String(d.record.events)), ` (seq ${d.record.first_seq} to ${d.record.last_seq}), its head `, el("code", { id: "run-head" }, d.record.head)),
      el("p", { class: "muted small" }, `Checked: ${v.scope || ""}`, v.expected?.length ? `; expected heads ${v.expected.join(", ")}` : ""),
      el("p", {}, "Download: ", ...["json", "jsonl", "text", "bundle"].map((f) => [el("a", { href: `api/runs/${encodeURIComponent(runId)}/download?format=${f}`, download: "" }, f), " "])),
    ),
    el("div", { class: "twocol" },
      el("section", {}, el("h2", {}, "Refusals by layer"), table("by-layer", Object.entries(d.by_layer))),
      el("section", {}, el("h2", {}, "By category"), table("by-category", Object.entries(d.by_category))),
    ),
    d.attempted ? barChart("Refusals by layer over time", tl.layers, tl.buckets, tl.start, tl.bucket, "plot-layers") : "",
    d.attempted ? barChart("Refusals by category over time", tl.categories, tl.buckets, tl.start, tl.bucket, "plot-categories") : "",
    (() => { const s = el("section", { id: "persistence" }); renderPersistence(s, { detail: { changes: d.persistence, revert: d.revert } }); return s; })(),
    el("section", {}, el("h2", {}, `The containment report: every reach (${d.reaches.length})`),
      el("table", { id: "reaches" },
        el("thead", {}, el("tr", {}, ...["seq", "category", "layer", "kind", "blocked", "what"].map((h) => el("th", {}, h)))),
        el("tbody", {}, ...d.reaches.map((r) => el("tr", { "data-seq": r.seq, class: r.blocked ? "" : "audited" },
          el("td", { class: "num" }, String(r.seq ?? "")), el("td", {}, r.category), el("td", {}, r.layer), el("td", { class: "mono" }, r.kind),
          el("td", {}, r.blocked ? "blocked" : "LET THROUGH (audit)"), el("td", {}, r.summary)))))),
  );
}

// ------------------------------------------------------------------ bench

async function benchView() {
  show(el("h1", {}, "Bench"), el("p", { class: "muted", id: "bench-note" }, "Reading…"));
  let b;
  try { b = await api("api/bench"); } catch (e) { document.getElementById("bench-note").textContent = e.message; return; }
  const fmt = (v) => (v === null || v === undefined ? "–" : typeof v === "number" && !Number.isInteger(v) ? v.toFixed(2) : String(v));
  const sections = b.campaigns.map((c) => {
    if (c.error) return el("section", { class: "campaign" }, el("h2", { class: "mono" }, c.dir), el("p", { class: "error" }, c.error));
    const s = c.summary || {};
    return el("section", { class: "campaign", "data-campaign": c.index },
      el("h2", { class: "mono" }, c.dir),
      el("p", {}, `agent ${c.agent ?? "–"}, model ${c.model ?? "–"}, stockade ${c.stockade_version ?? "–"}`),
      el("p", { class: "campaign-summary" },
        `${s.trials ?? 0} trials (${s.valid ?? 0} valid, ${s.invalid ?? 0} invalid, ${s.halted ?? 0} halted) · pass rate ${fmt(s.pass_rate)} · mean reward ${fmt(s.mean_reward)} · containment grade `,
        el("strong", {}, fmt(s.containment_grade)), ` · escalation score ${fmt(s.escalation_score)}`),
      el("table", { class: "trials" },
        el("thead", {}, el("tr", {}, ...["task", "attempt", "status", "outcome", "reward", "reaches", "blocked", "grade", "as expected", "bundle"].map((h) => el("th", {}, h)))),
        el("tbody", {}, ...c.trials.map((t) => el("tr", { "data-task": t.task },
          el("td", {}, t.task), el("td", { class: "num" }, fmt(t.attempt)), el("td", {}, stateBadge(t.status)), el("td", {}, fmt(t.outcome)),
          el("td", { class: "num" }, fmt(t.reward)), el("td", { class: "num" }, fmt(t.attempted)), el("td", { class: "num" }, fmt(t.blocked)),
          el("td", {}, fmt(t.grade)), el("td", {}, t.expected_met === true ? "yes" : t.expected_met === false ? "NO" : "–"),
          el("td", {}, t.bundle ? el("a", { href: `#/trial/${c.index}/${encodeURIComponent(t.bundle)}` }, t.bundle) : "–"))))),
    );
  });
  document.getElementById("bench-note").textContent = b.note || `${b.campaigns.length} campaign(s)`;
  view().append(...sections);
}

async function trialView(index, name) {
  show(el("p", { class: "muted" }, "Checking the bundle…"));
  let t;
  try { t = await api(`api/bench/${index}/${encodeURIComponent(name)}`); } catch (e) { show(el("p", { class: "error" }, e.message)); return; }
  const score = t.score || {}, cats = (t.containment || {}).by_category || (t.containment || {}).categories || {};
  const base = `api/bench/${index}/${encodeURIComponent(name)}/files/`;
  show(
    el("h1", {}, "Trial ", el("span", { class: "mono" }, t.bundle)),
    el("p", { id: "bundle-check", class: t.problems.length ? "error" : "ok" },
      t.problems.length ? `The bundle does NOT verify: ${t.problems.join("; ")}` : "The bundle verifies: every file matches its manifest, the seal holds, every event of log.json is chained."),
    el("p", {}, `status ${score.status ?? "–"}, outcome ${score.outcome ?? "–"}, reward ${score.reward ?? "–"}, grade ${score.grade ?? "–"} (${score.blocked ?? 0} of ${score.attempted ?? 0} reaches blocked)`),
    el("p", {}, "Runs: ", ...Object.entries(t.runs || {}).map(([k, r]) => [el("a", { href: `#/run/${r}` }, `${k} ${r}`), " "])),
    el("h2", {}, "Containment by category"),
    table("trial-categories", Object.entries(cats).map(([k, v]) => [k, typeof v === "object" && v ? `${v.blocked ?? 0}/${v.attempted ?? 0}` : v])),
    el("h2", {}, "Files"),
    el("ul", { id: "bundle-files" }, ...t.files.map((f) => el("li", {}, el("a", { href: base + f.split("/").map(encodeURIComponent).join("/"), download: "" }, f)))),
  );
}

// ------------------------------------------------------------------ routing

async function refreshApprovals() {
  try { setApprovals((await api("api/approvals")).approvals.length); } catch (_) { /* shown on the next try */ }
}

function route() {
  for (const fn of S.cleanup.splice(0)) fn();
  if (S.session.mode === "live") refreshApprovals();
  const [, page, arg] = (location.hash || "#/runs").split("/");
  for (const a of document.querySelectorAll("nav a")) a.classList.toggle("active", a.dataset.nav === (page === "run" || page === "debrief" ? "runs" : page === "trial" ? "bench" : page));
  if (page === "run" && arg) runView(decodeURIComponent(arg));
  else if (page === "debrief" && arg) debriefView(decodeURIComponent(arg));
  else if (page === "approvals") approvalsView();
  else if (page === "bench") benchView();
  else if (page === "trial" && arg) trialView(Number(arg), decodeURIComponent(location.hash.split("/")[3] || ""));
  else runsView();
}

async function start() {
  try { S.session = await api("api/session"); } catch (e) { show(el("p", { class: "error" }, `No session: ${e.message}`)); return; }
  document.getElementById("source").textContent = `${S.session.label} · ${S.session.operator}`;
  if (S.session.mode === "replay") {
    const b = document.getElementById("replay-banner");
    b.textContent = `REPLAY — a recorded run, not live: ${S.session.label}. Nothing here is happening now, and nothing can be decided.`;
    b.hidden = false;
    document.body.classList.add("replay");
  }
  window.addEventListener("hashchange", route);
  route();
  if (S.session.mode === "live") setInterval(refreshApprovals, 2000);
}

document.addEventListener("DOMContentLoaded", start);
