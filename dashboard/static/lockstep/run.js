// Live alert feed of the run page: alerts arrive over ws/runs/<key>/ and are rendered as text
// (never as HTML), so reasons, frame names and graph code from the agents stay inert.
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
    li.className = `alert ${alert.severity}`;
    li.dataset.id = alert.id;
    li.dataset.kind = alert.kind;
    li.append(span("kind", alert.kind), span("ranks", `ranks ${alert.ranks.join(", ")}`));
    if (alert.step !== null) li.append(span("step", `step ${alert.step}`));
    li.append(span("message", alert.message));
    const none = list.querySelector("li.none");
    if (none) none.remove();
    if (existing) existing.replaceWith(li); else list.prepend(li);
  }

  function connect(delay) {
    const ws = new WebSocket(url);
    ws.onopen = () => { status.textContent = "live"; delay = 1000; };
    ws.onmessage = (event) => {
      const msg = JSON.parse(event.data);
      if (msg.type === "alert") render(msg.alert);
    };
    ws.onclose = () => {
      status.textContent = "reconnecting…";
      setTimeout(() => connect(Math.min(delay * 2, 30000)), delay);
    };
  }
  connect(1000);
})();
