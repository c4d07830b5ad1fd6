// An unfinished evaluation's page reloads itself every few seconds until the evaluation ends,
// so its table fills in and its summary appears without the reader reloading.
(() => {
  const page = document.querySelector("[data-evaluation-status]");
  if (page && ["queued", "running"].includes(page.dataset.evaluationStatus)) {
    setTimeout(() => window.location.reload(), 5000);
  }
})();
