// A deployment's page while it is on its way somewhere (pending, starting, scaling down): its
// status is polled and the page reloaded once it changes, to show the new state, replicas and
// events. Uses app.js's getJSON and poll (both scripts are classic and deferred, app.js first).
"use strict";

const PASSING = new Set(["pending", "starting", "scaling_down"]);

document.addEventListener("DOMContentLoaded", () => {
  const page = document.querySelector("[data-status-url][data-status-now]");
  if (!page || !PASSING.has(page.dataset.statusNow)) return;
  poll(async () => {
    const body = await getJSON(page.dataset.statusUrl);
    if (body.status === page.dataset.statusNow) return false;
    window.location.reload();
    return true;
  }, 2000);
});
