// Compaction dashboard: sign in with an API key, list its conversations, chart their prompt tokens and compactions.
"use strict";

(() => {
  const API = "/_proxy/api";
  const STORED_KEY = "compaction-proxy.key";
  const STORED_TENANT = "compaction-proxy.tenant";
  const REFRESH_MS = 5000;
  // A request's x-compaction outcomes that built (or applied) a new summary; "reused" and "none" did not.
  const COMPACTING = new Set(["proactive", "reactive", "forced", "requested", "prepared"]);
  const SVG = "http://www.w3.org/2000/svg";
  const KINDS = { summary: "Summary", clearing: "Tool results cleared", pair_summaries: "Tool rounds summarised",
    shadow: "Shadow decision (not applied)" };
  const ROLE_ORDER = ["system", "developer", "user", "assistant", "tool"];

  const $ = (id) => document.getElementById(id);
  const state = { info: { tenant_header: null }, generation: 0, timer: null, selected: null, opener: null };

  class Unauthorized extends Error {}
  class Stale extends Error {}

  // ---- helpers: every string from the API goes into the page as text, never as markup ----
  function make(ns, tag, attrs, children) {
    const node = ns ? document.createElementNS(ns, tag) : document.createElement(tag);
    for (const [name, value] of Object.entries(attrs)) {
      if (name === "text") node.textContent = value;
      else if (value !== null && value !== undefined && value !== false) node.setAttribute(name, String(value));
    }
    node.append(...children.filter((c) => c !== null && c !== undefined));
    return node;
  }
  const el = (tag, attrs = {}, ...children) => make(null, tag, attrs, children);
  const svg = (tag, attrs = {}, ...children) => make(SVG, tag, attrs, children);
  const num = (n) => (Number.isFinite(Number(n)) ? Number(n).toLocaleString("en-US") : "–");
  const short = (id) => (String(id).length > 12 ? `${String(id).slice(0, 12)}…` : String(id));
  const when = (at) => (at ? new Date(at * 1000).toLocaleString() : "–");
  const iso = (at) => (at ? new Date(at * 1000).toISOString() : "");
  const plural = (n, word, many = `${word}s`) => `${num(n)} ${Number(n) === 1 ? word : many}`;

  function say(message, isError = false) {
    const status = $("status");
    status.textContent = message;
    status.classList.toggle("error", isError);
  }

  // ---- the API, with the key (and tenant) on every call ----
  function credentials() {
    return { key: sessionStorage.getItem(STORED_KEY) || "", tenant: sessionStorage.getItem(STORED_TENANT) || "" };
  }

  async function api(path) {
    const { key, tenant } = credentials();
    if (!key) throw new Unauthorized("Sign in with your API key.");
    const generation = state.generation;
    const headers = { Authorization: `Bearer ${key}`, Accept: "application/json" };
    if (state.info.tenant_header && tenant) headers[state.info.tenant_header] = tenant;
    const response = await fetch(API + path, { headers, cache: "no-store", credentials: "omit" });
    if (generation !== state.generation) throw new Stale();
    if (response.status === 401) {
      throw new Unauthorized(`The proxy refused these credentials: ${await errorMessage(response)}`);
    }
    if (!response.ok) throw new Error(await errorMessage(response));
    const body = await response.json();
    if (generation !== state.generation) throw new Stale();
    return body;
  }

  async function errorMessage(response) {
    try {
      const body = await response.json();
      if (body && body.error && body.error.message) return String(body.error.message);
    } catch (ignored) { /* not JSON */ }
    return `HTTP ${response.status}`;
  }

  function fail(error) {
    if (error instanceof Stale) return;
    if (error instanceof Unauthorized) signOut(error.message, true);
    else say(error.message || String(error), true);
  }
  // An action whose failure is reported (a 401 signs out); an outdated answer (signed out since) is dropped.
  const guarded = (action) => async (...args) => {
    try {
      await action(...args);
    } catch (error) {
      fail(error);
    }
  };

  // ---- signing in and out ----
  async function loadInfo() {
    try {
      const response = await fetch(`${API}/info`, { cache: "no-store", credentials: "omit" });
      if (response.ok) state.info = await response.json();
    } catch (ignored) { /* no tenant field then */ }
    const header = state.info && state.info.tenant_header;
    $("tenant-field").hidden = !header;
    $("tenant-header-name").textContent = header || "";
  }

  function onSubmit(event) {
    event.preventDefault();
    const key = $("api-key").value.trim();
    if (!key) {
      say("Enter your API key to sign in.", true);
      $("api-key").focus();
      return;
    }
    sessionStorage.setItem(STORED_KEY, key);
    sessionStorage.setItem(STORED_TENANT, $("tenant").value.trim());
    enter();
  }

  async function enter() {
    state.generation += 1;
    say("Signing in…");
    try {
      await loadConversations();
    } catch (error) {
      // Whatever went wrong, the login form comes back with the reason (a 401's message included).
      if (!(error instanceof Stale)) signOut(error.message || String(error), true);
      return;
    }
    const { tenant } = credentials();
    $("api-key").value = "";
    $("login").hidden = true;
    $("dashboard").hidden = false;
    $("session").hidden = false;
    $("session-label").textContent = tenant ? `Signed in · tenant ${tenant}` : "Signed in";
    const count = $("conversations").tBodies[0].rows.length;
    say(`Signed in. ${plural(count, "conversation")} listed.`);
    $("main").focus();
    refreshMetrics();
    clearInterval(state.timer);
    state.timer = setInterval(refreshMetrics, REFRESH_MS);
  }

  function signOut(message = "Signed out.", isError = false) {
    sessionStorage.removeItem(STORED_KEY);
    sessionStorage.removeItem(STORED_TENANT);
    state.generation += 1;
    clearInterval(state.timer);
    state.timer = null;
    state.selected = null;
    for (const id of ["metrics", "events", "chart", "detail-id", "detail-meta", "summary-text", "summary-meta"]) {
      $(id).replaceChildren();
    }
    $("conversations").tHead.replaceChildren();
    $("conversations").tBodies[0].replaceChildren();
    $("points").tBodies[0].replaceChildren();
    for (const id of ["dashboard", "session", "detail", "summary-panel"]) $(id).hidden = true;
    $("login").hidden = false;
    $("api-key").value = "";
    say(message, isError);
    $("api-key").focus();
  }

  // ---- live counters ----
  const refreshMetrics = guarded(async () => renderMetrics(await api("/metrics")));

  function renderMetrics(m) {
    const triggers = Object.entries(m.compactions || {}).sort(([a], [b]) => a.localeCompare(b));
    const total = triggers.reduce((sum, [, n]) => sum + Number(n || 0), 0);
    const byTrigger = triggers.map(([trigger, n]) => `${trigger} ${num(n)}`).join(", ");
    const seconds = (m.summarizer_seconds && m.summarizer_seconds.sum) || 0;
    const count = (m.summarizer_seconds && m.summarizer_seconds.count) || 0;
    const items = [
      ["Requests", num(m.requests)],
      ["Compactions", byTrigger ? `${num(total)} (${byTrigger})` : num(total)],
      ["Failures", num(m.failures)],
      ["Summariser time", `${Number(seconds).toFixed(2)} s in ${plural(count, "summary", "summaries")}`],
    ];
    $("metrics").replaceChildren(...items.map(([name, value]) => el("div", {}, el("dt", { text: name }),
      el("dd", { text: value }))));
  }

  // ---- conversations ----
  async function loadConversations() {
    const body = await api("/conversations?limit=100");
    renderConversations(body.conversations || [], Boolean(body.operator));
  }

  function renderConversations(conversations, operator) {
    const table = $("conversations");
    const columns = ["Conversation", "Model", "Dialect", "Requests", "Compactions", "Last seen"];
    if (operator) columns.push("Owner");
    table.tHead.replaceChildren(el("tr", {}, ...columns.map((name, i) => el("th", {
      scope: "col", class: i >= 3 && i <= 4 ? "num" : null, text: name }))));
    table.tBodies[0].replaceChildren(...conversations.map((c) => {
      const open = el("button", { type: "button", class: "link", title: c.id, "data-conversation-id": c.id,
        text: short(c.id) });
      open.addEventListener("click", () => selectConversation(c.id));
      const row = el("tr", { "data-conversation-id": c.id, "aria-current": c.id === state.selected ? "true" : null },
        el("th", { scope: "row" }, open), el("td", { text: c.model }), el("td", { text: c.dialect }),
        el("td", { class: "num", text: num(c.requests) }), el("td", { class: "num", text: num(c.compactions) }),
        el("td", {}, el("time", { datetime: iso(c.last_at), text: when(c.last_at) })));
      if (operator) row.append(el("td", { class: "mono", text: c.owner || "" }));
      return row;
    }));
    table.hidden = conversations.length === 0;
    $("no-conversations").hidden = conversations.length > 0;
  }

  const refreshConversations = guarded(async () => {
    await loadConversations();
    say(`${plural($("conversations").tBodies[0].rows.length, "conversation")} listed.`);
  });

  const selectConversation = guarded(async (id) => {
    state.selected = id;
    for (const row of $("conversations").tBodies[0].rows) {
      if (row.dataset.conversationId === id) row.setAttribute("aria-current", "true");
      else row.removeAttribute("aria-current");
    }
    const detail = await api(`/conversations/${encodeURIComponent(id)}`);
    const markers = renderDetail(detail);
    say(`Conversation ${short(id)}: ${plural(detail.points.length, "request")}, ` +
      `${plural(markers.length, "compaction")} marked.`);
  });

  function renderDetail({ conversation: c, points = [], events = [] }) {
    $("detail-id").textContent = short(c.id);
    $("detail-id").title = c.id;
    $("detail-meta").textContent = `${c.model} · ${c.dialect} · ${plural(c.requests, "request")} · ` +
      `${plural(c.compactions, "compaction")} · first seen ${when(c.first_at)} · last seen ${when(c.last_at)}`;
    const markers = compactionMarkers(points, events);
    $("chart").replaceChildren(chart(c, points, markers));
    renderPointsTable(points, markers);
    renderEvents(events);
    $("summary-panel").hidden = true;
    $("detail").hidden = false;
    return markers;
  }

  // One marker per compaction: each request whose outcome built or applied a new summary (it names the event),
  // then each applied summary event not marked yet, at the first request that used it (a background summary),
  // else its own request, else the first request after it. An event is marked once.
  function compactionMarkers(points, events) {
    const markers = [];
    const marked = new Set();
    points.forEach((p, index) => {
      if (p.event_id && COMPACTING.has(p.outcome) && !marked.has(p.event_id)) {
        marked.add(p.event_id);
        markers.push({ index, eventId: p.event_id, outcome: p.outcome });
      }
    });
    for (const e of events) {
      if (e.kind !== "summary" || e.outcome !== "applied" || marked.has(e.id)) continue;
      let index = points.findIndex((p) => p.event_id === e.id);
      if (index < 0 && e.request_id) index = points.findIndex((p) => p.request_id === e.request_id);
      if (index < 0) index = points.findIndex((p) => p.at >= e.at);
      if (index < 0) continue;
      marked.add(e.id);
      markers.push({ index, eventId: e.id, outcome: e.trigger });
    }
    return markers.sort((a, b) => a.index - b.index);
  }

  // ---- the chart: an inline SVG, prompt tokens per request ----
  function niceStep(raw) {
    const power = 10 ** Math.floor(Math.log10(Math.max(raw, 1)));
    return [1, 2, 2.5, 5, 10].map((f) => f * power).find((step) => step >= raw);
  }

  function chart(c, points, markers) {
    const W = 800, H = 320, left = 64, right = 16, top = 16, bottom = 44;
    const plotW = W - left - right, plotH = H - top - bottom;
    const values = points.flatMap((p) => [p.tokens_before, p.tokens_after, p.window, p.threshold_tokens]);
    const step = niceStep(Math.max(1, ...values) / 4);
    const yMax = step * Math.max(1, Math.ceil(Math.max(1, ...values) / step));
    const x = (i) => left + (points.length > 1 ? (i * plotW) / (points.length - 1) : plotW / 2);
    const y = (v) => top + plotH - (Math.max(0, v) / yMax) * plotH;
    const last = points[points.length - 1] || {};
    const label = `Prompt tokens per request for conversation ${short(c.id)}: ${plural(points.length, "request")}, ` +
      `${plural(markers.length, "compaction")}` + (last.window ? `, window ${num(last.window)} tokens` : "") +
      (last.threshold_tokens ? `, threshold ${num(last.threshold_tokens)} tokens` : "") +
      ". The same data is in the table below.";
    const root = svg("svg", { viewBox: `0 0 ${W} ${H}`, role: "img", "aria-label": label,
      preserveAspectRatio: "xMidYMid meet" },
    svg("title", { text: `Prompt tokens per request, conversation ${short(c.id)}` }));

    const grid = svg("g", { class: "grid" });
    for (let v = 0; v <= yMax; v += step) {
      grid.append(svg("line", { x1: left, x2: W - right, y1: y(v), y2: y(v) }));
      root.append(svg("text", { x: left - 6, y: y(v) + 4, "text-anchor": "end", text: num(v) }));
    }
    const every = Math.max(1, Math.ceil(points.length / 12));
    for (let i = 0; i < points.length; i += every) {
      root.append(svg("text", { x: x(i), y: H - bottom + 16, "text-anchor": "middle", text: String(i + 1) }));
    }
    root.append(svg("text", { x: left + plotW / 2, y: H - 6, "text-anchor": "middle", text: "Request" }));
    root.prepend(grid);
    root.append(svg("path", { class: "axis", d: `M${left},${top}V${top + plotH}H${W - right}` }));

    // The window and the threshold: horizontal lines, stepping where a request saw another value.
    for (const [field, cls] of [["window", "window"], ["threshold_tokens", "threshold"]]) {
      const d = stepPath(points, field, x, y, left, W - right);
      if (d) root.append(svg("path", { class: `limit ${cls}`, d }));
    }
    for (const [field, cls] of [["tokens_before", "before"], ["tokens_after", "after"]]) {
      const coords = points.map((p, i) => `${x(i).toFixed(1)},${y(p[field]).toFixed(1)}`).join(" ");
      if (points.length > 1) root.append(svg("polyline", { class: `series ${cls}`, points: coords }));
      else if (points.length === 1) {
        root.append(svg("circle", { class: `series ${cls}`, cx: x(0), cy: y(points[0][field]), r: 3 }));
      }
    }
    for (const m of markers) {
      const p = points[m.index];
      const g = svg("g", { class: "marker", "data-request-index": m.index, "data-event-id": m.eventId },
        svg("title", { text: `Request ${m.index + 1}: ${m.outcome} compaction, ${num(p.tokens_before)} → ` +
          `${num(p.tokens_after)} tokens` }),
        svg("line", { x1: x(m.index), x2: x(m.index), y1: y(p.tokens_before), y2: y(p.tokens_after) }),
        svg("circle", { cx: x(m.index), cy: y(p.tokens_after), r: 6 }));
      g.addEventListener("click", () => highlightEvent(m.eventId));
      root.append(g);
    }
    return root;
  }

  function stepPath(points, field, x, y, x0, x1) {
    const usable = points.map((p, i) => [i, Number(p[field]) || 0]).filter(([, v]) => v > 0);
    if (!usable.length) return "";
    let d = `M${x0},${y(usable[0][1]).toFixed(1)}`;
    for (let k = 1; k < usable.length; k += 1) {
      if (usable[k][1] !== usable[k - 1][1]) {
        const mid = (x(usable[k - 1][0]) + x(usable[k][0])) / 2;
        d += `H${mid.toFixed(1)}V${y(usable[k][1]).toFixed(1)}`;
      }
    }
    return `${d}H${x1}`;
  }

  function renderPointsTable(points, markers) {
    const byIndex = new Map(markers.map((m) => [m.index, m]));
    $("points").tBodies[0].replaceChildren(...points.map((p, i) => el("tr", {},
      el("td", { class: "num", text: String(i + 1) }),
      el("td", {}, el("time", { datetime: iso(p.at), text: when(p.at) })),
      el("td", { text: byIndex.has(i) ? `${p.outcome} (compaction)` : p.outcome }),
      el("td", { class: "num", text: num(p.tokens_before) }), el("td", { class: "num", text: num(p.tokens_after) }),
      el("td", { class: "num", text: num(p.window) }), el("td", { class: "num", text: num(p.threshold_tokens) }))));
  }

  // ---- events ----
  function spanText(e) {
    const span = e.span || { start: 0, count: 0, roles: {} };
    const rank = (role) => (ROLE_ORDER.includes(role) ? ROLE_ORDER.indexOf(role) : ROLE_ORDER.length);
    const roles = Object.entries(span.roles || {}).sort(([a], [b]) => rank(a) - rank(b) || a.localeCompare(b))
      .map(([role, n]) => `${num(n)} ${role}`).join(", ");
    const range = span.count
      ? `messages ${num(span.start + 1)}–${num(span.start + span.count)} (${num(span.count)})` : "no messages";
    return `${range}${roles ? `: ${roles}` : ""} · ${num(e.replaced_tokens)} → ${num(e.replacement_tokens)} tokens`;
  }

  function renderEvents(events) {
    $("events").replaceChildren(...events.map((e, i) => {
      const heading = el("h4", { id: `event-title-${i}`,
        text: `${KINDS[e.kind] || e.kind} · ${e.outcome} · ${e.trigger}` });
      const item = el("li", { id: `event-${e.id}`, "data-event-id": e.id }, heading,
        el("p", { class: "muted" }, el("time", { datetime: iso(e.at), text: when(e.at) }),
          ` · ${e.model} · ${e.dialect}` + (e.request_id ? ` · request ${e.request_id}` : "")),
        el("p", { class: "span", text: spanText(e) }),
        el("p", { text: `Request ${num(e.tokens_before)} → ${num(e.tokens_after)} tokens; window ` +
          `${num(e.window)}, threshold ${num(e.threshold_tokens)}` + (e.reason ? ` · ${e.reason}` : "") }));
      const s = e.summarizer;
      if (s) {
        item.append(el("p", { class: "muted", text: `Summariser ${s.model}: ${plural(s.calls, "call")}, ` +
          `${num(s.prompt_tokens)} prompt + ${num(s.completion_tokens)} completion tokens, ` +
          `${num(Math.round(s.latency_ms))} ms` + (s.strategy ? `, ${s.strategy}` : "") +
          (s.structured ? ", structured" : "") }));
      }
      if (e.has_summary) {
        const button = el("button", { type: "button", class: "secondary", "data-event-id": e.id,
          "aria-describedby": heading.id, text: "Show summary" });
        button.addEventListener("click", () => showSummary(e.id, button));
        item.append(button);
      }
      return item;
    }));
    $("no-events").hidden = events.length > 0;
  }

  function highlightEvent(id) {
    for (const item of $("events").children) item.classList.toggle("selected", item.dataset.eventId === id);
    const item = $(`event-${id}`);
    if (item) item.scrollIntoView({ block: "nearest" });
  }

  const showSummary = guarded(async (id, opener) => {
    const e = await api(`/events/${encodeURIComponent(id)}`);
    highlightEvent(id);
    $("summary-title").textContent = `Summary of event ${short(id)}`;
    $("summary-meta").textContent = `Sent to the model in place of ${spanText(e)}.`;
    $("summary-text").textContent = typeof e.summary === "string" ? e.summary : "(No summary text was stored.)";
    state.opener = opener;
    $("summary-panel").hidden = false;
    $("summary-panel").focus();
  });

  function closeSummary() {
    $("summary-panel").hidden = true;
    if (state.opener && state.opener.isConnected) state.opener.focus();
  }

  // ---- start ----
  async function start() {
    $("login-form").addEventListener("submit", onSubmit);
    $("sign-out").addEventListener("click", () => signOut());
    $("refresh").addEventListener("click", refreshConversations);
    $("summary-close").addEventListener("click", closeSummary);
    await loadInfo();
    if (credentials().key) {
      enter();
    } else {
      $("login").hidden = false;
      say("Sign in with the API key your SDK uses to see your conversations.");
    }
  }

  start();
})();
