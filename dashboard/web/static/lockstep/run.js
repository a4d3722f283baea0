// Run page: live alert feed over ws/runs/<key>/ (rendered as text, never as HTML, so reasons,
// frame names and graph code from the agents stay inert) and the timeline / agreement heatmap,
// fetched from the aggregated timeline API and refreshed when the websocket reports news.
(function () {
  "use strict";
  const list = document.getElementById("alerts");
  const status = document.getElementById("live-status");
  if (!list) return;
  const scheme = location.protocol === "https:" ? "wss" : "ws";
  const url = `${scheme}://${location.host}/ws/runs/${encodeURIComponent(list.dataset.run)}/`;

  function span(cls, text) {
    const el = document.createElement("span");
    el.className = cls;
    el.textContent = text;
    return el;
  }

  function render(alert) {
    const existing = list.querySelector(`li[data-id="${alert.id}"]`);
    const li = document.createElement("li");
    li.className = `alert ${alert.severity}${alert.acked_by ? " acked" : ""}`;
    li.dataset.id = alert.id;
    li.dataset.kind = alert.kind;
    li.append(span("kind", alert.kind), span("ranks", `ranks ${alert.ranks.join(", ")}`));
    if (alert.step !== null) li.append(span("step", `step ${alert.step}`));
    li.append(span("message", alert.message));
    if (alert.acked_by) li.append(span("acked", `acked by ${alert.acked_by}`));
    if (alert.resolve_reason) li.append(span("resolved-by", alert.resolve_reason + (alert.resolved_by ? ` (${alert.resolved_by})` : "")));
    const none = list.querySelector("li.none");
    if (none) none.remove();
    if (existing) existing.replaceWith(li); else list.prepend(li);
  }

  // Incidents: one line per cause, its root first, the alerts it set off folded under it.
  const incidents = document.getElementById("incidents");
  // as _incident.html says it: an alert of no rank concerns the whole run
  const whose = (ranks) => ranks.length ? `rank${ranks.length === 1 ? "" : "s"} ${ranks.join(", ")}` : "the whole run";
  // In step order, as the server lists them (no step last; a new incident after those of its step):
  // the first incident whose root step is later than `li`'s, or null for the end of the list.
  const stepOf = (el) => el.dataset.step === undefined ? Infinity : Number(el.dataset.step);
  function laterThan(li) {
    const step = stepOf(li);
    return [...incidents.querySelectorAll(":scope > li.incident")].find((other) => stepOf(other) > step) || null;
  }
  function renderIncident(incident) {
    if (!incidents || !incident.root) return;
    const root = incident.root;
    const li = document.createElement("li");
    li.className = `incident ${incident.severity} ${incident.state}${incident.acked_by ? " acked" : ""}`;
    li.dataset.id = incident.id;
    li.dataset.rootKind = root.kind;
    if (root.step !== null) li.dataset.step = root.step;
    li.append(span("state", incident.state.replace("_", " ")), span("kind", root.kind),
              span("ranks", `root: ${whose(root.ranks)}`));
    if (root.step !== null) li.append(span("step", `step ${root.step}`));
    li.append(span("message", root.message));
    if (incident.remedy) {
      const remedy = document.createElement("div");
      remedy.className = "remedy";
      remedy.append("What to do: ", span("remedy-text", incident.remedy.text), " ",
                    span("doc", `(${incident.remedy.doc})`));
      li.append(remedy);
    }
    if (incident.acked_by) li.append(span("acked", `acked by ${incident.acked_by}`));
    const rest = incident.consequences || [];
    if (rest.length) {
      const details = document.createElement("details");
      details.className = "consequences";
      const summary = document.createElement("summary");
      summary.textContent = `${rest.length} consequence${rest.length === 1 ? "" : "s"}`;
      const ul = document.createElement("ul");
      for (const c of rest) {
        const item = document.createElement("li");
        item.className = `consequence ${c.severity} ${c.state}`;
        item.append(span("kind", c.kind), span("ranks", ` ${whose(c.ranks)} `), span("message", c.message));
        ul.append(item);
      }
      details.append(summary, ul);
      li.append(details);
    }
    const existing = incidents.querySelector(`li[data-id="${incident.id}"]`);
    const none = incidents.querySelector("li.none");
    if (none) none.remove();
    if (existing && stepOf(existing) === stepOf(li)) {
      existing.replaceWith(li);
      return;
    }
    if (existing) existing.remove();
    incidents.insertBefore(li, laterThan(li));
  }

  // Per-rank strip from the aggregated progress message (at most 64 ranks, holders first).
  const strip = document.getElementById("strip");
  function seconds(s) { return s === null || s === undefined ? "–" : `${Math.round(s)} s`; }
  function renderStrip(rows) {
    if (!strip || !rows) return;
    const items = rows.map((row) => {
      const li = document.createElement("li");
      li.className = `rank-now ${row.phase}${row.holding ? " holding" : ""}`;
      li.dataset.rank = row.rank;
      li.append(span("rank", `rank ${row.rank}`), span("phase", row.phase));
      if (row.op) li.append(span("op", row.op));
      li.append(span("for", `for ${seconds(row.for_s)}`),
                span("since", `${seconds(row.since_step_s)} since step`));
      if (row.step !== null) li.append(span("step", `step ${row.step}`));
      if (row.where) li.append(span("where", row.where));
      if (row.holding) li.append(span("holding-tag", "holding the others up"));
      return li;
    });
    if (!items.length) return;
    strip.replaceChildren(...items);
  }

  // Charts: one fetch of server-side aggregates; refetch at most every 3 s after live news.
  const timelineEl = document.getElementById("timeline");
  const heatmapEl = document.getElementById("heatmap");
  let pending = null;
  async function drawCharts() {
    pending = null;
    if (!timelineEl || !window.LockstepCharts) return;
    try {
      const response = await fetch(timelineEl.dataset.url, { credentials: "same-origin" });
      if (!response.ok) return;
      const data = await response.json();
      window.LockstepCharts.timeline(timelineEl, data);
      window.LockstepCharts.heatmap(heatmapEl, data.heatmap, data.world_size);
      timelineEl.dataset.drawn = String(Date.now());
    } catch (err) {
      console.warn("timeline", err);
    }
  }
  function refreshSoon() {
    if (!pending) pending = setTimeout(drawCharts, 3000);
  }
  drawCharts();

  function connect(delay) {
    const ws = new WebSocket(url);
    // an ended run still listens (a late report may arrive) but says it ended, not "live"
    const over = status.dataset.over === "true";
    ws.onopen = () => { status.textContent = over ? "ended" : "live"; status.dataset.connected = "true"; delay = 1000; };
    ws.onmessage = (event) => {
      const msg = JSON.parse(event.data);
      if (msg.type === "alert") render(msg.alert);
      if (msg.type === "incident") renderIncident(msg.incident);
      if (msg.type === "progress") renderStrip(msg.strip);
      if (msg.type === "alert" || msg.type === "progress") refreshSoon();
    };
    ws.onclose = () => {
      delete status.dataset.connected;
      status.textContent = over ? "ended" : "reconnecting…";
      setTimeout(() => connect(Math.min(delay * 2, 30000)), delay);
    };
  }
  connect(1000);
})();
