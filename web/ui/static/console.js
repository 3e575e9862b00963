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

  // Copy buttons (data-copy="<id>") copy that element's text, an input's
  // value, to the clipboard. Where the page may not write it (no secure
  // context: plain HTTP from another host), the text is selected instead,
  // and copied the old way if the browser still allows that. The outcome is
  // the button's text and its data-copied attribute (copied or selected).
  function selectText(el) {
    if (el.select) {
      el.focus();
      el.select();
    } else {
      var range = document.createRange();
      range.selectNodeContents(el);
      var sel = window.getSelection();
      sel.removeAllRanges();
      sel.addRange(range);
    }
  }
  function copied(btn, how) {
    btn.setAttribute("data-copied", how);
    btn.textContent = how === "copied" ? "Copied" : "Selected: press Ctrl+C (⌘C)";
  }
  // Copy buttons show only with this script (.js, console.css), live
  // regions' new ones too.
  document.documentElement.classList.add("js");
  document.addEventListener("click", function (ev) {
    var btn = ev.target.closest && ev.target.closest("[data-copy]");
    if (!btn) return;
    var el = document.getElementById(btn.getAttribute("data-copy"));
    if (!el) return;
    var text = el.value !== undefined ? el.value : el.textContent;
    var fallback = function () {
      selectText(el);
      var ok = false;
      try {
        ok = document.execCommand("copy");
      } catch (e) {}
      copied(btn, ok ? "copied" : "selected");
    };
    if (navigator.clipboard && window.isSecureContext) {
      navigator.clipboard.writeText(text).then(function () { copied(btn, "copied"); }, fallback);
    } else {
      fallback();
    }
  });

  // Forms with a data-confirm message ask before they submit.
  document.addEventListener("submit", function (ev) {
    var msg = ev.target.getAttribute("data-confirm");
    if (msg && !window.confirm(msg)) {
      ev.preventDefault();
    }
  });
})();
