// Compare page: the differences-only switch of the environment table and the step-time curves
// (data embedded with json_script, parsed as JSON, never evaluated as HTML).
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
})();
