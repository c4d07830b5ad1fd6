// The new-job form: the method's defaults as placeholders and hints, and a live quote as the
// fields change. The form works without it (it submits; the job page shows the cost).
"use strict";

(() => {
  const form = document.getElementById("job-new");
  if (!form) return;
  const defaults = JSON.parse(document.getElementById("method-defaults").textContent);
  const output = document.getElementById("quote");
  const method = form.elements.method;
  const quoteUrl = form.getAttribute("data-quote-url"); // form.dataset is its "dataset" field

  function showDefaults() {
    const shown = defaults[method.value] || defaults.grpo;
    for (const input of form.querySelectorAll("[data-default]")) {
      const key = input.dataset.default;
      const value = key === "other" ? shown.other : shown.named[key];
      input.placeholder = value;
      const hint = form.querySelector(`[data-default-hint="${input.name}"]`);
      if (hint) hint.textContent = `default: ${value}`;
    }
  }

  let timer = null;
  let asked = 0;
  async function quote() {
    const mine = ++asked;
    const body = new FormData(form);
    body.delete("dataset_file"); // files are not sent for a quote; see the view
    body.delete("reward_file");
    try {
      const response = await fetch(quoteUrl, { method: "POST", body, credentials: "same-origin", redirect: "manual" });
      if (!response.ok) throw new Error(`HTTP ${response.status}`);
      const answer = await response.json();
      if (mine !== asked) return; // a newer quote is on its way
      output.textContent = answer.quote || answer.error;
      output.classList.toggle("muted", !answer.quote);
    } catch (error) {
      if (mine === asked) output.textContent = `no estimate (${error.message})`;
    }
  }

  function later() {
    clearTimeout(timer);
    timer = setTimeout(quote, 300);
  }

  method.addEventListener("change", showDefaults);
  form.addEventListener("input", later);
  form.addEventListener("change", later);
  showDefaults();
  quote();
})();
