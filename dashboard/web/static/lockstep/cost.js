// Run page: the compile bill panel, from GET /api/v1/runs/<key>/cost. Every value from the agents
// (frame names, guard failures) is set as text, never as HTML. Refreshed every 30 s while the page is open,
// and when run.js reads that the run changed (at most every 5 s).
(function () {
  "use strict";
  const panel = document.getElementById("cost");
  if (!panel) return;
  const headline = panel.querySelector(".cost-headline");
  const table = panel.querySelector("table.cost-lines");
  const body = table.querySelector("tbody");
  const CAUSES = {
    first_compile: "first compile", recompile: "recompile", avoidable_miss: "avoidable cache miss",
    compile_straggler: "compile straggler", failed_compile: "failed compile",
  };

  function cell(text, cls) {
    const td = document.createElement("td");
    td.textContent = text;
    if (cls) td.className = cls;
    return td;
  }

  function hours(seconds) { return (seconds / 3600).toFixed(seconds >= 36 ? 2 : 4); }

  // "GPU" where every rank said it computes on one, else "device" (the page decides: a CPU job's bill is no GPU time)
  const unit = panel.dataset.device || "device";

  function describe(bill) {
    const parts = [`Compilation cost ${hours(bill.gpu_seconds)} ${unit}-hours (${bill.gpu_seconds.toFixed(1)} ${unit}-seconds)`];
    if (bill.share !== null) parts.push(`${(100 * bill.share).toFixed(1)}% of the run's ${unit} time`);
    if (bill.money !== null) parts.push(`${bill.money.toFixed(2)} at ${bill.price_per_gpu_hour} per ${unit}-hour`);
    const basis = bill.basis;
    parts.push(`${basis.measured_units} step(s) billed from waits the ranks measured (${basis.measured_s.toFixed(1)} ${unit}-seconds), ` +
               `${basis.assumed_units} assumed: world size × the slowest rank's compile (${basis.assumed_s.toFixed(1)} ${unit}-seconds)`);
    if (bill.savings.hits) parts.push(`warm caches saved ${bill.savings.gpu_seconds.toFixed(1)} ${unit}-seconds`);
    return parts.join(" · ");
  }

  function render(bill) {
    headline.textContent = bill.lines.length ? describe(bill) : "No compiles: nothing lost to compilation.";
    const rows = bill.lines.slice(0, 12).map((line) => {
      const tr = document.createElement("tr");
      tr.className = `cost-line ${line.cause}`;
      const cause = CAUSES[line.cause] || line.cause;
      tr.append(cell(line.label, "mono"), cell(line.reason ? `${cause}: ${line.reason}` : cause),
                cell(line.gpu_seconds.toFixed(1)), cell(String(line.compiles)), cell(String(line.rank_count)),
                cell(line.remedy, "remedy"));
      return tr;
    });
    body.replaceChildren(...rows);
    table.hidden = !rows.length;
    panel.dataset.loaded = String(Date.now());
  }

  async function load() {
    try {
      const response = await fetch(panel.dataset.url, { credentials: "same-origin" });
      if (response.ok) render(await response.json());
    } catch (err) {
      console.warn("cost", err);
    }
  }
  load();
  setInterval(load, 30000);
  // run.js says the run changed (read again after live news or a reconnect): at most one load per 5 s
  let last = Date.now(), queued = null;
  document.addEventListener("lockstep:run-changed", () => {
    if (queued) return;
    queued = setTimeout(() => { queued = null; last = Date.now(); load(); }, Math.max(0, last + 5000 - Date.now()));
  });
})();
