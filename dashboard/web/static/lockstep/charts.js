// Lockstep charts on Apache ECharts (vendored in static/vendor/echarts, no CDN). The server sends
// aggregates only (see dashboard/pages/timeline.py); these functions just draw them. Names from
// the agents appear only in tooltips built with ECharts' text encoding (encodeHTML).
(function () {
  "use strict";
  const OUTCOME_COLORS = { hit: "#2e7d32", miss: "#ef8f00", bypass: "#7b1fa2", failed: "#c62828", none: "#78909c" };
  const enc = (s) => echarts.format.encodeHTML(String(s));

  function chartOn(el, height) {
    el.style.height = `${height}px`;
    const existing = echarts.getInstanceByDom(el);
    const chart = existing || echarts.init(el, null, { renderer: "canvas" });
    if (!existing) window.addEventListener("resize", () => chart.resize());
    return chart;
  }

  // Timeline rows are single ranks up to 128 ranks, then blocks of `group` contiguous ranks.
  function rowLabel(row, group, world) {
    if (group === 1) return `rank ${row}`;
    return `ranks ${row * group}–${Math.min(world, (row + 1) * group) - 1}`;
  }

  function rankAxis(rows, group) {
    return { type: "value", name: group === 1 ? "rank" : `rank (÷${group})`, min: -0.5, max: rows - 0.5, inverse: true,
             minInterval: 1, axisLabel: { formatter: (v) => (Number.isInteger(v) ? v * group : "") }, splitLine: { show: false } };
  }

  function zooms(world) {
    const z = [{ type: "inside", xAxisIndex: 0 }, { type: "slider", xAxisIndex: 0, height: 16, bottom: 4 }];
    if (world > 32) z.push({ type: "slider", yAxisIndex: 0, width: 14, right: 4 }, { type: "inside", yAxisIndex: 0 });
    return z;
  }

  function spanRenderer(params, api) {
    const a = api.coord([api.value(0), api.value(2)]);
    const b = api.coord([api.value(1), api.value(2)]);
    const h = Math.max(api.size([0, 1])[1] * 0.72, 1);
    const rect = echarts.graphic.clipRectByRect(
      { x: a[0], y: a[1] - h / 2, width: Math.max(b[0] - a[0], 2), height: h },
      { x: params.coordSys.x, y: params.coordSys.y, width: params.coordSys.width, height: params.coordSys.height });
    return rect && { type: "rect", shape: rect, style: api.style() };
  }

  function timeline(el, data) {
    const world = data.world_size;
    const group = data.rank_group || 1;
    const rows = data.rows || world;
    const chart = chartOn(el, Math.min(620, Math.max(180, rows * 16 + 90)));
    if (data.t0 === null) {
      chart.setOption({ title: { text: "No compiles yet", left: "center", top: "middle", textStyle: { color: "#78909c", fontSize: 13 } } }, true);
      return chart;
    }
    const byOutcome = {};
    for (const [rank, s, e, outcome, n, rec] of data.spans) (byOutcome[outcome] = byOutcome[outcome] || []).push([s, e, rank, n, rec]);
    const series = Object.keys(OUTCOME_COLORS).filter((o) => byOutcome[o]).map((o) => ({
      type: "custom", name: `cache ${o}`, renderItem: spanRenderer, itemStyle: { color: OUTCOME_COLORS[o] },
      encode: { x: [0, 1], y: 2 }, data: byOutcome[o], progressive: 0,
      tooltip: { formatter: (p) => `${rowLabel(p.value[2], group, world)}: ${p.value[3]} compile(s), cache ${enc(o)}<br>${p.value[0]}–${p.value[1]} s` },
    }));
    const marker = (name, symbol, color, rows) => ({
      type: "scatter", name, symbol, symbolSize: rows > 64 ? 5 : 10, itemStyle: { color, borderColor: "#fff", borderWidth: 1 },
      data: rows.map(([rank, t, n]) => [t, rank, n]), z: 5, progressive: 0,
      tooltip: { formatter: (p) => `${rowLabel(p.value[1], group, world)}: ${p.value[2]} ${enc(name)} at ${p.value[0]} s` },
    });
    series.push(marker("recompile", "diamond", "#1565c0", data.markers.recompiles));
    series.push(marker("graph break", "triangle", "#d81b60", data.markers.graph_breaks));
    chart.setOption({
      animation: false, tooltip: { trigger: "item" }, legend: { top: 0 },
      grid: { left: 50, right: rows > 32 ? 30 : 16, top: 30, bottom: 50 },
      xAxis: { type: "value", name: "s", min: 0, max: Math.max(data.duration, 0.001), splitLine: { lineStyle: { color: "#eceff1" } } },
      yAxis: rankAxis(rows, group), dataZoom: zooms(rows), series,
    }, true);
    return chart;
  }

  // Only dissent cells come from the server (agreement is the green background); each is drawn at
  // least 3 px tall so a single rank among 1024 stays visible.
  function cellRenderer(params, api) {
    const a = api.coord([api.value(0) - 0.5, api.value(1)]);
    const w = Math.max(api.size([1, 0])[0], 2);
    const h = Math.max(api.size([0, 1])[1], 3);
    const rect = echarts.graphic.clipRectByRect(
      { x: a[0], y: a[1] - h / 2, width: w, height: h },
      { x: params.coordSys.x, y: params.coordSys.y, width: params.coordSys.width, height: params.coordSys.height });
    return rect && { type: "rect", shape: rect, style: { fill: api.visual("color") } };
  }

  function heatmap(el, data, world) {
    const h = data;
    const chart = chartOn(el, Math.min(420, Math.max(140, world * 12 + 80)));
    if (!h.bins) {
      chart.setOption({ title: { text: "No gradient fingerprints yet", left: "center", top: "middle", textStyle: { color: "#78909c", fontSize: 13 } } }, true);
      return chart;
    }
    const slots = new Array(h.bins).fill(0);
    for (const [b, n] of h.slots) slots[b] = n;
    const label = (b) => (h.step_width === 1 ? `${h.step_lo + b}` : `${h.step_lo + b * h.step_width}–${h.step_lo + (b + 1) * h.step_width - 1}`);
    const cells = h.cells.map(([b, r, n]) => [b, r, slots[b] ? n / slots[b] : 1, n]);
    chart.setOption({
      animation: false,
      tooltip: { formatter: (p) => `rank ${p.value[1]}, steps ${label(p.value[0])}: dissented on ${p.value[3]} of ${slots[p.value[0]]}` },
      grid: { left: 50, right: world > 32 ? 30 : 16, top: 10, bottom: 60, show: true, backgroundColor: "#e8f5e9", borderColor: "#c8e6c9" },
      xAxis: { type: "value", name: "step", min: -0.5, max: h.bins - 0.5, splitLine: { show: false },
               axisLabel: { formatter: (v) => (Number.isInteger(v) ? `${h.step_lo + v * h.step_width}` : "") } },
      yAxis: { ...rankAxis(world, 1), axisLine: { onZero: false } },
      visualMap: { min: 0, max: 1, show: false, dimension: 2, seriesIndex: 0, inRange: { color: ["#ef9a9a", "#b71c1c"] } },
      dataZoom: zooms(world),
      series: [{ type: "custom", renderItem: cellRenderer, encode: { x: 0, y: 1 }, data: cells, progressive: 0 }],
    }, true);
    return chart;
  }

  function stepCurves(el, curves) {
    const chart = chartOn(el, 280);
    const series = Object.entries(curves).map(([key, rows]) => ({
      type: "line", name: key, showSymbol: false, data: rows.map(([s, avg]) => [s, avg]),
    }));
    chart.setOption({
      animation: false, tooltip: { trigger: "axis" }, legend: { top: 0 },
      grid: { left: 60, right: 20, top: 30, bottom: 50 },
      xAxis: { type: "value", name: "step" }, yAxis: { type: "value", name: "s / step" },
      dataZoom: [{ type: "inside" }, { type: "slider", height: 16, bottom: 4 }], series,
    }, true);
    return chart;
  }

  window.LockstepCharts = { timeline, heatmap, stepCurves };
})();
