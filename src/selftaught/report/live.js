// selftaught watch: polls /api/state and fills the page. Rows and texts go in as text
// (textContent); only the cards and charts, which the server builds from redacted, escaped
// data with the report's own code, go in as markup.
"use strict";
(function () {
  const root = document.getElementById("live-root");
  const interval = Number(root.dataset.intervalMs) || 2000;
  const $ = (id) => document.getElementById(id);
  let since = 0;
  let gen = -1;
  let rev = -1;
  let failures = 0;

  function text(el, value) {
    el.textContent = value === null || value === undefined ? "" : String(value);
  }

  function cell(tagName, value) {
    const el = document.createElement(tagName);
    text(el, value);
    return el;
  }

  function rowElement(row, width) {
    const tr = document.createElement("tr");
    tr.dataset.key = String(row.key);
    if (row.decision) tr.dataset.decision = row.decision;
    for (let i = 0; i < width; i++) {
      const value = i < row.cells.length ? row.cells[i] : "";
      if (i === 1 && row.decision) {
        const td = document.createElement("td");
        const badge = cell("span", value);
        badge.className = "badge b-" + row.decision.replace(/[^a-z_]/g, "");
        td.appendChild(badge);
        tr.appendChild(td);
      } else {
        tr.appendChild(cell("td", value));
      }
    }
    return tr;
  }

  function showView(view) {
    document.title = view.title + " · live";
    text($("title"), view.title);
    text($("run-path"), view.path);
    const status = $("status");
    const s = view.status;
    text(status, s.text + (s.error ? " — " + s.error : ""));
    status.className = "status " + (s.error ? "error" : s.finished ? "finished" : "unfinished");
    $("notes").replaceChildren(...view.notes.map((n) => cell("li", n)));
    $("history-head").replaceChildren(...view.columns.map((c) => cell("th", c)));
    $("cards").innerHTML = view.cards;
    $("chart").innerHTML = view.chart;
  }

  function apply(state) {
    if (state.view) showView(state.view);
    const body = $("history-body");
    if (state.reset) body.replaceChildren();
    const width = $("history-head").children.length;
    for (const row of state.rows) body.appendChild(rowElement(row, width));
    since = state.cursor;
    gen = state.gen;
    rev = state.rev;
    const live = $("live");
    text(live, state.finished ? "finished" : "live");
    live.className = "badge " + (state.finished ? "b-accept_new_best" : "b-accept");
    text($("updated"), "updated " + new Date().toLocaleTimeString());
  }

  async function poll() {
    try {
      const query = "since=" + since + "&gen=" + gen + "&rev=" + rev;
      const res = await fetch("/api/state?" + query, { cache: "no-store", credentials: "omit" });
      if (!res.ok) throw new Error("HTTP " + res.status);
      const state = await res.json();
      apply(state);
      failures = 0;
      if (state.finished) return; // the run ended: nothing more will come
    } catch (err) {
      failures += 1;
      const live = $("live");
      text(live, "no answer from the watch server; retrying");
      live.className = "badge b-reject";
    }
    setTimeout(poll, interval * Math.min(failures + 1, 5));
  }

  poll();
})();
