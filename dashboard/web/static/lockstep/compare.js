// Compare page: the differences-only switch of the environment table, the step-time curves and
// the drift charts (loss and gradient norm of every run, their relative difference against the
// tolerance). Data is embedded with json_script, parsed as JSON, never evaluated as HTML.
(function () {
  "use strict";
  const table = document.getElementById("env");
  const toggle = document.getElementById("diff-only");
  if (table && toggle) {
    const apply = () => table.classList.toggle("diff-only", toggle.checked);
    toggle.addEventListener("change", apply);
    apply();
  }
  const el = document.getElementById("step-times");
  const data = document.getElementById("step-times-data");
  if (el && data && window.LockstepCharts) window.LockstepCharts.stepCurves(el, JSON.parse(data.textContent));

  const driftData = document.getElementById("drift-data");
  if (!driftData || !window.echarts) return;
  const drift = JSON.parse(driftData.textContent);

  function lines(target, title, series, yAxis) {
    const plotted = series.filter((s) => s.data.length).length;
    target.dataset.series = String(plotted);
    if (!plotted) {  // an empty frame with axes reads as a broken chart: say what is missing instead
      target.classList.add("chart-empty");
      target.textContent = `${title}: none of these runs reported it`;
      return;
    }
    const chart = echarts.init(target, null, { renderer: "canvas" });
    target.style.height = "240px";
    chart.resize();
    window.addEventListener("resize", () => chart.resize());
    chart.setOption({
      animation: false, title: { text: title, textStyle: { fontSize: 13 } }, tooltip: { trigger: "axis" },
      legend: { top: 0, right: 10 }, grid: { left: 70, right: 20, top: 40, bottom: 30 },
      xAxis: { type: "value", name: "step" }, yAxis: yAxis || { type: "value", scale: true }, series,
    }, true);
  }

  const curve = (name) => Object.entries(drift.series).map(([key, s]) => ({
    type: "line", name: key, showSymbol: false, data: s[name] }));
  const loss = document.getElementById("drift-loss");
  const grad = document.getElementById("drift-grad");
  const rel = document.getElementById("drift-rel");
  if (loss) lines(loss, "loss (lowest rank)", curve("loss"));
  if (grad) lines(grad, "gradient norm", curve("grad_norm"));
  if (rel) {
    const floor = (v) => Math.max(v, 1e-12);  // a log axis cannot show 0 (bitwise equal)
    const series = drift.vs.flatMap((vs) => ["loss", "grad_norm"].map((name) => ({
      type: "line", name: `${vs.run} ${name}`, showSymbol: false,
      data: vs[name].relative.map(([s, v]) => [s, floor(v)]) })));
    if (series.length) {
      series[0].markLine = { symbol: "none", data: [{ yAxis: floor(drift.tolerance), name: "tolerance" }],
                             label: { formatter: `tolerance ${drift.tolerance}` }, lineStyle: { type: "dashed" } };
    }
    lines(rel, "relative difference vs the first run", series, { type: "log", min: 1e-12 });
  }
})();
