// Codex Relay console: progressive enhancement only. Every page works
// without this script; with it, live regions follow the server over SSE and
// destructive forms ask for confirmation.
(function () {
  "use strict";

  // A live region (data-live="/admin/live/...") is replaced by the fragment
  // the server renders whenever its content changes.
  if (window.EventSource) {
    document.querySelectorAll("[data-live]").forEach(function (el) {
      var src = new EventSource(el.getAttribute("data-live"));
      src.addEventListener("update", function (ev) {
        el.innerHTML = ev.data;
        el.setAttribute("data-updated", String(Date.now()));
      });
    });
  }

  // Forms with a data-confirm message ask before they submit.
  document.addEventListener("submit", function (ev) {
    var msg = ev.target.getAttribute("data-confirm");
    if (msg && !window.confirm(msg)) {
      ev.preventDefault();
    }
  });
})();
