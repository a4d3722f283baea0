// Run page: live alert feed over ws/runs/<key>/ (rendered as text, never as HTML, so reasons,
// frame names and graph code from the agents stay inert) and the timeline / agreement heatmap,
// fetched from the aggregated timeline API and refreshed when the websocket reports news.
// The rest the server knows (status, verdict, last step, counts, the ranks table, whether the run is
// over) is read again from GET /api/v1/runs/<key>/now when the socket says the run changed, on every
// (re)connect, and every 10 s while the socket is down; the page says "as of" when it is not live.
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
      const doc = document.createElement("a");
      doc.href = `/alerts/reference/#${encodeURIComponent(root.kind)}`;
      doc.textContent = incident.remedy.doc;
      const where = span("doc", "(");
      where.append(doc, ")");
      remedy.append("What to do: ", span("remedy-text", incident.remedy.text), " ", where);
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
  function stripRow(row) {
    const li = document.createElement("li");
    li.dataset.rank = row.rank;
    if (row.phase === "ended") {  // the rank ended (its rank_end's status) or was lost: no phase now
      li.className = "rank-now ended";
      li.append(span("rank", `rank ${row.rank}`), span("phase", row.ended === "lost" ? "lost" : `ended (${row.ended})`));
      if (row.step !== null && row.step !== undefined) li.append(span("step", `last step ${row.step}`));
      return li;
    }
    li.className = `rank-now ${row.phase}${row.holding ? " holding" : ""}`;
    li.append(span("rank", `rank ${row.rank}`), span("phase", row.phase));
    if (row.op) li.append(span("op", row.op));
    li.append(span("for", `for ${seconds(row.for_s)}`));
    // `step`: the step in progress; `since_step_s`: since the one before it ended, i.e. how far into it
    if (row.step !== null) {
      li.append(span("step", `step ${row.step}`), span("since", `${seconds(row.since_step_s)} into it`));
    } else {
      li.append(span("since", `${seconds(row.since_step_s)} since the last step`));
    }
    if (row.where) li.append(span("where", row.where));
    if (row.holding) li.append(span("holding-tag", "holding the others up"));
    return li;
  }
  // A rank the ranks table (GET .../now) shows as no longer running reads as ended in the strip at
  // once, as the progress push would say it (notify.ended_in_strip): its last phase must not linger
  // until the next push (a crashed rank must not read as still compiling), and a push computed before
  // the read must not bring that phase back, nor drop the rank (its last sample may have aged out).
  const STRIP_RANKS = 64;
  let endedRanks = [];
  function endedInStrip() {
    if (!strip || over) return;
    for (const r of endedRanks) {
      const li = strip.querySelector(`li.rank-now[data-rank="${r.rank}"]`);
      if (li && li.classList.contains("ended")) continue;
      const row = stripRow({ rank: r.rank, phase: "ended", ended: r.status, step: r.last_step });
      if (li) li.replaceWith(row);
      else if (strip.querySelectorAll("li.rank-now").length < STRIP_RANKS) {
        strip.querySelector("li.none")?.remove();
        strip.append(row);
      }
    }
  }
  function renderStrip(rows) {
    if (!strip || !rows || over) return;  // an ended run's strip says so (renderNow), not its last phases
    const items = rows.map(stripRow);
    if (!items.length) return;
    strip.replaceChildren(...items);
    endedInStrip();
  }
  function stripEnded(text) {
    const li = document.createElement("li");
    li.className = "none ended";
    li.textContent = text;
    strip.replaceChildren(li);
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

  // The run's changing parts from GET /api/v1/runs/<key>/now (live.py): at most one read per GAP_MS
  // (a burst of news is one read), the first 300 ms after the news that asked for it.
  const nowUrl = status.dataset.now;
  const GAP_MS = 2000, PROGRESS_GAP_MS = 5000, QUIET_MS = 30000, DOWN_POLL_MS = 10000;
  let over = status.dataset.over === "true";
  let connected = false, opened = false;
  let asOf = new Date();  // when what the page shows was last read (the page itself at first)
  let lastRead = 0, reading = false, again = false, timer = null, due = 0, shown = "";
  let countedRanks = "", countedSteps = "";
  const clock = (d) => d.toTimeString().slice(0, 8);

  function showLive() {
    if (over) {
      status.textContent = "ended";
      delete status.dataset.stale;
    } else if (connected) {
      status.textContent = "live";
      delete status.dataset.stale;
    } else {
      status.textContent = `reconnecting… (shown as of ${clock(asOf)})`;
      status.dataset.stale = "true";
    }
    status.dataset.over = String(over);
  }

  function readSoon(gap) {
    if (!nowUrl) return;
    const at = Math.max(Date.now() + 300, lastRead + gap);
    if (timer && due <= at) return;
    clearTimeout(timer);
    due = at;
    timer = setTimeout(readNow, at - Date.now());
  }

  async function readNow() {
    timer = null;
    if (reading) { again = true; return; }
    reading = true;
    lastRead = Date.now();
    try {
      const response = await fetch(nowUrl, { credentials: "same-origin", cache: "no-store" });
      if (response.ok) {
        renderNow(await response.json());
        asOf = new Date();
      }
    } catch (err) {
      console.warn("now", err);
    } finally {
      reading = false;
      showLive();
      if (again) { again = false; readSoon(GAP_MS); }
    }
  }

  function setBadge(el, cls, text) {
    if (!el) return;
    el.className = `badge ${cls}`;
    el.textContent = text;
  }

  const rankRows = document.getElementById("rank-rows");
  function rankRow(r) {
    const tr = document.createElement("tr");
    const link = document.createElement("a");
    link.href = `ranks/${r.rank}/`;
    link.textContent = String(r.rank);
    const cells = [link, r.host, r.status, r.last_step === null ? "–" : String(r.last_step), r.seen];
    for (const value of cells) {
      const td = document.createElement("td");
      td.append(value);
      tr.append(td);
    }
    return tr;
  }

  function renderNow(now) {
    setBadge(document.querySelector("#run-status .badge"), `status-${now.status}`, now.status);
    const lastStep = document.getElementById("run-last-step");
    if (lastStep) lastStep.textContent = now.last_step === null ? "–" : String(now.last_step);
    const verdict = document.getElementById("run-verdict");
    if (verdict) {
      setBadge(verdict, `verdict-${now.verdict.kind}`, now.verdict.text);
      verdict.dataset.verdict = now.verdict.kind;
    }
    for (const b of document.querySelectorAll("#counts [data-count]")) {
      const value = now.counts[b.dataset.count];
      if (value !== undefined) b.textContent = String(value);
    }
    if (rankRows && now.ranks.length) rankRows.replaceChildren(...now.ranks.map(rankRow));
    const wasOver = over;
    over = now.over;
    endedRanks = now.ranks.filter((r) => r.status !== "running");
    endedInStrip();
    if (over && strip) stripEnded(now.ended);
    else if (wasOver && strip) stripEnded("No progress sample yet.");  // reporting again: live phases follow
    if (strip) strip.dataset.over = String(over);
    const { as_of, ...facts } = now;
    const text = JSON.stringify(facts);
    if (text !== shown) {  // something moved: the charts and the bill follow
      if (shown) {
        refreshSoon();
        document.dispatchEvent(new CustomEvent("lockstep:run-changed"));
      }
      shown = text;
    }
  }

  // progress comes every 2 s while the run is active: read again soon when a rank came or went, when
  // the steps moved at most every PROGRESS_GAP_MS, else every QUIET_MS (a status that time decides)
  function onProgress(msg) {
    const ranks = `${msg.ranks_reporting}|${msg.ranks_ended}`;
    const steps = `${msg.last_step}|${msg.min_step}`;
    if (ranks !== countedRanks) readSoon(GAP_MS);
    else if (steps !== countedSteps || Date.now() - lastRead > QUIET_MS) readSoon(PROGRESS_GAP_MS);
    countedRanks = ranks;
    countedSteps = steps;
  }

  setInterval(() => { if (!connected) readSoon(GAP_MS); }, DOWN_POLL_MS);

  function connect(delay) {
    const ws = new WebSocket(url);
    // an ended run still listens (a late report may arrive) but says it ended, not "live"
    ws.onopen = () => {
      connected = true;
      status.dataset.connected = "true";
      delay = 1000;
      showLive();
      readSoon(0);  // what happened while the socket was away (or before it first opened)
      if (opened) refreshSoon();
      opened = true;
    };
    ws.onmessage = (event) => {
      const msg = JSON.parse(event.data);
      if (msg.type === "alert") render(msg.alert);
      if (msg.type === "incident") renderIncident(msg.incident);
      if (msg.type === "progress") { renderStrip(msg.strip); onProgress(msg); }
      if (msg.type === "alert" || msg.type === "incident") readSoon(GAP_MS);
      if (msg.type === "alert" || msg.type === "progress") refreshSoon();
    };
    ws.onclose = () => {
      connected = false;
      delete status.dataset.connected;
      showLive();
      setTimeout(() => connect(Math.min(delay * 2, 30000)), delay);
    };
  }
  connect(1000);
})();
