// Live updates for the review inbox: ask the server whether what this page shows has
// changed; the list reloads itself, an open proposal shows a banner (so a comment
// being written is never lost). No other script runs on these pages.
(function () {
  "use strict";
  var body = document.body;
  var shown = body.dataset.version;
  if (!shown) { return; }
  var every = parseInt(body.dataset.interval, 10) || 3000;
  function tick() {
    fetch(body.dataset.changes, { credentials: "same-origin", headers: { "Accept": "application/json" } })
      .then(function (response) {
        if (response.status === 401) { window.location.reload(); return null; }
        return response.ok ? response.json() : null;
      })
      .then(function (answer) {
        if (answer && answer.version && answer.version !== shown) {
          if (body.dataset.live === "reload") { window.location.reload(); return; }
          document.getElementById("changed").hidden = false;
          return;
        }
        window.setTimeout(tick, every);
      })
      .catch(function () { window.setTimeout(tick, every); });
  }
  window.setTimeout(tick, every);
})();
