// The job page's "Copy as TOML / CLI / SDK" buttons: the text is rendered on the page (each in
// its own <details>, readable without scripts); a button copies it and opens it.
"use strict";

document.addEventListener("DOMContentLoaded", () => {
  const config = document.querySelector("[data-config]");
  if (!config) return;
  const said = config.querySelector("[data-copied]");
  config.addEventListener("click", async (event) => {
    const button = event.target.closest("[data-copy]");
    if (!button) return;
    const box = config.querySelector(`[data-copy-as="${button.dataset.copy}"]`);
    box.open = true;
    try {
      await navigator.clipboard.writeText(box.querySelector("code").textContent);
      said.textContent = `Copied as ${button.dataset.copy}.`;
    } catch {
      // No clipboard (an insecure origin, a refused permission): the text is open to select.
      said.textContent = `Select the ${button.dataset.copy} below to copy it.`;
    }
  });
});
