// Runs list: each row's status, verdict, alert counts and last step follow the run without a reload.
// ws/alerts/ brings the news of every run the user may see (alerts, incidents, progress); the rows it
// names are read again from GET /api/v1/runs?key=... (at most one read per 3 s, 50 keys a request),
// every row on reconnecting and every 15 s while the socket is down. Text only, never HTML.
(function () {
  "use strict";
  const table = document.getElementById("runs");
  if (!table) return;
  const rows = new Map([...table.querySelectorAll("tbody tr[data-run]")].map((tr) => [tr.dataset.run, tr]));
  if (!rows.size) return;
  const scheme = location.protocol === "https:" ? "wss" : "ws";
  const url = `${scheme}://${location.host}/ws/alerts/`;
  const GAP_MS = 3000, QUIET_MS = 30000, DOWN_POLL_MS = 15000, KEYS_A_READ = 50;
  const dirty = new Set();
  const counted = new Map();  // key -> the progress counts last read against
  const readAt = new Map();  // key -> when it was last read
  let lastRead = 0, timer = null, connected = false, opened = false;

  function badge(cls, text, title) {
    const el = document.createElement("span");
    el.className = `badge ${cls}`;
    el.textContent = text;
    if (title) el.title = title;
    return el;
  }

  function renderRow(run) {
    const tr = rows.get(run.key);
    if (!tr) return;
    const verdict = badge(`verdict-${run.verdict.kind}`, run.verdict.text);
    verdict.dataset.verdict = run.verdict.kind;
    const cell = tr.querySelector("td.verdict");
    const parts = [verdict];
    if (run.alerts.critical) parts.push(" ", badge("critical", `${run.alerts.critical} critical`, "unresolved critical alerts"));
    if (run.alerts.warning) parts.push(" ", badge("warning", `${run.alerts.warning} warning`, "unresolved warnings"));
    if (cell) cell.replaceChildren(...parts);
    const status = tr.querySelector("td.status");
    if (status) status.replaceChildren(badge(`status-${run.status}`, run.status));
    const step = tr.querySelector("td.last-step");
    if (step) step.textContent = run.last_step === null ? "–" : String(run.last_step);
    tr.dataset.read = String(Date.now());
  }

  async function readNow() {
    timer = null;
    lastRead = Date.now();
    const keys = [...dirty];
    dirty.clear();
    for (let i = 0; i < keys.length; i += KEYS_A_READ) {
      const query = new URLSearchParams(keys.slice(i, i + KEYS_A_READ).map((k) => ["key", k]));
      try {
        const response = await fetch(`${table.dataset.url}?${query}`, { credentials: "same-origin", cache: "no-store" });
        if (!response.ok) continue;
        for (const run of (await response.json()).runs) {
          readAt.set(run.key, Date.now());
          renderRow(run);
        }
      } catch (err) {
        console.warn("runs", err);
      }
    }
  }

  function readSoon(keys) {
    for (const key of keys) if (rows.has(key)) dirty.add(key);
    if (!dirty.size || timer) return;
    timer = setTimeout(readNow, Math.max(300, lastRead + GAP_MS - Date.now()));
  }

  function onMessage(msg) {
    if (msg.type === "alert" && msg.alert) readSoon([msg.alert.run]);
    if (msg.type === "incident" && msg.incident) readSoon([msg.incident.run]);
    if (msg.type === "progress") {  // every 2 s per active run: only when its counts moved, else now and then
      const counts = [msg.last_step, msg.min_step, msg.ranks_reporting, msg.ranks_ended].join("|");
      if (counts !== counted.get(msg.run) || Date.now() - (readAt.get(msg.run) || 0) > QUIET_MS) {
        counted.set(msg.run, counts);
        readSoon([msg.run]);
      }
    }
  }

  setInterval(() => { if (!connected) readSoon(rows.keys()); }, DOWN_POLL_MS);

  function connect(delay) {
    const ws = new WebSocket(url);
    ws.onopen = () => {
      connected = true;
      table.dataset.connected = "true";
      delay = 1000;
      if (opened) readSoon(rows.keys());  // what the socket missed while it was away
      opened = true;
    };
    ws.onmessage = (event) => onMessage(JSON.parse(event.data));
    ws.onclose = () => {
      connected = false;
      delete table.dataset.connected;
      setTimeout(() => connect(Math.min(delay * 2, 30000)), delay);
    };
  }
  connect(1000);
})();
