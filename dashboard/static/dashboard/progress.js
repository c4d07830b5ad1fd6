// Veri dashboard: how far along a job is (step of total, a bar, elapsed time, ETA, cost so far),
// as its status.json reports it, in the job page's header (app.js's status poll calls
// showProgress) and in the jobs list's rows of unfinished jobs (polled here).
"use strict";

const LIST_POLL = 5000;
const POLLS_AFTER_THE_END = 10; // the charge is written a moment after a job ends

function showProgress(box, progress) {
  if (!box || !progress) return;
  const set = (selector, text) => {
    const element = box.querySelector(selector);
    if (element) element.textContent = text;
  };
  set("[data-progress-step]", progress.step_text);
  set("[data-progress-elapsed]", progress.elapsed_text);
  set("[data-progress-eta]", progress.eta_text);
  set("[data-progress-cost]", progress.cost_text);
  const bar = box.querySelector("[data-progress-bar]");
  if (progress.percent !== null) {
    bar.value = progress.percent;
    bar.textContent = `${progress.percent}%`;
  } else {
    bar.removeAttribute("value"); // no total known: an indeterminate bar while it runs
  }
  bar.hidden = progress.percent === null && !progress.running;
  box.querySelector("[data-progress-eta-box]").hidden = !progress.running;
  box.dataset.step = progress.step ?? "";
  box.dataset.eta = progress.eta_seconds ?? "";
}

function showListCost(cell, progress) {
  cell.textContent = progress.cost ?? "—";
  if (progress.cost !== null && !progress.cost_final) {
    const note = document.createElement("div");
    note.className = "sub";
    note.textContent = "so far";
    cell.append(note);
  }
}

function setupJobsList(table) {
  for (const row of table.querySelectorAll("tr[data-status-url]")) {
    let pollsSinceEnd = 0;
    poll(async () => {
      const body = await getJSON(row.dataset.statusUrl);
      showProgress(row.querySelector("[data-progress]"), body.progress);
      showListCost(row.querySelector("[data-list-cost]"), body.progress);
      const badge = row.querySelector("[data-status]");
      badge.textContent = body.status;
      badge.className = `badge status-${body.status}`;
      if (!body.finished) return false;
      pollsSinceEnd += 1;
      return body.progress.cost_final || pollsSinceEnd > POLLS_AFTER_THE_END;
    }, LIST_POLL);
  }
}

// The compare button: enabled with two ticked jobs or more (the server takes the first few).
function setupCompareForm(form) {
  const button = form.querySelector("[data-compare-button]");
  const update = () => {
    button.disabled = form.querySelectorAll("[data-compare-pick]:checked").length < 2;
  };
  form.addEventListener("change", update);
  update();
}

document.addEventListener("DOMContentLoaded", () => {
  const table = document.querySelector("[data-jobs]");
  if (table) setupJobsList(table);
  const form = document.querySelector("[data-compare-form]");
  if (form) setupCompareForm(form);
});
