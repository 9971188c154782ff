// The privacy-budget dashboard: plain DOM and SVG over the guardian's admin REST API, nothing else.
// The token comes from the URL fragment (#token=..., never sent to the server in the URL) or the form, is
// kept in sessionStorage for this tab only, and goes with every request as a bearer token.
"use strict";

const TOKEN_KEY = "capc-admin-token";
const params = new URLSearchParams(location.search);
const REFRESH_MS = Math.max(0.5, Number(params.get("refresh") || 2)) * 1000;
const SVG = "http://www.w3.org/2000/svg";

let token = null;
let refreshes = 0;
let timer = null;
let verifiedHead = null; // the ledger head the shown verification is about

class AuthError extends Error {}

function takeToken() {
  const match = location.hash.match(/token=([^&]+)/);
  if (match) {
    sessionStorage.setItem(TOKEN_KEY, decodeURIComponent(match[1]));
    history.replaceState(null, "", location.pathname + location.search);
  }
  return sessionStorage.getItem(TOKEN_KEY);
}

async function api(path) {
  const response = await fetch("/api/v1/" + path, {
    headers: { Authorization: "Bearer " + token },
    cache: "no-store",
  });
  if (response.status === 401) throw new AuthError("the guardian refused the token (HTTP 401)");
  if (!response.ok) throw new Error(`/api/v1/${path}: HTTP ${response.status}`);
  return response.json();
}

function fmt(value) {
  if (value === undefined || value === null) return "—";
  if (typeof value === "boolean") return value ? "yes" : "no";
  if (typeof value !== "number") return String(value);
  if (Number.isInteger(value)) return String(value);
  if (Math.abs(value) !== 0 && (Math.abs(value) < 1e-3 || Math.abs(value) >= 1e6)) return value.toExponential(2);
  return value.toFixed(3);
}

function setField(name, value, text) {
  for (const el of document.querySelectorAll(`[data-field="${name}"]`)) {
    el.textContent = text === undefined ? fmt(value) : text;
    if (value !== undefined && value !== null) el.dataset.value = JSON.stringify(value);
    else delete el.dataset.value;
  }
}

function el(tag, attrs = {}, text = "") {
  const node = document.createElementNS(SVG, tag);
  for (const [key, value] of Object.entries(attrs)) node.setAttribute(key, value);
  if (text) node.textContent = text;
  return node;
}

const BOX = { left: 52, right: 12, top: 12, bottom: 40, width: 640, height: 260 };

function axes(svg, ymax, xlabel, ylabel) {
  const { left, right, top, bottom, width, height } = BOX;
  svg.append(el("line", { class: "axis", x1: left, y1: height - bottom, x2: width - right, y2: height - bottom }));
  svg.append(el("line", { class: "axis", x1: left, y1: top, x2: left, y2: height - bottom }));
  for (let i = 0; i <= 4; i++) {
    const v = (ymax * i) / 4;
    const y = height - bottom - ((height - top - bottom) * i) / 4;
    svg.append(el("text", { x: left - 6, y: y + 4, "text-anchor": "end" }, String(Number(v.toPrecision(3)))));
  }
  const middle = (top + height - bottom) / 2;
  svg.append(el("text", { class: "axis-label", x: 12, y: middle, "text-anchor": "middle",
    transform: `rotate(-90 12 ${middle})` }, ylabel));
  svg.append(el("text", { class: "axis-label x-label", x: (left + width - right) / 2, y: height - 4,
    "text-anchor": "middle" }, xlabel));
}

// Tick steps in seconds: a run whose entries are seconds apart gets second ticks, a long one hours or days.
const TIME_STEPS = [0.1, 0.2, 0.5, 1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 10800, 21600,
  43200, 86400, 172800, 604800];
const pad2 = (n) => String(n).padStart(2, "0");

function clock(seconds, step) {
  const tenths = Math.round(seconds * 10); // k × 0.1 s is not exact in floating point
  const d = new Date(Math.floor(tenths / 10) * 1000);
  const hm = `${pad2(d.getHours())}:${pad2(d.getMinutes())}`;
  if (step >= 86400) return `${d.getFullYear()}-${pad2(d.getMonth() + 1)}-${pad2(d.getDate())}`;
  if (step >= 60) return hm;
  const s = `${hm}:${pad2(d.getSeconds())}`;
  return step < 1 ? `${s}.${tenths % 10}` : s;
}

function drawEpsilon(svg, points, limit) {
  svg.replaceChildren();
  const { left, right, top, bottom, width, height } = BOX;
  const ymax = Math.max(limit || 0, ...points.map((p) => p.epsilon_spent || 0)) * 1.1 || 1;
  if (!points.length) {
    axes(svg, ymax, "time: no ledger entry yet", "ε");
    return;
  }
  // x is the entry's time; a span under a second is widened so that a lone entry still has an axis
  const t0 = points[0].time;
  const t1 = Math.max(points[points.length - 1].time, t0 + 1);
  const first = new Date(t0 * 1000);
  const day = `${first.getFullYear()}-${pad2(first.getMonth() + 1)}-${pad2(first.getDate())}`;
  axes(svg, ymax, `time (local, from ${day} ${clock(t0, 1)})`, "ε");
  const x = (t) => left + ((width - left - right) * (t - t0)) / (t1 - t0);
  const y = (v) => height - bottom - ((height - top - bottom) * v) / ymax;
  Object.assign(svg.dataset, { t0: String(t0), t1: String(t1), x0: String(left), x1: String(width - right) });
  const step = TIME_STEPS.find((s) => (t1 - t0) / s <= 6) || TIME_STEPS[TIME_STEPS.length - 1];
  for (let k = Math.ceil(t0 / step); k * step <= t1; k++) {
    const t = k * step;
    svg.append(el("line", { class: "tick", x1: x(t), x2: x(t), y1: height - bottom, y2: height - bottom + 4 }));
    svg.append(el("text", { class: "x-tick", x: x(t), y: height - bottom + 15, "text-anchor": "middle" },
      clock(t, step)));
  }
  if (limit) {
    svg.append(el("line", { class: "limit", x1: left, x2: width - right, y1: y(limit), y2: y(limit) }));
    svg.append(el("text", { x: width - right - 4, y: y(limit) - 4, "text-anchor": "end" }, `guarantee: limit ε ${fmt(limit)}`));
  }
  for (const [key, cls] of [["epsilon_spent", "spent"], ["epsilon_settled", "settled"]]) {
    // ε changes only at an entry: a step line, 0 before the first entry
    let previous = 0;
    const path = [];
    for (const p of points) {
      const value = p[key] || 0;
      path.push(`${x(p.time).toFixed(2)},${y(previous).toFixed(2)}`, `${x(p.time).toFixed(2)},${y(value).toFixed(2)}`);
      previous = value;
    }
    path.push(`${x(t1).toFixed(2)},${y(previous).toFixed(2)}`);
    svg.append(el("polyline", { class: cls, points: path.join(" ") }));
  }
  svg.append(el("text", { x: left + 8, y: top + 10 }, "realised spend: — settled   - - incl. open reservations"));
}

function drawBatches(svg, batches) {
  svg.replaceChildren();
  const { left, right, top, bottom, width, height } = BOX;
  const ymax = Math.max(1, ...batches.map((b) => b.queries));
  axes(svg, ymax, batches.length ? `${batches.length} latest batches` : "no batch finished yet", "queries");
  const slot = (width - left - right) / Math.max(1, batches.length);
  const y = (v) => height - bottom - ((height - top - bottom) * v) / ymax;
  batches.forEach((b, i) => {
    const x = left + i * slot + slot * 0.1;
    const w = Math.max(1, slot * 0.8);
    const cls = b.kind === "release" ? "released" : "asked";
    const asked = el("rect", { class: cls, x, width: w, y: y(b.queries), height: y(0) - y(b.queries) });
    asked.append(el("title", {}, `${b.batch_id}: ${b.answered} of ${b.queries} answered (${b.kind})`));
    svg.append(asked);
    svg.append(el("rect", { class: "answered", x, width: w, y: y(b.answered), height: y(0) - y(b.answered) }));
  });
}

function ago(seconds) {
  if (seconds === null || seconds === undefined) return "never";
  const s = Math.max(0, Date.now() / 1000 - seconds);
  return s < 90 ? `${s.toFixed(0)} s ago` : s < 5400 ? `${(s / 60).toFixed(0)} min ago` : `${(s / 3600).toFixed(1)} h ago`;
}

function renderParties(parties) {
  const body = document.querySelector("#parties tbody");
  body.replaceChildren();
  for (const [name, p] of Object.entries(parties.parties)) {
    const row = document.createElement("tr");
    row.dataset.party = name;
    const teacher = p.role === "teacher";
    for (const [field, text, value] of [["name", name], ["role", p.role], ["last_seen", ago(p.last_seen)],
      ["batches", fmt(p.batches)], ["queries", teacher ? fmt(p.queries) : ""],
      ["epsilon_worst_case", teacher ? fmt(p.epsilon_worst_case) : "", teacher ? p.epsilon_worst_case : undefined]]) {
      const cell = document.createElement("td");
      cell.textContent = text;
      cell.dataset.col = field;
      if (value !== undefined) cell.dataset.value = JSON.stringify(value);
      row.append(cell);
    }
    body.append(row);
  }
}

function renderStudent(student) {
  const box = document.getElementById("student");
  box.replaceChildren();
  const line = (label, value, field) => {
    const p = document.createElement("p");
    const b = document.createElement("span");
    b.className = "muted";
    b.textContent = label + " ";
    const v = document.createElement("span");
    v.textContent = fmt(value);
    if (field) v.dataset.student = field;
    if (value !== undefined && value !== null) v.dataset.value = JSON.stringify(value);
    p.append(b, v);
    box.append(p);
  };
  if (!student.reachable) {
    line("not reachable:", student.error || "no student admin configured");
    return;
  }
  const p = student.progress;
  line("state", p.state, "state");
  line("queries asked", p.queries, "queries");
  line("answered", p.answered, "answered");
  line("labels / s", p.labels_per_s, "labels_per_s");
  if (p.stopped_reason) line("stopped", p.stopped_reason, "stopped_reason");
  const card = student.model_card;
  if (card) {
    line("published ε", card.privacy && card.privacy.epsilon, "card_epsilon");
    line("δ", card.privacy && card.privacy.delta, "card_delta");
    line("accuracy", card.evaluation && card.evaluation.accuracy, "card_accuracy");
    line("model card", `${card.federation} · ${card.queries.asked} asked, ${card.queries.answered} answered`);
  }
}

function renderNoise(budget) {
  const banner = document.getElementById("noise-banner");
  const insecure = budget.noise_secure === false || budget.insecure === true || budget.insecure_noise === true;
  banner.hidden = false;
  banner.className = "banner " + (insecure ? "insecure" : "secure");
  banner.dataset.secure = insecure ? "false" : "true";
  banner.textContent = insecure
    ? `INSECURE NOISE (${budget.noise}): labels are reproducible from a seed and NOT differentially private`
    : `noise: ${budget.noise} (secure random, exact discrete Gaussian)`;
}

function renderVerify(report) {
  const out = document.getElementById("verify-result");
  verifiedHead = report.head;
  out.className = report.ok ? "ok" : "bad";
  out.dataset.ok = String(report.ok);
  out.dataset.head = report.head;
  out.textContent = report.ok
    ? `ok: ${report.entries} entries, head ${report.head.slice(0, 16)}…`
    : `FAILED: ${report.problems.join("; ")}`;
}

async function verify() {
  try {
    renderVerify(await api("ledger/verify"));
  } catch (err) {
    document.getElementById("verify-result").textContent = String(err.message || err);
  }
}

async function refresh() {
  try {
    const [budget, history, parties, student] = await Promise.all([
      api("budget"), api("budget/history"), api("parties"), api("student"),
    ]);
    for (const [key, value] of Object.entries(budget)) setField(key, value);
    if ("chain_ok" in budget) setField("chain_ok", budget.chain_ok, budget.chain_ok ? "intact" : "BROKEN");
    // fraction_used is of the Rényi (RDP) budget; the ε fraction is shown beside it, so neither reads as the other
    setField("percent_used", budget.fraction_used * 100, (budget.fraction_used * 100).toFixed(1));
    const epsilonPercent = budget.epsilon_limit ? (100 * budget.epsilon_spent) / budget.epsilon_limit : 0;
    document.getElementById("epsilon-percent").textContent = epsilonPercent.toFixed(1);
    document.getElementById("meter-fill").style.width = `${Math.min(100, budget.fraction_used * 100)}%`;
    document.getElementById("federation").textContent = parties.federation;
    renderNoise(budget);
    drawEpsilon(document.getElementById("chart-epsilon"), history.points, budget.epsilon_limit);
    drawBatches(document.getElementById("chart-batches"), history.batches);
    renderParties(parties);
    renderStudent(student);
    // verify reads every entry: once per new ledger head, and on demand
    if (budget.head !== verifiedHead) await verify();
    refreshes += 1;
    document.getElementById("updated").textContent = "updated " + new Date().toLocaleTimeString();
    document.getElementById("refreshes").textContent = `(every ${REFRESH_MS / 1000} s, ${refreshes} refreshes)`;
    document.body.dataset.refreshes = String(refreshes);
    document.getElementById("error-banner").hidden = true;
    showBoard();
  } catch (err) {
    if (err instanceof AuthError) return refuse(err.message);
    const banner = document.getElementById("error-banner");
    banner.hidden = false;
    banner.textContent = `last refresh failed: ${err.message || err}; retrying`;
  }
  timer = setTimeout(refresh, REFRESH_MS);
}

function showBoard() {
  document.getElementById("auth").hidden = true;
  document.getElementById("board").hidden = false;
  document.body.dataset.state = "board";
}

function refuse(message) {
  clearTimeout(timer);
  sessionStorage.removeItem(TOKEN_KEY);
  token = null;
  document.getElementById("board").hidden = true;
  document.getElementById("auth").hidden = false;
  document.getElementById("auth-message").textContent = message;
  document.body.dataset.state = "refused";
}

function start() {
  document.getElementById("auth-form").addEventListener("submit", (event) => {
    event.preventDefault();
    token = document.getElementById("auth-token").value.trim();
    sessionStorage.setItem(TOKEN_KEY, token);
    refreshes = 0;
    refresh();
  });
  document.getElementById("verify-now").addEventListener("click", verify);
  window.addEventListener("hashchange", () => {
    // a link with #token=… opened in a tab that already shows the page
    const fresh = takeToken();
    if (fresh && fresh !== token) {
      clearTimeout(timer);
      token = fresh;
      refreshes = 0;
      refresh();
    }
  });
  token = takeToken();
  if (token) refresh();
  else refuse("This page shows the guardian's admin API and needs its admin bearer token (admin.token_file).");
}

document.addEventListener("DOMContentLoaded", start);
