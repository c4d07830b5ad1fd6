// The Samples tab's table: one page at a time from the job's samples.json, filtered by step and
// reward range and sorted by step or reward on the server. A step's rollouts of one prompt are
// one row, opened to read each completion with its reward and each reward function's share.
// Uses app.js's getJSON and poll (both scripts are classic and deferred, app.js first).
"use strict";

(() => {
  const REFRESH_MS = 5000;

  function cell(tag, text, className, label) {
    const element = document.createElement(tag);
    if (text !== undefined) element.textContent = text;
    if (className) element.className = className;
    if (label) element.dataset.label = label; // the column's name on a phone's stacked rows
    return element;
  }

  const score = (value) => (value === null || value === undefined ? "—" : Number(value).toFixed(3));

  function rolloutRow(rollout) {
    const row = cell("tr", undefined, "rollout");
    row.dataset.rollout = "";
    row.append(cell("td", undefined, "empty"), cell("td", `#${rollout.index}`, "num sub", "Rollout"));
    const body = cell("td", undefined, undefined, "Completion");
    body.colSpan = 2;
    body.append(cell("pre", rollout.completion));
    // Each function's share only when there are several (one function's is the total).
    const shares = Object.entries(rollout.rewards || {});
    if (shares.length > 1) {
      const scores = cell("div", undefined, "scores");
      for (const [name, value] of shares) {
        const item = cell("span", `${name} `);
        item.dataset.component = name;
        item.append(cell("strong", score(value)));
        scores.append(item);
      }
      body.append(scores);
    }
    const reward = cell("td", undefined, "num", "Reward");
    reward.append(cell("strong", score(rollout.reward)));
    row.append(body, reward, cell("td", undefined, "empty"));
    return row;
  }

  function groupBody(group, open) {
    const tbody = cell("tbody");
    tbody.dataset.group = "";
    tbody.dataset.step = String(group.step);
    tbody.dataset.meanReward = String(group.mean_reward);
    const head = cell("tr", undefined, "group");
    const toggle = cell("button", "▸", "toggle");
    toggle.type = "button";
    toggle.setAttribute("aria-label", "Show the rollouts");
    const prompt = cell("td", undefined, undefined, "Prompt");
    prompt.append(cell("div", group.prompt, "prompt"));
    const first = cell("td");
    first.append(toggle);
    head.append(
      first,
      cell("td", String(group.step), "num", "Step"),
      prompt,
      cell("td", String(group.rollouts.length), "num", "Rollouts"),
      cell("td", score(group.mean_reward), "num", "Mean reward"),
      cell("td", score(group.best_reward), "num", "Best"),
    );
    const rows = group.rollouts.map(rolloutRow);
    const show = (yes) => {
      tbody.classList.toggle("open", yes);
      toggle.setAttribute("aria-expanded", String(yes));
      toggle.textContent = yes ? "▾" : "▸";
      for (const row of rows) row.hidden = !yes;
    };
    head.addEventListener("click", () => {
      const yes = !tbody.classList.contains("open");
      show(yes);
      open(yes);
    });
    tbody.append(head, ...rows);
    return { tbody, show };
  }

  function setup(root) {
    const panel = root.querySelector("[data-panel='samples']");
    if (!panel) return;
    const form = panel.querySelector("[data-samples-filter]");
    const table = panel.querySelector("[data-samples]");
    const steps = form.querySelector("[data-sample-step]");
    const pager = panel.querySelector("[data-samples-pager]");
    const opened = new Set(); // groups the reader opened stay open across refreshes
    let page = 1;
    let latest = 0;

    const render = (body) => {
      panel.querySelector("[data-alarms]").replaceChildren(...body.alarms.map((alarm) =>
        cell("li", `${alarm.type.replace(/^alarm_/, "").replaceAll("_", " ")}: ${alarm.message}`)));
      panel.querySelector("[data-samples-empty]").hidden = body.steps.length > 0;
      const chosen = steps.value;
      steps.replaceChildren(cell("option", "all steps"), ...body.steps.map((s) => cell("option", String(s))));
      steps.options[0].value = "";
      steps.value = body.steps.map(String).includes(chosen) ? chosen : "";
      const count = panel.querySelector("[data-samples-count]");
      count.textContent = body.total_rollouts
        ? `${body.total_groups} prompts, ${body.total_rollouts} rollouts`
        : body.steps.length ? "No samples match these filters." : "";
      page = body.page;
      pager.querySelector("[data-page-of]").textContent = `Page ${body.page} of ${body.pages}`;
      pager.querySelector("[data-page=prev]").disabled = body.page <= 1;
      pager.querySelector("[data-page=next]").disabled = body.page >= body.pages;
      pager.hidden = body.pages <= 1;
      for (const old of table.querySelectorAll("tbody")) old.remove();
      for (const group of body.groups) {
        const key = `${group.step}\u0000${group.prompt}`;
        const { tbody, show } = groupBody(group, (yes) => (yes ? opened.add(key) : opened.delete(key)));
        show(opened.has(key));
        table.append(tbody);
      }
      table.dataset.groups = String(body.groups.length);
      table.dataset.page = String(body.page);
      table.hidden = body.groups.length === 0;
    };

    const load = async () => {
      const params = new URLSearchParams();
      for (const [name, value] of new FormData(form)) if (value !== "") params.set(name, value);
      params.set("page", String(page));
      const mine = ++latest;
      const body = await getJSON(`${root.dataset.samplesUrl}?${params}`);
      if (mine === latest) render(body); // an answer to an older filter is dropped
      return body.finished;
    };
    const reload = () => load().catch((error) => console.warn(error));

    let typing;
    form.addEventListener("submit", (event) => { event.preventDefault(); page = 1; reload(); });
    form.addEventListener("change", () => { page = 1; reload(); });
    form.addEventListener("input", (event) => {
      if (event.target.type !== "number") return;
      clearTimeout(typing);
      typing = setTimeout(() => { page = 1; reload(); }, 400);
    });
    pager.addEventListener("click", (event) => {
      const button = event.target.closest("[data-page]");
      if (!button || button.disabled) return;
      page += button.dataset.page === "next" ? 1 : -1;
      reload();
    });
    table.hidden = true;
    poll(load, REFRESH_MS); // until the job ends; filters and pages ask again at once
  }

  document.addEventListener("DOMContentLoaded", () => {
    const job = document.querySelector("[data-job]");
    if (job) setup(job);
  });
})();
